package gvisor

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/policy"
)

// TestRootPrepareRefusalsUnprefixed: as native's, Prepare's refusals carry
// no "moat: refused: " of their own (moat run printed it twice): a
// root-owned read_write grant and a volume; the control: the same policy,
// put right, prepares.
func TestRootPrepareRefusalsUnprefixed(t *testing.T) {
	needRunsc(t)
	be, err := boundary.Lookup("gvisor")
	if err != nil {
		t.Fatal(err)
	}
	pol, ws := testPolicy(t)
	refused := func(name, want string) {
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
	if err := os.Chown(ws, 0, 0); err != nil {
		t.Fatal(err)
	}
	refused("root-owned grant", "owned by uid 0")
	if err := os.Chown(ws, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	pol.Filesystem.Volumes = []policy.Volume{{Path: "/data", Size: 1 << 20}}
	refused("volume", "filesystem.volumes are not available")
	pol.Filesystem.Volumes = nil
	sb, err := be.Prepare(context.Background(), boundary.Spec{RunID: "unprefixed-ctl", Policy: pol, StateDir: t.TempDir()})
	if err != nil {
		t.Fatalf("control: %v", err)
	}
	sb.Terminate()
}
