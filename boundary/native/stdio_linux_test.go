package native

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/moat-sandbox/moat/boundary"
)

// overlapWriter records its writes and whether two ever overlapped.
type overlapWriter struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	inWrite atomic.Int32
	overlap atomic.Bool
}

func (w *overlapWriter) Write(p []byte) (int, error) {
	if w.inWrite.Add(1) > 1 {
		w.overlap.Store(true)
	}
	defer w.inWrite.Add(-1)
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

// One writer given as both stdout and stderr sees the workload's output in
// the order it was written, from one copy: native used to pump it through
// two pipes by two goroutines, which wrote the writer at once (a data race
// on a bytes.Buffer) and reordered the lines. Control: two writers each
// get their own stream, in the same sandbox.
func TestOneWriterForStdoutAndStderr(t *testing.T) {
	f := newFixture(t)
	sb := f.prepare(t)
	const n = 200
	script := `i=0; while [ $i -lt 200 ]; do echo o; echo e >&2; i=$((i+1)); done`
	w := &overlapWriter{}
	p, err := sb.Start(context.Background(), boundary.Process{Argv: []string{"/bin/sh", "-c", script},
		Env: []string{"PATH=/usr/bin:/bin"}, Stdout: w, Stderr: w})
	if err != nil {
		t.Fatal(err)
	}
	if code, err := p.Wait(); code != 0 || err != nil {
		t.Fatalf("exit %d, %v", code, err)
	}
	if want := strings.Repeat("o\ne\n", n); w.buf.String() != want {
		t.Errorf("one writer: got %d bytes, not alternating o and e (first 40: %q); want %d bytes alternating", w.buf.Len(), first(w.buf.String(), 40), len(want))
	}
	if w.overlap.Load() {
		t.Error("one writer was written from two goroutines at once")
	}

	var out, errOut overlapWriter
	p, err = sb.Start(context.Background(), boundary.Process{Argv: []string{"/bin/sh", "-c", script},
		Env: []string{"PATH=/usr/bin:/bin"}, Stdout: &out, Stderr: &errOut})
	if err != nil {
		t.Fatal(err)
	}
	if code, err := p.Wait(); code != 0 || err != nil {
		t.Fatalf("control: exit %d, %v", code, err)
	}
	if out.buf.String() != strings.Repeat("o\n", n) || errOut.buf.String() != strings.Repeat("e\n", n) {
		t.Errorf("control: got stdout %d bytes, stderr %d bytes; want %d each", out.buf.Len(), errOut.buf.Len(), 2*n)
	}
}

func first(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}
