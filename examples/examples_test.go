package examples

import (
	"embed"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/moat-sandbox/moat/policy"
)

// The examples are embedded so that the test also runs from a test binary
// copied away from the source tree.
//
//go:embed *.yaml
var files embed.FS

// TestExamplesLoad loads each example as moat would, from a directory laid
// out like this one (a workspace beside the file).
func TestExamplesLoad(t *testing.T) {
	names, err := files.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	if len(names) < 2 {
		t.Fatalf("got %d examples, want minimal.yaml and agent-workspace.yaml", len(names))
	}
	dir := t.TempDir()
	ws := filepath.Join(dir, "workspace")
	if err := os.Mkdir(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Chdir(t.TempDir()) // the default audit directory lies under the current directory
	for _, e := range names {
		t.Run(e.Name(), func(t *testing.T) {
			b, err := files.ReadFile(e.Name())
			if err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(dir, e.Name())
			if err := os.WriteFile(p, b, 0o644); err != nil {
				t.Fatal(err)
			}
			pol, err := policy.Load(p)
			if err != nil {
				t.Fatalf("%v", err)
			}
			if !slices.Equal(pol.Filesystem.ReadWrite, []string{ws}) || pol.Process.Workdir != ws {
				t.Errorf("got read_write %v workdir %q, want [%s] and %s", pol.Filesystem.ReadWrite, pol.Process.Workdir, ws, ws)
			}
			for _, g := range []string{"/usr", "/bin"} {
				if !slices.Contains(pol.Filesystem.ReadOnly, g) {
					t.Errorf("read_only %v lacks %s, which sh, id and grep need", pol.Filesystem.ReadOnly, g)
				}
			}
		})
	}
}
