//go:build unix

package kubernetes

import (
	"os"

	"golang.org/x/sys/unix"
)

// dupFile returns a close-on-exec duplicate of f.
func dupFile(f *os.File, name string) (*os.File, error) {
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), name), nil
}

// closeInheritedFDs closes every descriptor above stderr that lacks
// close-on-exec, i.e. that the process inherited: the watchdog runs it
// first, since the process that starts it may hold descriptors without
// close-on-exec (the supervisor's report pipe to `moat sandbox create`)
// that the watchdog must not keep open for the sandbox's lifetime. The
// Go runtime's own descriptors (epoll, eventfd) are close-on-exec and
// stay.
func closeInheritedFDs() {
	for fd := 3; fd < 4096; fd++ {
		if flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err == nil && flags&unix.FD_CLOEXEC == 0 {
			unix.Close(fd)
		}
	}
}
