package native

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/policy"
)

// TestPrepareRefusalsUnprefixed: Prepare's refusals say what is wrong and
// nothing more. "moat: refused: " is written once, where moat reports a
// refusal (the session's RefusedError, the CLI); the backend writing it
// too made moat run print "moat: refused: backend native could not
// prepare the sandbox: moat: refused: read_write grant …". Cases: the
// Landlock ABI refusal's message, process.uid 0 and, as root, a
// root-owned read_write grant; the control: the same fixture, put right,
// prepares.
func TestPrepareRefusalsUnprefixed(t *testing.T) {
	f := newFixture(t)
	be, err := boundary.Lookup(Name)
	if err != nil {
		t.Fatal(err)
	}
	refused := func(name string, pol *policy.Policy, want string) {
		t.Helper()
		sb, err := be.Prepare(context.Background(), boundary.Spec{RunID: "unprefixed", Policy: pol, StateDir: t.TempDir()})
		if err == nil {
			sb.Terminate()
			t.Fatalf("%s: prepared", name)
		}
		if strings.Contains(err.Error(), "refused") || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: refusal %q: want %q, without a refused prefix", name, err, want)
		}
	}
	for _, e := range []*ABIError{{Found: 0, Floor: 3}, {Found: 2, Floor: 3}} {
		if msg := e.Error(); strings.Contains(msg, "refused") || !strings.Contains(msg, "landlock.abi_floor") {
			t.Errorf("ABIError %+v: %q, want the floor named, without a refused prefix", *e, msg)
		}
	}
	uid0 := *f.pol
	uid0.Process.UID = 0
	refused("process.uid 0", &uid0, "process.uid is 0")
	if os.Geteuid() == 0 {
		if err := os.Chown(f.ws, 0, 0); err != nil {
			t.Fatal(err)
		}
		refused("root-owned grant", f.pol, "owned by uid 0")
		if err := os.Chown(f.ws, policy.NobodyID, policy.NobodyID); err != nil {
			t.Fatal(err)
		}
	}
	f.prepare(t)
}
