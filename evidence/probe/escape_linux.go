package probe

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// dgramWays are the ways host-datagram-socket tries to deliver a datagram
// to a pathname socket: from a datagram socketpair (which needs no
// socket(2)), with and without flags, by sendto, connect+write, sendmsg and
// after bind; and from socket(2).
var dgramWays = []string{
	"socketpair-sendto", "socketpair-nonblock-sendto", "socketpair-connect-write",
	"socketpair-sendmsg", "socketpair-bind-sendto", "socket-sendto", "socket-connect-write",
}

// dgram sends the attack marker to the datagram socket at addr one way.
func (p *runner) dgram(how, addr string) {
	name := "dgram-" + how
	if addr == "" {
		p.step(name, 0, errors.New("no address given"), "")
		return
	}
	to := &unix.SockaddrUnix{Name: addr}
	msg := []byte("escape " + AttackMarker)
	var fd int
	var err error
	if src, ok := strings.CutPrefix(how, "socketpair-"); ok {
		typ := unix.SOCK_DGRAM | unix.SOCK_CLOEXEC
		if strings.HasPrefix(src, "nonblock-") {
			typ |= unix.SOCK_NONBLOCK
		}
		var fds [2]int
		fds, err = unix.Socketpair(unix.AF_UNIX, typ, 0)
		if err != nil {
			p.step(name, 0, fmt.Errorf("socketpair: %w", err), "")
			return
		}
		defer unix.Close(fds[1])
		fd = fds[0]
	} else {
		fd, err = unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			p.step(name, 0, fmt.Errorf("socket: %w", err), "")
			return
		}
	}
	defer unix.Close(fd)
	switch {
	case strings.HasSuffix(how, "-connect-write"):
		if err = unix.Connect(fd, to); err == nil {
			_, err = unix.Write(fd, msg)
		}
	case strings.HasSuffix(how, "-sendmsg"):
		err = unix.Sendmsg(fd, msg, nil, to, 0)
	case strings.HasSuffix(how, "-bind-sendto"):
		dir, derr := os.MkdirTemp("", "moat-probe-")
		if derr != nil {
			err = derr
			break
		}
		defer os.RemoveAll(dir)
		if err = unix.Bind(fd, &unix.SockaddrUnix{Name: filepath.Join(dir, "s")}); err == nil {
			err = unix.Sendto(fd, msg, 0, to)
		}
	default:
		err = unix.Sendto(fd, msg, 0, to)
	}
	p.step(name, 0, err, "")
}

// setID tries to make path set-id the way its name says, and reports the
// mode the probe then sees.
func setID(path string) (string, error) {
	name := filepath.Base(path)
	var err error
	switch {
	case strings.HasPrefix(name, "setid-chmod-"), strings.HasPrefix(name, "setid-fchmod-"),
		strings.HasPrefix(name, "setid-fchmodat-"), strings.HasPrefix(name, "setid-fchmodat2-"):
		if err = os.WriteFile(path, []byte("#!/bin/sh\nid\n"), 0o644); err != nil {
			return "", err
		}
		mode := modeOf(name)
		switch {
		case strings.HasPrefix(name, "setid-chmod-"):
			err = unix.Chmod(path, mode)
		case strings.HasPrefix(name, "setid-fchmod-"):
			var fd int
			if fd, err = unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0); err == nil {
				err = unix.Fchmod(fd, mode)
				unix.Close(fd)
			}
		case strings.HasPrefix(name, "setid-fchmodat-"):
			err = unix.Fchmodat(unix.AT_FDCWD, path, mode, 0)
		default:
			err = fchmodat2(path, mode)
		}
	case strings.HasPrefix(name, "setid-open-"):
		var fd int
		if fd, err = unix.Open(path, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, modeOf(name)); err == nil {
			unix.Close(fd)
		}
	case strings.HasPrefix(name, "setid-openat2-"):
		var fd int
		how := &unix.OpenHow{Flags: unix.O_CREAT | unix.O_EXCL | unix.O_WRONLY | unix.O_CLOEXEC, Mode: uint64(modeOf(name))}
		if fd, err = unix.Openat2(unix.AT_FDCWD, path, how); err == nil {
			unix.Close(fd)
		}
	case strings.HasPrefix(name, "setid-mknod-"):
		err = unix.Mknod(path, unix.S_IFREG|modeOf(name), 0)
	case strings.HasPrefix(name, "setid-mkdir-"):
		err = unix.Mkdir(path, modeOf(name))
	case strings.HasPrefix(name, "setid-dir-chmod-"):
		if err = os.Mkdir(path, 0o755); err == nil {
			err = unix.Chmod(path, modeOf(name))
		}
	default:
		return "", fmt.Errorf("unknown set-id attack %q", name)
	}
	return modeSeen(path), err
}

// chmodNew creates path 0644 and chmods it to mode.
func chmodNew(path string, mode uint32) (string, error) {
	if err := os.WriteFile(path, []byte("#!/bin/sh\nid\n"), 0o644); err != nil {
		return "", err
	}
	err := unix.Chmod(path, mode)
	return modeSeen(path), err
}

// fchmodat2 is fchmodat2(AT_FDCWD, path, mode, 0).
func fchmodat2(path string, mode uint32) error {
	b, err := unix.BytePtrFromString(path)
	if err != nil {
		return err
	}
	atFDCWD := unix.AT_FDCWD
	_, _, errno := unix.Syscall6(unix.SYS_FCHMODAT2, uintptr(atFDCWD), uintptr(unsafe.Pointer(b)), uintptr(mode), 0, 0, 0)
	if errno != 0 {
		return errno
	}
	return nil
}

// modeOf is the octal mode at the end of a set-id attack's name.
func modeOf(name string) uint32 {
	var m uint32
	fmt.Sscanf(name[strings.LastIndexByte(name, '-')+1:], "%o", &m)
	return m
}

func modeSeen(path string) string {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return "stat: " + err.Error()
	}
	return fmt.Sprintf("mode %#o inside", st.Mode&0o7777)
}

// holdInotify makes inotify instances until the kernel refuses one (or
// MaxInotify), calls held with the count and the refusal, and then closes
// them all.
func holdInotify(held func(n int, why error)) (int, error) {
	var fds []int
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	var why error
	for len(fds) < MaxInotify {
		fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
		if err != nil {
			why = err
			break
		}
		fds = append(fds, fd)
	}
	held(len(fds), why)
	return len(fds), why
}
