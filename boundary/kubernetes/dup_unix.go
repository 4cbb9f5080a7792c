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
