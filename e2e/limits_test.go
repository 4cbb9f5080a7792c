//go:build linux

package e2e

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/internal/testenv"
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

// TestRefusalLimitEndsRun: past inference.max_refusals the run ends with
// exit 125 and run.terminated says refusal_limit (not a bare
// "cancelled"); the control: the allowed request before it went through.
func TestRefusalLimitEndsRun(t *testing.T) {
	e := newEnv(t)
	p, ptls := newProvider(t, false), newProvider(t, true)
	pol := strings.Replace(readFile(t, e.brokerPolicy(p, ptls)), "  max_requests: 64\n", "  max_requests: 64\n  max_refusals: 2\n", 1)
	path := e.dir + "/refusals.yaml"
	writeFile(t, path, pol)
	r, journal := e.runWithProvider(path, []*provider{p, ptls}, "sdk-anthropic=claude-e2e",
		"sdk-anthropic=claude-not-allowed", "sdk-anthropic=claude-not-allowed", "sdk-anthropic=claude-not-allowed")
	if r.code != 125 {
		t.Fatalf("exit %d, want 125\n%s", r.code, r)
	}
	if len(p.Requests()) != 1 {
		t.Errorf("control: the provider saw %d requests, want the allowed one", len(p.Requests()))
	}
	lines := strings.Split(strings.TrimSpace(readFile(t, journal)), "\n")
	var env struct {
		Payload string `json:"payload"`
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &env); err != nil {
		t.Fatal(err)
	}
	b, _ := base64.StdEncoding.DecodeString(env.Payload)
	var rec struct {
		Type   string `json:"type"`
		Reason string `json:"reason"`
	}
	json.Unmarshal(b, &rec)
	if rec.Type != "run.terminated" || rec.Reason != "refusal_limit" {
		t.Errorf("last record %s reason %q, want run.terminated refusal_limit", rec.Type, rec.Reason)
	}
}

func writeFile(t *testing.T, p, s string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestRunLimitsStrictOrWarned: a memory limit written in the policy is
// enforced where moat can (as root: the run works), and refused where it
// cannot (rootless: exit 125 naming the limit, nothing run); the default
// limits, where they cannot be enforced, give a warning and the run goes
// on (the control).
func TestRunLimitsStrictOrWarned(t *testing.T) {
	e := newEnv(t)
	strict := filepath.Join(e.dir, "strict.yaml")
	writeFile(t, strict, strings.Replace(readFile(t, e.policy("")), "process:\n", "process:\n  limits: {memory: 1Gi}\n", 1))
	r := e.moat("run", "--policy", strict, "--", "/bin/true")
	if os.Geteuid() == 0 {
		if r.code != 0 || strings.Contains(r.stderr, "warning") {
			t.Errorf("as root, a written limit: %s", r)
		}
		return
	}
	if r.code != 125 || !strings.Contains(r.stderr, "process.limits memory 1Gi cannot be enforced here") {
		t.Errorf("rootless, a written limit: got %s, want 125 naming the limit", r)
	}
	r = e.moat("run", "--policy", e.policy(""), "--", "/bin/true")
	if r.code != 0 || !strings.Contains(r.stderr, "warning: the default memory and pids limit is not enforced") {
		t.Errorf("rootless, the default limits: got %s, want the run with a warning", r)
	}
}

// TestRootRunOOMReported: a workload killed for going over its memory
// limit exits 137, moat says it was out of memory, and the journal's
// process.exited says oom_killed; the control, a small allocation under
// the same limit, exits 0 with neither.
func TestRootRunOOMReported(t *testing.T) {
	testenv.NeedRoot(t)
	sw, _ := os.ReadFile("/proc/swaps")
	testenv.Need(t, strings.Count(string(sw), "\n") <= 1, "swap is on: a memory limit without memsw would swap rather than kill")
	_, err := exec.LookPath("python3")
	testenv.Need(t, err == nil, "python3 is not installed")
	e := newEnv(t)
	pol := filepath.Join(e.dir, "oom.yaml")
	writeFile(t, pol, strings.Replace(readFile(t, e.policy("")), "process:\n", "process:\n  limits: {memory: 64Mi}\n", 1))
	for _, tc := range []struct {
		mib  int
		code int
		oom  bool
	}{{8, 0, false}, {512, 137, true}} {
		audit := filepath.Join(e.dir, fmt.Sprintf("audit-%d", tc.mib))
		r := e.moat("run", "--policy", pol, "--audit-dir", audit, "--", "python3", "-c", fmt.Sprintf("b = bytearray(%d << 20); b[::4096] = b'x' * len(b[::4096])", tc.mib))
		if r.code != tc.code || strings.Contains(r.stderr, "out of memory") != tc.oom {
			t.Errorf("%d MiB under 64Mi: %s; want exit %d, oom message %v", tc.mib, r, tc.code, tc.oom)
		}
		runs, _ := filepath.Glob(filepath.Join(audit, "*", "journal.jsonl"))
		if len(runs) != 1 {
			t.Fatalf("journals: %v", runs)
		}
		found := false
		for _, line := range strings.Split(strings.TrimSpace(readFile(t, runs[0])), "\n") {
			var env struct {
				Payload string `json:"payload"`
			}
			json.Unmarshal([]byte(line), &env)
			b, _ := base64.StdEncoding.DecodeString(env.Payload)
			if strings.Contains(string(b), `"type":"process.exited"`) && strings.Contains(string(b), `"oom_killed":true`) {
				found = true
			}
		}
		if found != tc.oom {
			t.Errorf("%d MiB: process.exited oom_killed %v, want %v", tc.mib, found, tc.oom)
		}
	}
}
