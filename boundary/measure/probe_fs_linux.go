package measure

import (
	"errors"
	"fmt"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// probeRead tries to read path: one byte of a file, one entry of a
// directory, or just opening anything else (a FIFO or device). It never
// blocks: the open is non-blocking.
func probeRead(path string) (string, string) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		return OutcomeFailed, "open: " + err.Error()
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return OutcomeError, "fstat after open: " + err.Error()
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		buf := make([]byte, 4096)
		n, err := unix.Getdents(fd, buf)
		if err != nil {
			return OutcomeFailed, "opened, but listing failed: " + err.Error()
		}
		return OutcomeSucceeded, fmt.Sprintf("listed the directory (%d bytes of entries)", n)
	case unix.S_IFREG:
		buf := make([]byte, 1)
		n, err := unix.Read(fd, buf)
		if err != nil {
			return OutcomeFailed, "opened, but reading failed: " + err.Error()
		}
		return OutcomeSucceeded, fmt.Sprintf("read %d byte(s) of a %d-byte file", n, st.Size)
	}
	return OutcomeSucceeded, fmt.Sprintf("opened for reading (file type %#o)", st.Mode&unix.S_IFMT)
}

// probeWrite tries to write at path: in a directory, create a new file
// (then remove it again); a file, open it for writing (without truncating
// or writing anything).
func probeWrite(path, name string) (string, string) {
	p := filepath.Join(path, name)
	fd, err := unix.Open(p, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if errors.Is(err, unix.ENOTDIR) {
		fd, err = unix.Open(path, unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
		if err != nil {
			return OutcomeFailed, "open for writing: " + err.Error()
		}
		unix.Close(fd)
		return OutcomeSucceeded, "opened the file for writing (nothing written)"
	}
	if err != nil {
		return OutcomeFailed, "create " + p + ": " + err.Error()
	}
	_, werr := unix.Write(fd, []byte("x"))
	unix.Close(fd)
	detail := "created " + p + " and removed it"
	if werr != nil {
		detail = "created " + p + " (writing to it failed: " + werr.Error() + ") and removed it"
	}
	if err := unix.Unlink(p); err != nil {
		detail = "created " + p + " but could not remove it: " + err.Error()
	}
	return OutcomeSucceeded, detail
}
