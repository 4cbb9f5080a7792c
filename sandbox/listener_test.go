package sandbox

import (
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// TestAdmission: a connection the admission refuses is closed unread and
// reported; one it admits is served (the positive control, on the same
// listener); nil admission is the listener itself.
func TestAdmission(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if withAdmission(raw, nil, nil) != raw {
		t.Fatal("nil admission wrapped the listener")
	}
	var allowedPort atomic.Int64
	refusedCh := make(chan string, 4)
	ln := withAdmission(raw, func(a net.Addr) error {
		if int64(a.(*net.TCPAddr).Port) == allowedPort.Load() {
			return nil
		}
		return errors.New("not the sandbox's address")
	}, func(a net.Addr, why error) { refusedCh <- a.String() + ": " + why.Error() })
	defer ln.Close()
	served := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			served <- "accept: " + err.Error()
			return
		}
		defer c.Close()
		b, _ := io.ReadAll(io.LimitReader(c, 5))
		served <- string(b)
	}()
	// Refused: a connection from a port that is not allowed.
	bad, err := net.Dial("tcp", raw.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	bad.Write([]byte("hello"))
	select {
	case r := <-refusedCh:
		if r == "" {
			t.Error("empty refusal")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("refusal not reported")
	}
	bad.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := bad.Read(make([]byte, 1)); err == nil {
		t.Errorf("refused connection read %d bytes", n)
	}
	bad.Close()
	// Admitted: dial from a chosen local port.
	var d net.Dialer
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := probe.Addr().(*net.TCPAddr).Port
	allowedPort.Store(int64(port))
	probe.Close()
	d.LocalAddr = &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port}
	good, err := d.Dial("tcp", raw.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	good.Write([]byte("hello"))
	good.Close()
	select {
	case got := <-served:
		if got != "hello" {
			t.Errorf("admitted connection served %q", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("admitted connection not served")
	}
}
