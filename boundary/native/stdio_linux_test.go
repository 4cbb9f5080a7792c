package native

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/boundary"
)

// One writer given as both stdout and stderr sees the workload's output in
// the order it was written, from one copy: native used to pump it through
// two pipes by two goroutines, which wrote the bytes.Buffer at once (a data
// race, which -race reports) and reordered the lines. Control: two writers
// each get their own stream, in the same sandbox.
func TestOneWriterForStdoutAndStderr(t *testing.T) {
	f := newFixture(t)
	sb := f.prepare(t)
	const n = 200
	script := `i=0; while [ $i -lt 200 ]; do echo o; echo e >&2; i=$((i+1)); done`
	run := func(stdout, stderr *bytes.Buffer) {
		t.Helper()
		p, err := sb.Start(context.Background(), boundary.Process{Argv: []string{"/bin/sh", "-c", script},
			Env: []string{"PATH=/usr/bin:/bin"}, Stdout: stdout, Stderr: stderr})
		if err != nil {
			t.Fatal(err)
		}
		if code, err := p.Wait(); code != 0 || err != nil {
			t.Fatalf("exit %d, %v", code, err)
		}
	}
	var both bytes.Buffer
	run(&both, &both)
	if want := strings.Repeat("o\ne\n", n); both.String() != want {
		t.Errorf("one writer: got %d bytes, not alternating o and e (first 40: %q); want %d bytes alternating", both.Len(), both.String()[:min(40, both.Len())], len(want))
	}
	var out, errOut bytes.Buffer
	run(&out, &errOut)
	if out.String() != strings.Repeat("o\n", n) || errOut.String() != strings.Repeat("e\n", n) {
		t.Errorf("control: got stdout %d bytes, stderr %d bytes; want %d each", out.Len(), errOut.Len(), 2*n)
	}
}
