package seccomp

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// legacyCall makes an amd64 path syscall that has no directory fd.
func legacyCall(nr uintptr, p string, a1, a2 uintptr) (uintptr, error) {
	b, err := unix.BytePtrFromString(p)
	if err != nil {
		return 0, err
	}
	r, _, e := unix.Syscall(nr, uintptr(unsafe.Pointer(b)), a1, a2)
	return r, errnoErr(e)
}

func legacyCreate(nr uintptr, a1, a2 uintptr) func(string) error {
	return func(p string) error {
		fd, err := legacyCall(nr, p, a1, a2)
		if err == nil && (nr == unix.SYS_OPEN || nr == unix.SYS_CREAT) {
			return unix.Close(int(fd))
		}
		return err
	}
}

func chmodCall(p string, mode uint32) error {
	_, err := legacyCall(unix.SYS_CHMOD, p, uintptr(mode), 0)
	return err
}

const openCreate = unix.O_CREAT | unix.O_EXCL | unix.O_WRONLY | unix.O_CLOEXEC

// archModeProbes are the amd64-only syscalls with a mode argument, for the
// "file-modes" kernel case.
var archModeProbes = []probe{
	{"chmod 0755", resOK, resOK, chmodProbe(0o755, chmodCall)},
	{"chmod 04755", resOK, "EPERM", chmodProbe(0o4755, chmodCall)},
	{"chmod 02755", resOK, "EPERM", chmodProbe(0o2755, chmodCall)},
	{"open O_CREAT 0644", resOK, resOK, createProbe("lo", unix.S_IFREG|0o644, legacyCreate(unix.SYS_OPEN, openCreate, 0o644))},
	{"open O_CREAT 04755", resOK, "EPERM", createProbe("lo", unix.S_IFREG|0o4755, legacyCreate(unix.SYS_OPEN, openCreate, 0o4755))},
	{"creat 0755", resOK, resOK, createProbe("lc", unix.S_IFREG|0o755, legacyCreate(unix.SYS_CREAT, 0o755, 0))},
	{"creat 06755", resOK, "EPERM", createProbe("lc", unix.S_IFREG|0o6755, legacyCreate(unix.SYS_CREAT, 0o6755, 0))},
	{"mkdir 0700", resOK, resOK, createProbe("ld", unix.S_IFDIR|0o700, legacyCreate(unix.SYS_MKDIR, 0o700, 0))},
	{"mkdir 06775 makes a 0775 directory", resOK, resOK, createProbe("ld", unix.S_IFDIR|0o775, legacyCreate(unix.SYS_MKDIR, 0o6775, 0))},
	{"mknod S_IFREG", resOK, resOK, createProbe("ln", unix.S_IFREG|0o644, legacyCreate(unix.SYS_MKNOD, unix.S_IFREG|0o644, 0))},
	{"mknod S_IFIFO", resOK, "EPERM", createProbe("ln", unix.S_IFIFO|0o600, legacyCreate(unix.SYS_MKNOD, unix.S_IFIFO|0o600, 0))},
	{"mknod S_IFSOCK", resOK, "EPERM", createProbe("ln", unix.S_IFSOCK|0o600, legacyCreate(unix.SYS_MKNOD, unix.S_IFSOCK|0o600, 0))},
}

// archDeviceProbes are the amd64-only device probes of the root case.
var archDeviceProbes = []probe{
	{"mknod S_IFCHR 1:3", resOK, "EPERM", createProbe("ln", unix.S_IFCHR|0o600, legacyCreate(unix.SYS_MKNOD, unix.S_IFCHR|0o600, uintptr(unix.Mkdev(1, 3))))},
}
