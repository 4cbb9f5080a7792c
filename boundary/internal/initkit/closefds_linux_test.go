package initkit

import (
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// CloseInherited closes the fds a process inherited (close-on-exec clear)
// and leaves its own, the Go runtime's netpoller among them: with the
// poller in use before and after (a loopback listener), a close_range of
// every fd killed the process with "fatal error: runtime: netpoll failed".
// Control: an fd opened without O_CLOEXEC, as an inherited one is, is
// closed; one opened with it stays.
func TestCloseInherited(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0") // the netpoller is in use
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	inherited, err := unix.Open("/dev/null", unix.O_RDONLY, 0) // no O_CLOEXEC
	if err != nil {
		t.Fatal(err)
	}
	own, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(own)
	CloseInherited(3)
	if _, err := unix.FcntlInt(uintptr(inherited), unix.F_GETFD, 0); err != unix.EBADF {
		unix.Close(inherited)
		t.Errorf("fd %d without close-on-exec is still open (%v), want it closed", inherited, err)
	}
	if _, err := unix.FcntlInt(uintptr(own), unix.F_GETFD, 0); err != nil {
		t.Errorf("close-on-exec fd %d: %v, want it open", own, err)
	}
	// The poller still works.
	done := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			c.Close()
		}
		done <- err
	}()
	c, err := net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatalf("dial after CloseInherited: %v", err)
	}
	c.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("accept after CloseInherited: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("accept after CloseInherited did not return")
	}
}
