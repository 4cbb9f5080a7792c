package attrib

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/internal/reexec/reexectest"
	"github.com/moat-sandbox/moat/internal/testenv"
)

// clientHelper makes the re-executed test binary a client that connects
// to the address given, then waits until the connection is closed.
var clientHelper = reexectest.Helper("attrib-client", runChild)

func TestMain(m *testing.M) { reexectest.Main(m, clientHelper, netnsPair) }

func runChild(args []string) int {
	if len(args) != 1 {
		return 2
	}
	c, err := net.Dial("tcp", args[0])
	if err != nil {
		return 3
	}
	if _, err := c.Write([]byte("x")); err != nil {
		return 4
	}
	io.Copy(io.Discard, c) // until the parent closes
	return 0
}

func selfSHA256(t testing.TB) (string, string) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return exe, hex.EncodeToString(s[:])
}

func listen(t testing.TB, network, addr string) net.Listener {
	t.Helper()
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Fatalf("listen %s %s: %v", network, addr, err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

func acceptOne(t testing.TB, ln net.Listener) net.Conn {
	t.Helper()
	ln.(*net.TCPListener).SetDeadline(time.Now().Add(10 * time.Second))
	c, err := ln.Accept()
	if err != nil {
		t.Fatalf("accept: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	// Wait for the child's byte, so its socket is surely established.
	b := make([]byte, 1)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(c, b); err != nil {
		t.Fatalf("read from peer: %v", err)
	}
	return c
}

func TestAttributeChildProcess(t *testing.T) {
	exe, sum := selfSHA256(t)
	for _, tc := range []struct{ name, network, addr string }{
		{"ipv4", "tcp4", "127.0.0.1:0"},
		{"ipv6", "tcp6", "[::1]:0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen(tc.network, tc.addr)
			if tc.name == "ipv6" {
				testenv.Need(t, err == nil, fmt.Sprintf("an IPv6 loopback (%v)", err))
			}
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			cmd := exec.Command(exe, clientHelper.Name, ln.Addr().String())
			cmd.Env = []string{}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer cmd.Wait()
			c := acceptOne(t, ln)
			got := New(os.Getpid()).Attribute(c)
			want := boundary.Attribution{Status: boundary.AttributionResolved, PID: cmd.Process.Pid, Executable: exe, SHA256: sum}
			if got != want {
				t.Errorf("got %+v, want %+v", got, want)
			}
			c.Close()
			if err := cmd.Wait(); err != nil {
				t.Errorf("child: %v", err)
			}
		})
	}
}

func TestAttributeSelf(t *testing.T) {
	exe, sum := selfSHA256(t)
	ln := listen(t, "tcp", "127.0.0.1:0")
	cl, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	cl.Write([]byte("x"))
	c := acceptOne(t, ln)
	a := New(os.Getpid())
	got := a.Attribute(c)
	want := boundary.Attribution{Status: boundary.AttributionResolved, PID: os.Getpid(), Executable: exe, SHA256: sum}
	if got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
	// The client side of the same pair is attributed to us as well: its
	// peer is the accepted socket, which we hold.
	if got := a.Attribute(cl); got != want {
		t.Errorf("client side: got %+v, want %+v", got, want)
	}
}

func TestAttributeUnavailable(t *testing.T) {
	ln := listen(t, "tcp", "127.0.0.1:0")
	exe, _ := selfSHA256(t)

	t.Run("peer exited", func(t *testing.T) {
		cmd := exec.Command(exe, clientHelper.Name, ln.Addr().String())
		cmd.Env = []string{}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		c := acceptOne(t, ln)
		cmd.Process.Kill()
		cmd.Wait()
		got := New(os.Getpid()).Attribute(c)
		if got.Status != boundary.AttributionUnavailable || got.PID != 0 || got.SHA256 != "" {
			t.Fatalf("got %+v, want unavailable", got)
		}
		if !strings.Contains(got.Reason, "no longer held") && !strings.Contains(got.Reason, "no socket from") {
			t.Errorf("reason %q does not say the peer is gone", got.Reason)
		}
	})
	t.Run("not tcp", func(t *testing.T) {
		a, b := net.Pipe()
		defer a.Close()
		defer b.Close()
		got := New(os.Getpid()).Attribute(a)
		if got.Status != boundary.AttributionUnavailable || !strings.Contains(got.Reason, "not a TCP connection") {
			t.Errorf("got %+v, want unavailable: not a TCP connection", got)
		}
	})
	t.Run("nil", func(t *testing.T) {
		if got := New(os.Getpid()).Attribute(nil); got.Status != boundary.AttributionUnavailable {
			t.Errorf("got %+v, want unavailable", got)
		}
	})
	t.Run("wrong namespace pid", func(t *testing.T) {
		cl, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		cl.Write([]byte("x"))
		c := acceptOne(t, ln)
		got := New(1 << 30).Attribute(c) // no such process
		if got.Status != boundary.AttributionUnavailable || !strings.Contains(got.Reason, "network namespace") {
			t.Errorf("got %+v, want unavailable naming the namespace", got)
		}
	})
}

func BenchmarkAttribute(b *testing.B) {
	_, c := loopbackPair(b)
	a := New(os.Getpid())
	if got := a.Attribute(c); got.Status != boundary.AttributionResolved {
		b.Fatalf("got %+v", got)
	}
	b.ResetTimer()
	for b.Loop() {
		if got := a.Attribute(c); got.Status != boundary.AttributionResolved {
			b.Fatalf("got %+v", got)
		}
	}
}

// BenchmarkPeerLookup compares the two ways to find the peer's socket, in
// one run: the sock_diag lookup of the 4-tuple and the table read.
func BenchmarkPeerLookup(b *testing.B) {
	cl, _ := loopbackPair(b)
	local, remote := ends(cl)
	ns := ownNetns(b)
	a := &attributor{netnsPID: os.Getpid()}
	b.Run("sock_diag", func(b *testing.B) {
		for b.Loop() {
			if r, err := diagPeer(os.Getpid(), ns, local, remote); err != nil || r.Inode == 0 {
				b.Fatal(r, err)
			}
		}
	})
	b.Run("table", func(b *testing.B) {
		for b.Loop() {
			if _, err := a.tablePeerInode(local, remote); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// loopbackPair is a TCP connection on loopback that has carried a byte:
// the dialled end and the accepted one, both closed when b ends.
func loopbackPair(b *testing.B) (cl, c net.Conn) {
	ln := listen(b, "tcp", "127.0.0.1:0")
	cl, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cl.Close() })
	cl.Write([]byte("x"))
	return cl, acceptOne(b, ln)
}
