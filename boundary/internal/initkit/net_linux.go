package initkit

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// LoopbackUp brings lo up: in the sandbox's fresh network namespace it is
// the only interface.
func LoopbackUp() error {
	s, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket for lo: %w", err)
	}
	defer unix.Close(s)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(s, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("SIOCGIFFLAGS lo: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(s, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bringing lo up: %w", err)
	}
	return nil
}

// BrokerBacklog is the broker listener's accept backlog.
const BrokerBacklog = 128

// BrokerListener makes the broker's listening socket on
// 127.0.0.1:<ephemeral> in the calling thread's network namespace, close-on-exec.
// The caller owns fd.
func BrokerListener() (fd, port int, err error) {
	fd, err = unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, 0, err
	}
	fail := func(err error) (int, int, error) {
		unix.Close(fd)
		return -1, 0, err
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		return fail(fmt.Errorf("bind 127.0.0.1:0: %w", err))
	}
	if err := unix.Listen(fd, BrokerBacklog); err != nil {
		return fail(err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return fail(err)
	}
	in4, ok := sa.(*unix.SockaddrInet4)
	if !ok {
		return fail(errors.New("BUG: broker socket is not IPv4"))
	}
	return fd, in4.Port, nil
}
