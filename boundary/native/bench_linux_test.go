package native

import (
	"context"
	"testing"

	"github.com/moat-sandbox/moat/boundary"
)

// BenchmarkPrepareTerminate measures building a sandbox (init, root,
// listener) and tearing it down, with nothing run in it.
func BenchmarkPrepareTerminate(b *testing.B) {
	f := newFixture(b)
	be, _ := boundary.Lookup(Name)
	for b.Loop() {
		sb, err := be.Prepare(context.Background(), boundary.Spec{RunID: "bench", Policy: f.pol, StateDir: b.TempDir()})
		if err != nil {
			b.Fatal(err)
		}
		if err := sb.Terminate(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkStartWait measures starting one confined process (stage:
// userns, caps, Landlock, seccomp, exec) in a ready sandbox and waiting
// for it.
func BenchmarkStartWait(b *testing.B) {
	f := newFixture(b)
	be, _ := boundary.Lookup(Name)
	sb, err := be.Prepare(context.Background(), boundary.Spec{RunID: "bench", Policy: f.pol, StateDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer sb.Terminate()
	for b.Loop() {
		p, err := sb.Start(context.Background(), boundary.Process{Argv: append([]string{f.bin}, actionArgs("exit")...)})
		if err != nil {
			b.Fatal(err)
		}
		if code, err := p.Wait(); err != nil || code != 0 {
			b.Fatalf("exit %d, %v", code, err)
		}
	}
}
