//go:build linux

package moat_test

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
)

// TestDiskLimitStated: run info and --explain always say whether the
// workspace's disk use is limited (it is not, on any backend yet).
func TestDiskLimitStated(t *testing.T) {
	e := newEnv(t)
	ri := filepath.Join(e.dir, "run.json")
	r := e.moat("run", "--explain", "--policy", e.policy(""), "--run-info", ri, "--", "/bin/true")
	if r.code != 0 {
		t.Fatalf("moat run: %s", r)
	}
	if !strings.Contains(r.stderr, "disk=false") || !strings.Contains(r.stderr, "disk: workspace disk use is not limited") {
		t.Errorf("--explain does not state the disk limit:\n%s", r.stderr)
	}
	var info struct {
		Limits map[string]any `json:"limits"`
	}
	if err := json.Unmarshal([]byte(readFile(t, ri)), &info); err != nil {
		t.Fatal(err)
	}
	if d, ok := info.Limits["disk"].(bool); !ok || d {
		t.Errorf("run info limits.disk = %v, want false", info.Limits["disk"])
	}
	if s, _ := info.Limits["disk_detail"].(string); !strings.Contains(s, "not limited") {
		t.Errorf("run info limits.disk_detail = %q", s)
	}
}
