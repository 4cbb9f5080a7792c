package measure

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// The probes below are the classes an attack found outside every earlier
// check (issue 11): set-id files reaching the host, datagram Unix sockets
// made without socket(2), and FIFOs as a channel through a shared
// directory. Each runs in dir, the sandbox's own /tmp, so that a probe
// that unexpectedly succeeds leaves nothing on the host.

// probeSetIDChmod creates a file and tries to make it setuid with chmod.
func probeSetIDChmod(dir, name string, mode uint32) (string, string) {
	p := filepath.Join(dir, name)
	fd, err := unix.Open(p, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return OutcomeError, "creating the probe file: " + err.Error()
	}
	unix.Close(fd)
	defer os.Remove(p)
	if err := unix.Chmod(p, mode); err != nil {
		return OutcomeFailed, fmt.Sprintf("chmod %#o: %v", mode, err)
	}
	return setBits(p, mode)
}

// probeSetIDCreate creates a file with a set-id mode in open(2) itself.
func probeSetIDCreate(dir, name string) (string, string) {
	p := filepath.Join(dir, name)
	fd, err := unix.Open(p, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o4755)
	if err != nil {
		return OutcomeFailed, "open with mode 04755: " + err.Error()
	}
	unix.Close(fd)
	defer os.Remove(p)
	return setBits(p, 0o4755)
}

// setBits says whether p carries the set-id bits of want.
func setBits(p string, want uint32) (string, string) {
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return OutcomeError, "stat: " + err.Error()
	}
	if want&0o6000 == 0 {
		return OutcomeSucceeded, fmt.Sprintf("mode %#o", st.Mode&0o7777)
	}
	if st.Mode&want&0o6000 != 0 {
		return OutcomeSucceeded, fmt.Sprintf("the file has mode %#o", st.Mode&0o7777)
	}
	return OutcomeFailed, fmt.Sprintf("the call worked but the file has mode %#o", st.Mode&0o7777)
}

// probeSocketpair tries socketpair(AF_UNIX, typ).
func probeSocketpair(typ int) (string, string) {
	fds, err := unix.Socketpair(unix.AF_UNIX, typ|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return OutcomeFailed, "socketpair: " + err.Error()
	}
	unix.Close(fds[0])
	unix.Close(fds[1])
	return OutcomeSucceeded, "socketpair made a pair"
}

// probeFIFO tries to make a FIFO.
func probeFIFO(dir, name string) (string, string) {
	p := filepath.Join(dir, name)
	if err := unix.Mknod(p, unix.S_IFIFO|0o600, 0); err != nil {
		return OutcomeFailed, "mknod S_IFIFO: " + err.Error()
	}
	os.Remove(p)
	return OutcomeSucceeded, "a FIFO was made"
}

// probeUnixDgram tries to send a datagram to the pathname socket addr,
// first from socket(AF_UNIX, SOCK_DGRAM), then from one end of a datagram
// socketpair (which needs no socket(2)).
func probeUnixDgram(addr string) (string, string) {
	to := &unix.SockaddrUnix{Name: addr}
	var why []string
	if fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0); err != nil {
		why = append(why, "socket: "+err.Error())
	} else {
		err := unix.Sendto(fd, []byte("moat"), 0, to)
		unix.Close(fd)
		if err == nil {
			return OutcomeSucceeded, "sent from socket(2) to " + addr
		}
		why = append(why, "socket+sendto: "+err.Error())
	}
	if fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0); err != nil {
		why = append(why, "socketpair: "+err.Error())
	} else {
		err := unix.Sendto(fds[0], []byte("moat"), 0, to)
		unix.Close(fds[0])
		unix.Close(fds[1])
		if err == nil {
			return OutcomeSucceeded, "sent from a socketpair to " + addr
		}
		why = append(why, "socketpair+sendto: "+err.Error())
	}
	return OutcomeFailed, strings.Join(why, "; ")
}
