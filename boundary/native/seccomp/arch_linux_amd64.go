package seccomp

import "golang.org/x/sys/unix"

const (
	archName      = "x86_64"
	auditArch     = unix.AUDIT_ARCH_X86_64
	killX32       = true
	x32SyscallBit = 0x40000000 // __X32_SYSCALL_BIT
)

// archRules are the amd64-only denials.
var archRules = []struct {
	name string
	nr   uint32
	why  string
}{
	{"iopl", unix.SYS_IOPL, "raw I/O port access"},
	{"ioperm", unix.SYS_IOPERM, "raw I/O port access"},
	{"modify_ldt", unix.SYS_MODIFY_LDT, "16-bit segment tricks; a history of kernel bugs, used only by old emulators"},
	{"uselib", unix.SYS_USELIB, "obsolete a.out library loader"},
}
