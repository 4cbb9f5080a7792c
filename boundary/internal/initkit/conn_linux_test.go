package initkit

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

type testMsg struct {
	Op   string   `json:"op"`
	Argv []string `json:"argv,omitempty"`
}

// pair returns both ends of a control channel as Conns.
func pair(t *testing.T) (*Conn, *Conn) {
	t.Helper()
	a, child, err := Pair()
	if err != nil {
		t.Fatal(err)
	}
	fd, err := unix.FcntlInt(child.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	child.Close()
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewConn(fd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

func TestConnRoundTripWithFDs(t *testing.T) {
	a, b := pair(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := a.Send(testMsg{Op: "start", Argv: []string{"sh", "-c", "true"}}, int(w.Fd())); err != nil {
		t.Fatal(err)
	}
	w.Close()
	var m testMsg
	files, err := b.Recv(&m)
	if err != nil {
		t.Fatal(err)
	}
	defer CloseFiles(files)
	if m.Op != "start" || len(m.Argv) != 3 || len(files) != 1 {
		t.Fatalf("got %+v with %d files, want start with 3 args and 1 file", m, len(files))
	}
	if _, err := files[0].WriteString("through"); err != nil {
		t.Fatal(err)
	}
	files[0].Close()
	buf := make([]byte, 16)
	if n, _ := r.Read(buf); string(buf[:n]) != "through" {
		t.Fatalf("got %q through the passed fd, want %q", buf[:n], "through")
	}
}

// rawSend writes b as one packet on c's socket, bypassing Send's checks.
func rawSend(t *testing.T, c *Conn, b []byte, fds ...int) {
	t.Helper()
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	var serr error
	if err := c.rc.Write(func(fd uintptr) bool {
		serr = unix.Sendmsg(int(fd), b, oob, nil, 0)
		return serr != unix.EAGAIN
	}); err != nil {
		t.Fatal(err)
	}
	if serr != nil {
		t.Fatal(serr)
	}
}

// Every refused message is consumed: the good message after it (the
// positive control, on the same channel) is read whole.
func TestConnRefuses(t *testing.T) {
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer devnull.Close()
	d := int(devnull.Fd())
	for _, tc := range []struct {
		name string
		b    string
		fds  []int
	}{
		{"unknown field", `{"op":"x","extra":1}`, nil},
		{"trailing data", `{"op":"x"}{"op":"y"}`, nil},
		{"trailing garbage", `{"op":"x"} x`, nil},
		{"not json", `op=x`, nil},
		{"duplicate name", `{"op":"x","op":"y"}`, nil},
		{"name in another case", `{"OP":"x"}`, nil},
		{"too large", `{"op":"x","argv":["` + strings.Repeat("a", MaxMessage) + `"]}`, nil},
		{"too many fds", `{"op":"x"}`, []int{d, d, d, d, d}},
		{"bad message with an fd", `{"op":1}`, []int{d}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := pair(t)
			rawSend(t, a, []byte(tc.b), tc.fds...)
			if err := a.Send(testMsg{Op: "good"}); err != nil {
				t.Fatal(err)
			}
			var m testMsg
			if files, err := b.Recv(&m); err == nil {
				CloseFiles(files)
				t.Fatalf("got %+v, want an error", m)
			}
			m = testMsg{}
			files, err := b.Recv(&m)
			if err != nil || m.Op != "good" || len(files) != 0 {
				t.Fatalf("control: got %+v, %d files, %v; want the good message", m, len(files), err)
			}
		})
	}
}

func TestConnSendRefusesTooLarge(t *testing.T) {
	a, b := pair(t)
	if err := a.Send(testMsg{Op: "x", Argv: []string{strings.Repeat("a", MaxMessage)}}); err == nil {
		t.Fatal("sent a message over MaxMessage")
	}
	if err := a.Send(testMsg{Op: "x", Argv: []string{strings.Repeat("a", MaxMessage/2)}}); err != nil {
		t.Fatalf("control: %v", err)
	}
	var m testMsg
	if _, err := b.Recv(&m); err != nil || len(m.Argv[0]) != MaxMessage/2 {
		t.Fatalf("control: got %v", err)
	}
}

func TestConnClosed(t *testing.T) {
	a, b := pair(t)
	if err := a.Send(testMsg{Op: "last"}); err != nil {
		t.Fatal(err)
	}
	a.Close()
	var m testMsg
	if _, err := b.Recv(&m); err != nil || m.Op != "last" {
		t.Fatalf("control: got %+v, %v; want the message sent before the close", m, err)
	}
	if _, err := b.Recv(&m); !errors.Is(err, ErrClosed) {
		t.Fatalf("after the peer closed: got %v, want ErrClosed", err)
	}
	if err := b.Send(testMsg{Op: "x"}); !errors.Is(err, ErrClosed) {
		t.Fatalf("send after the peer closed: got %v, want ErrClosed", err)
	}
}

func TestConnCloseWakesRecv(t *testing.T) {
	_, b := pair(t)
	done := make(chan error, 1)
	go func() {
		var m testMsg
		_, err := b.Recv(&m)
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	b.Close()
	select {
	case err := <-done:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("got %v, want ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not wake Recv")
	}
}

func TestConnDeadline(t *testing.T) {
	a, b := pair(t)
	b.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	var m testMsg
	if _, err := b.Recv(&m); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("got %v, want os.ErrDeadlineExceeded", err)
	}
	b.SetReadDeadline(time.Time{})
	if err := a.Send(testMsg{Op: "late"}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Recv(&m); err != nil || m.Op != "late" {
		t.Fatalf("control: got %+v, %v", m, err)
	}
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"op":"start","argv":["sh"]}`))
	f.Add([]byte(`{"op":"x"} `))
	f.Fuzz(func(t *testing.T, b []byte) {
		var m testMsg
		if err := Decode(b, &m); err != nil {
			return
		}
		// Whatever is accepted is one object of known fields: it
		// encodes back to something Decode accepts as the same.
		var again testMsg
		if err := Decode(mustJSON(t, m), &again); err != nil || again.Op != m.Op || len(again.Argv) != len(m.Argv) {
			t.Fatalf("accepted %q as %+v, which does not round-trip: %+v, %v", b, m, again, err)
		}
	})
}
