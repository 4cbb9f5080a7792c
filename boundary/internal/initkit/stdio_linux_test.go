package initkit

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/boundary"
)

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// serialWriter records its writes and whether two ever overlapped.
type serialWriter struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	inWrite atomic.Int32
	overlap atomic.Bool
}

func (w *serialWriter) Write(p []byte) (int, error) {
	if w.inWrite.Add(1) > 1 {
		w.overlap.Store(true)
	}
	defer w.inWrite.Add(-1)
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

func ino(t *testing.T, fd uintptr) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(int(fd), &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// run runs a shell script with s as its stdio and waits for its output.
func run(t *testing.T, s *Stdio, script string) {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = s.Child[0], s.Child[1], s.Child[2]
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s.CloseChild()
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	s.Wait(0)
}

// One writer given as both stdout and stderr gets one pipe: it is never
// written from two goroutines, and it sees the process's writes in their
// order. (The native backend used to make two pipes and two copies here.)
// The control: two writers get two pipes.
func TestStdioOneWriterForBoth(t *testing.T) {
	const script = `i=0; while [ $i -lt 200 ]; do echo o; echo e >&2; i=$((i+1)); done`
	w := &serialWriter{}
	s, err := OpenStdio(boundary.Process{Stdout: w, Stderr: w})
	if err != nil {
		t.Fatal(err)
	}
	if a, b := ino(t, s.Child[1].Fd()), ino(t, s.Child[2].Fd()); a != b {
		t.Fatalf("stdout and stderr are pipes %d and %d, want one pipe for one writer", a, b)
	}
	run(t, s, script)
	if want := strings.Repeat("o\ne\n", 200); w.buf.String() != want {
		t.Errorf("got output of %d bytes out of order, want %d bytes alternating o and e", w.buf.Len(), len(want))
	}
	if w.overlap.Load() {
		t.Error("the writer was written from two goroutines at once")
	}

	// Control: two writers, two pipes, each its own output.
	var out, errOut serialWriter
	s, err = OpenStdio(boundary.Process{Stdout: &out, Stderr: &errOut, Stdin: strings.NewReader("in\n")})
	if err != nil {
		t.Fatal(err)
	}
	if a, b := ino(t, s.Child[1].Fd()), ino(t, s.Child[2].Fd()); a == b {
		t.Fatal("control: two writers share one pipe")
	}
	run(t, s, `read l; echo "$l"; echo e >&2`)
	if out.buf.String() != "in\n" || errOut.buf.String() != "e\n" {
		t.Errorf("control: got stdout %q, stderr %q; want %q, %q", out.buf.String(), errOut.buf.String(), "in\n", "e\n")
	}
}

// A nil stdio is /dev/null; a file is passed as a dup of itself.
func TestStdioNilAndFiles(t *testing.T) {
	s, err := OpenStdio(boundary.Process{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.CloseChild()
	var null unix.Stat_t
	if err := unix.Stat("/dev/null", &null); err != nil {
		t.Fatal(err)
	}
	for i, f := range s.Child {
		if got := ino(t, f.Fd()); got != null.Ino {
			t.Errorf("fd %d: inode %d, want /dev/null's %d", i, got, null.Ino)
		}
	}
	f := s.Child[1]
	s2, err := OpenStdio(boundary.Process{Stdout: f, Stderr: f})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.CloseChild()
	if s2.Child[1].Fd() == f.Fd() || ino(t, s2.Child[1].Fd()) != null.Ino {
		t.Error("a file is not passed as a dup of itself")
	}
}
