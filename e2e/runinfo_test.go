//go:build linux

package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/internal/runinfo"
)

// A symlink planted at the --run-info path is not followed: the file it
// points to stays untouched and the run info is written at the path.
func TestRunInfoPlantedSymlinkNotFollowed(t *testing.T) {
	e := newEnv(t)
	pol := e.policy("")
	victim := filepath.Join(e.dir, "authorized_keys")
	if err := os.WriteFile(victim, []byte("ssh-ed25519 AAAA victim\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ri := filepath.Join(e.dir, "run.json")
	if err := os.Symlink(victim, ri); err != nil {
		t.Fatal(err)
	}
	r := e.moat("run", "--policy", pol, "--run-info", ri, "--", "true")
	if r.code != 0 {
		t.Fatalf("%s", r)
	}
	if b, _ := os.ReadFile(victim); string(b) != "ssh-ed25519 AAAA victim\n" {
		t.Errorf("moat wrote through the planted symlink: the target now holds %q", b)
	}
	fi, err := os.Lstat(ri)
	if err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("the run-info path is not a regular file: %v %v", fi, err)
	}
	info, _, err := runinfo.Read(ri)
	if err != nil {
		t.Fatalf("run info: %v", err)
	}
	if !strings.Contains(r.stderr, info.RunID) {
		t.Errorf("run info names run %s, not the one moat printed:\n%s", info.RunID, r)
	}
}

// A --run-info path inside a grant is refused with 125 before anything
// starts, naming the grant; outside the grants the same run works.
func TestRunInfoInsideGrantRefused(t *testing.T) {
	e := newEnv(t)
	pol := e.policy("")
	marker := filepath.Join(e.workspace, "ran")
	script := "touch " + marker
	sub := filepath.Join(e.workspace, "sub")
	if err := os.Mkdir(sub, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(sub, 0o777)
	// A host symlink outside the grants whose target is in the workspace.
	hostLink := filepath.Join(e.dir, "to-workspace")
	if err := os.Symlink(e.workspace, hostLink); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, path, grant string }{
		{"read_write grant", filepath.Join(e.workspace, "run.json"), e.workspace},
		{"below the read_write grant", filepath.Join(sub, "run.json"), e.workspace},
		{"read_only grant", filepath.Join(e.binDir, "run.json"), e.binDir},
		{"through a host symlink into the grant", filepath.Join(hostLink, "sub", "run.json"), e.workspace},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := e.moat("run", "--policy", pol, "--run-info", tc.path, "--", "sh", "-c", script)
			if r.code != 125 {
				t.Fatalf("got exit %d, want 125:\n%s", r.code, r)
			}
			if !strings.Contains(r.stderr, "grant "+tc.grant) || !strings.Contains(r.stderr, "--run-info") {
				t.Errorf("the refusal does not name the grant %s:\n%s", tc.grant, r)
			}
			if strings.Contains(r.stderr, "journal") {
				t.Errorf("the refusal came after the journal opened:\n%s", r)
			}
			if _, err := os.Stat(marker); err == nil {
				t.Errorf("the workload ran despite the refusal")
			}
			if _, err := os.Lstat(tc.path); err == nil {
				t.Errorf("%s was written", tc.path)
			}
		})
	}
	// Control: outside the grants it works.
	ri := filepath.Join(e.dir, "run.json")
	r := e.moat("run", "--policy", pol, "--run-info", ri, "--", "sh", "-c", script)
	if r.code != 0 {
		t.Fatalf("outside the grants: %s", r)
	}
	if _, _, err := runinfo.Read(ri); err != nil {
		t.Errorf("run info: %v", err)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Errorf("the control workload did not run")
	}
}
