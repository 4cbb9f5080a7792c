package measure

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

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

// maxFDScan bounds the fd numbers inheritedFDs tries one by one when it
// cannot list /proc/self/fd.
const maxFDScan = 4096

// inheritedFDs looks, once and at once, at every fd beyond stdio and
// returns a probe that reports the inherited ones. An fd that survived
// execve cannot have FD_CLOEXEC set, and everything the Go runtime opens
// itself (epoll, the cgroup CPU limit files) has it; so an fd without
// FD_CLOEXEC is one the helper was given: a file, a directory, a socket
// or a pipe from outside.
//
// The open fds are listed from /proc/self/fd, which names every one
// whatever its number; only without it are the numbers below maxFDScan
// tried one by one (4,096 fcntl calls, about 3 ms under the sandbox's
// seccomp filter, on the cold start's path).
func inheritedFDs() func() (string, string) {
	fds, listed := openFDs()
	if !listed {
		for fd := 3; fd < maxFDScan; fd++ {
			fds = append(fds, fd)
		}
	}
	var found []string
	for _, fd := range fds {
		if fd < 3 {
			continue
		}
		flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
		if err != nil || flags&unix.FD_CLOEXEC != 0 {
			continue // not open, or the process's own
		}
		target, err := readlinkFD(fd)
		if err != nil {
			var st unix.Stat_t
			target = "unknown"
			if unix.Fstat(fd, &st) == nil {
				target = fmt.Sprintf("file type %#o", st.Mode&unix.S_IFMT)
			}
		}
		found = append(found, fmt.Sprintf("fd %d: %s", fd, target))
	}
	return func() (string, string) {
		if len(found) > 0 {
			return OutcomeSucceeded, "inherited: " + strings.Join(found, ", ")
		}
		return OutcomeFailed, "only stdio was inherited"
	}
}

// openFDs lists the process's open fds from /proc/self/fd, in ascending
// order, without the one it reads the directory through. listed is false
// when the directory could not be read.
func openFDs() (fds []int, listed bool) {
	dfd, err := unix.Open("/proc/self/fd", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, false
	}
	d := os.NewFile(uintptr(dfd), "/proc/self/fd")
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return nil, false
	}
	for _, n := range names {
		fd, err := strconv.Atoi(n)
		if err != nil || fd < 0 {
			return nil, false // not the kernel's listing
		}
		if fd != dfd {
			fds = append(fds, fd)
		}
	}
	slices.Sort(fds)
	return fds, true
}

func readlinkFD(fd int) (string, error) {
	buf := make([]byte, 256)
	n, err := unix.Readlink("/proc/self/fd/"+strconv.Itoa(fd), buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

// statxFlags and statxMask are what coreutils' stat and ls -l pass.
const (
	statxFlags = unix.AT_SYMLINK_NOFOLLOW | unix.AT_NO_AUTOMOUNT
	statxMask  = unix.STATX_BASIC_STATS | unix.STATX_BTIME
)

// maxStatEntries bounds how many entries of a directory probeStatList
// stats.
const maxStatEntries = 64

// probeStatList does the everyday work of `stat path` and `ls -la path`:
// statx the path with the flags coreutils uses, and for a directory, list
// it and statx each entry (up to maxStatEntries). Succeeded means all of
// it worked; the first failure is the detail.
func probeStatList(path string) (string, string) {
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, path, statxFlags, statxMask, &stx); err != nil {
		return OutcomeFailed, fmt.Sprintf("statx %s: %v (stat and ls -l fail in this sandbox)", path, err)
	}
	if stx.Mode&unix.S_IFMT != unix.S_IFDIR {
		return OutcomeSucceeded, fmt.Sprintf("statx %s: file type %#o", path, stx.Mode&unix.S_IFMT)
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return OutcomeFailed, fmt.Sprintf("open %s to list it: %v", path, err)
	}
	defer unix.Close(fd)
	var names []string
	buf := make([]byte, 8192)
	for len(names) < maxStatEntries {
		n, err := unix.Getdents(fd, buf)
		if err != nil {
			return OutcomeFailed, fmt.Sprintf("listing %s: %v", path, err)
		}
		if n == 0 {
			break
		}
		_, _, names = unix.ParseDirent(buf[:n], maxStatEntries-len(names), names)
	}
	for _, name := range names {
		if err := unix.Statx(fd, name, statxFlags, statxMask, &stx); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue // removed since it was listed
			}
			return OutcomeFailed, fmt.Sprintf("statx %s: %v (ls -l fails in this sandbox)", filepath.Join(path, name), err)
		}
	}
	return OutcomeSucceeded, fmt.Sprintf("statx %s, listed it and statx'd %d entries", path, len(names))
}
