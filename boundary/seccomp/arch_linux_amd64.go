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

// archModeCalls are the amd64-only syscalls with a mode argument (arm64
// has only the *at forms, which syscallRules checks on both).
var archModeCalls = []modeCall{
	{name: "open", nr: unix.SYS_OPEN, modeArg: 2, kind: modeOpen},
	{name: "creat", nr: unix.SYS_CREAT, modeArg: 1, kind: modeOpen},
	{name: "chmod", nr: unix.SYS_CHMOD, modeArg: 1, kind: modeChmod},
	{name: "mkdir", nr: unix.SYS_MKDIR, modeArg: 1, kind: modeMkdir},
	{name: "mknod", nr: unix.SYS_MKNOD, modeArg: 1, kind: modeMknod},
}
