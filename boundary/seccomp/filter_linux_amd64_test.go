package seccomp

import "golang.org/x/sys/unix"

var archDeniedEPERM = map[string]uint32{
	"iopl": unix.SYS_IOPL, "ioperm": unix.SYS_IOPERM, "modify_ldt": unix.SYS_MODIFY_LDT, "uselib": unix.SYS_USELIB,
}

var (
	archModeArg  = map[uint32]int{unix.SYS_OPEN: 2, unix.SYS_CREAT: 1, unix.SYS_CHMOD: 1, unix.SYS_MKNOD: 1}
	archMknodArg = map[uint32]int{unix.SYS_MKNOD: 1}
)

// archTableCases are the amd64-only syscalls with a mode argument.
func archTableCases() []vmCase {
	return []vmCase{
		{"open O_RDONLY", call(unix.SYS_OPEN, 0x1000, unix.O_RDONLY|unix.O_CLOEXEC, 0), retAllow},
		{"open O_CREAT 0644", call(unix.SYS_OPEN, 0x1000, unix.O_CREAT|unix.O_WRONLY, 0o644), retAllow},
		{"open O_CREAT 04755", call(unix.SYS_OPEN, 0x1000, unix.O_CREAT|unix.O_WRONLY, 0o4755), retEPERM},
		{"open O_CREAT 02755", call(unix.SYS_OPEN, 0x1000, unix.O_CREAT|unix.O_WRONLY, 0o2755), retEPERM},
		{"open O_RDONLY 04755 (refused whatever the flags)", call(unix.SYS_OPEN, 0x1000, unix.O_RDONLY, 0o4755), retEPERM},
		{"open O_CREAT 04755 in arg 3", call(unix.SYS_OPEN, 0x1000, unix.O_CREAT, 0o644, 0o4755), retAllow},
		{"creat 0755", call(unix.SYS_CREAT, 0x1000, 0o755), retAllow},
		{"creat 06755", call(unix.SYS_CREAT, 0x1000, 0o6755), retEPERM},
		{"creat 04755 above umode_t's 16 bits", call(unix.SYS_CREAT, 0x1000, 0o755|0x10000), retAllow},
		{"chmod 0755", call(unix.SYS_CHMOD, 0x1000, 0o755), retAllow},
		{"chmod 01777 (sticky)", call(unix.SYS_CHMOD, 0x1000, 0o1777), retAllow},
		{"chmod 04755", call(unix.SYS_CHMOD, 0x1000, 0o4755), retEPERM},
		{"chmod 02755", call(unix.SYS_CHMOD, 0x1000, 0o2755), retEPERM},
		{"chmod 04755 with high word", call(unix.SYS_CHMOD, 0x1000, 0o4755|hi), retEPERM},
		{"mkdir 0755", call(unix.SYS_MKDIR, 0x1000, 0o755), retAllow},
		{"mkdir 02775 (the kernel drops the bit)", call(unix.SYS_MKDIR, 0x1000, 0o2775), retAllow},
		{"mknod S_IFREG", call(unix.SYS_MKNOD, 0x1000, unix.S_IFREG|0o644, 0), retAllow},
		{"mknod type 0", call(unix.SYS_MKNOD, 0x1000, 0o644, 0), retAllow},
		{"mknod S_IFIFO", call(unix.SYS_MKNOD, 0x1000, unix.S_IFIFO|0o644, 0), retEPERM},
		{"mknod S_IFSOCK", call(unix.SYS_MKNOD, 0x1000, unix.S_IFSOCK|0o644, 0), retEPERM},
		{"mknod S_IFCHR", call(unix.SYS_MKNOD, 0x1000, unix.S_IFCHR|0o666, 0x0103), retEPERM},
		{"mknod S_IFBLK", call(unix.SYS_MKNOD, 0x1000, unix.S_IFBLK|0o600, 0x0800), retEPERM},
		{"mknod S_IFREG 04755", call(unix.SYS_MKNOD, 0x1000, unix.S_IFREG|0o4755, 0), retEPERM},
	}
}
