//go:build linux

package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestRunKilledLeavesNothing: moat run is SIGKILLed while its workload
// runs; with no further moat started, its staging directory in the temp
// directory and (as root, with limits) its cgroups disappear: the reaper
// moat started outside the sandbox removes them. The control: while moat
// runs, both exist.
func TestRunKilledLeavesNothing(t *testing.T) {
	e := newEnv(t)
	pol := readFile(t, e.policy(""))
	if os.Geteuid() == 0 {
		// Limits only where moat can enforce them (a written limit it
		// cannot enforce refuses the run).
		pol = strings.Replace(pol, "process:\n", "process:\n  limits: {memory: 256Mi, pids: 64}\n", 1)
	}
	p := filepath.Join(e.dir, "limits.yaml")
	if err := os.WriteFile(p, []byte(pol), 0o644); err != nil {
		t.Fatal(err)
	}
	ri := filepath.Join(e.dir, "run.json")
	cmd := e.command("run", "--policy", p, "--run-info", ri, "--", "/bin/sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	waitFor(t, "run info", 60*e2eSecond, func() bool { _, err := os.Stat(ri); return err == nil })
	var info struct {
		RunID string `json:"run_id"`
	}
	if err := json.Unmarshal([]byte(readFile(t, ri)), &info); err != nil || info.RunID == "" {
		t.Fatalf("run info %q: %v", readFile(t, ri), err)
	}
	leftovers := func() []string {
		var out []string
		m, _ := filepath.Glob(filepath.Join(os.TempDir(), "moat-"+info.RunID+"-*"))
		out = append(out, m...)
		for _, ctrl := range []string{"memory", "pids"} {
			filepath.WalkDir(filepath.Join("/sys/fs/cgroup", ctrl), func(path string, d os.DirEntry, err error) error {
				if err == nil && d.IsDir() && strings.HasSuffix(path, "moat-"+info.RunID) {
					out = append(out, path)
				}
				return nil
			})
		}
		return out
	}
	before := leftovers()
	want := 1
	if os.Geteuid() == 0 {
		want = 3 // staging directory, memory and pids cgroups
	}
	if len(before) != want {
		t.Fatalf("control: while moat runs, found %v, want %d entries", before, want)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	waitFor(t, "the reaper to remove "+strings.Join(before, ", "), 30*e2eSecond, func() bool { return len(leftovers()) == 0 })
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
