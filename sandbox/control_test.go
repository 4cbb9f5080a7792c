package sandbox

import (
	"bytes"
	"errors"
	"net"
	"os"
	"syscall"
	"testing"
)

// unixPair is a connected pair of stream sockets, as the control socket's
// accepted connection and its client.
func unixPair(t *testing.T) (srv, cli *net.UnixConn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "control")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

// readControl gives each request exactly its own bytes and descriptors:
// a long one (a long argv), which a stream socket hands over in several
// reads, comes whole (one read of it gave 36 KiB of 100: sandbox exec
// with a 60 KB argument failed with "bad control request"); a short one
// read after it carries nothing of it, though the buffer is pooled; and
// what it returns is a copy that no later read changes.
func TestReadControlPooled(t *testing.T) {
	long := append(bytes.Repeat([]byte("x"), 300<<10), '\n')
	short := []byte(`{"op":"status"}` + "\n")
	var got [][]byte
	for _, req := range [][]byte{long, short, short} {
		srv, cli := unixPair(t)
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		rights := syscall.UnixRights(int(r.Fd()), int(w.Fd()), int(r.Fd()))
		sent := make(chan error, 1)
		go func() {
			sent <- writeControl(cli, req, rights)
		}()
		oob := make([]byte, syscall.CmsgSpace(3*4))
		msg, oobn, err := readControl(srv, oob)
		if err != nil {
			t.Fatal(err)
		}
		if err := <-sent; err != nil {
			t.Fatal(err)
		}
		r.Close()
		w.Close()
		if !bytes.Equal(msg, req) {
			t.Fatalf("read %d bytes %.20q…, want the %d sent", len(msg), msg, len(req))
		}
		msgs, err := syscall.ParseSocketControlMessage(oob[:oobn])
		if err != nil || len(msgs) != 1 {
			t.Fatalf("control messages: %v, %d", err, len(msgs))
		}
		fds, err := syscall.ParseUnixRights(&msgs[0])
		if err != nil || len(fds) != 3 {
			t.Fatalf("descriptors: %v, %d, want 3", err, len(fds))
		}
		for _, fd := range fds {
			syscall.Close(fd)
		}
		got = append(got, msg)
	}
	if !bytes.Equal(got[0], long) || !bytes.Equal(got[1], short) {
		t.Fatal("a request read earlier changed after a later read")
	}
}

// A request cut short (the client gone before its newline) and one of
// maxControlMsg bytes or more are errors, never a request, and the
// latter is said to be too large; the descriptors sent with either are
// closed by handle (closeRights), not kept.
func TestReadControlIncomplete(t *testing.T) {
	srv, cli := unixPair(t)
	if _, err := cli.Write([]byte(`{"op":"exec","argv":["/bin/tr`)); err != nil {
		t.Fatal(err)
	}
	cli.CloseWrite()
	if msg, _, err := readControl(srv, nil); err == nil {
		t.Fatalf("a request without its newline was read as %q", msg)
	}

	srv2, cli2 := unixPair(t)
	go func() {
		huge := bytes.Repeat([]byte("y"), maxControlMsg+10)
		cli2.Write(append(huge, '\n'))
	}()
	if _, _, err := readControl(srv2, nil); !errors.Is(err, errControlTooLarge) {
		t.Fatalf("a request of %d bytes: %v, want errControlTooLarge", maxControlMsg+11, err)
	}
	// The control: one byte under the limit, with its newline, is read.
	srv3, cli3 := unixPair(t)
	justUnder := append(bytes.Repeat([]byte("z"), maxControlMsg-1), '\n')
	go cli3.Write(justUnder)
	if msg, _, err := readControl(srv3, nil); err != nil || len(msg) != maxControlMsg {
		t.Fatalf("a request of %d bytes: %d bytes, %v", maxControlMsg, len(msg), err)
	}

	// closeRights closes what it is given.
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	fd, err := syscall.Dup(int(w.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	closeRights(syscall.UnixRights(fd))
	if _, err := syscall.Write(fd, []byte("x")); err == nil {
		t.Fatal("closeRights left the descriptor open")
	}
}

// The pooled buffer goes back with no byte of the request in it (a
// request's argv and env may hold a token). It did not: the bytes of the
// read that held the newline were left (found by an attacker review).
func TestReadControlClearsBuffer(t *testing.T) {
	var back *[maxControlMsg]byte
	putControlBuf = func(b *[maxControlMsg]byte) { back = b }
	t.Cleanup(func() { putControlBuf = func(b *[maxControlMsg]byte) { controlBufs.Put(b) } })
	for _, req := range [][]byte{
		[]byte(`{"op":"exec","argv":["sh","-c","TOKEN=hunter2-secret"]}` + "\n"),
		append(append([]byte(`{"op":"exec","argv":["hunter2-secret","`), bytes.Repeat([]byte("x"), 200<<10)...), []byte(`"]}`+"\n")...),
	} {
		srv, cli := unixPair(t)
		go writeControl(cli, req, nil)
		msg, _, err := readControl(srv, nil)
		if err != nil || !bytes.Equal(msg, req) {
			t.Fatalf("read %d bytes, %v; want the %d sent", len(msg), err, len(req))
		}
		if back == nil {
			t.Fatal("the buffer did not go back to the pool")
		}
		if i := bytes.Index(back[:], []byte("hunter2-secret")); i >= 0 {
			t.Fatalf("the pooled buffer still holds the request (at byte %d) after a %d-byte request", i, len(req))
		}
		// The control: the check finds the token in what was returned.
		if !bytes.Contains(msg, []byte("hunter2-secret")) {
			t.Fatal("control: the request read has no token")
		}
		back = nil
	}
}
