//go:build linux

package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/internal/testenv"
)

type confReport struct {
	Backend string `json:"backend"`
	Results []struct {
		Scenario     string `json:"scenario"`
		Outcome      string `json:"outcome"`
		Reason       string `json:"reason"`
		Unprivileged bool   `json:"unprivileged"`
	} `json:"results"`
}

func conformance(t *testing.T, bin string, args ...string) (confReport, result) {
	t.Helper()
	e := &env{t: t, dir: t.TempDir()}
	cmd := exec.Command(bin, append([]string{"conformance", "run", "-o", "json"}, args...)...)
	cmd.Dir = e.dir
	var so, se strings.Builder
	cmd.Stdout, cmd.Stderr = &so, &se
	cmd.Run()
	r := result{so.String(), se.String(), cmd.ProcessState.ExitCode()}
	var rep confReport
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("conformance -o json: %v\n%s", err, r)
	}
	return rep, r
}

func TestConformanceNative(t *testing.T) {
	needSandbox(t)
	rep, r := conformance(t, moatBin(t), "--backend", "native")
	if len(rep.Results) != 8 {
		t.Fatalf("got %d scenarios, want 8\n%s", len(rep.Results), r)
	}
	for _, res := range rep.Results {
		ok := res.Outcome == "pass"
		if os.Geteuid() != 0 && res.Outcome == "invalid" && res.Unprivileged && strings.Contains(res.Reason, "root") {
			ok = true // a root-only check run unprivileged is invalid, never pass
		}
		if !ok {
			t.Errorf("%s: %s (%s)", res.Scenario, res.Outcome, res.Reason)
		}
	}
	// Invalid only for want of root is not a failure: a healthy host
	// exits 0 as root and unprivileged alike.
	if r.code != 0 {
		t.Errorf("exit %d, want 0 (uid %d)\n%s", r.code, os.Geteuid(), r.stderr)
	}
}

func TestRootConformanceGVisor(t *testing.T) {
	testenv.NeedRoot(t)
	_, err := exec.LookPath("runsc")
	testenv.Need(t, err == nil, "runsc is not installed")
	rep, r := conformance(t, moatBin(t), "--backend", "gvisor")
	for _, res := range rep.Results {
		if res.Outcome != "pass" && res.Outcome != "unavailable" {
			t.Errorf("%s: %s (%s)", res.Scenario, res.Outcome, res.Reason)
		}
		if res.Scenario == "attribution" && res.Outcome != "unavailable" {
			t.Errorf("attribution on gvisor: got %s, want unavailable (endpoint-only)", res.Outcome)
		}
	}
	if r.code != 0 {
		t.Errorf("exit %d, want 0\n%s", r.code, r.stderr)
	}
}

// lyingBin is moat built with the test-only lying backend.
func lyingBin(t *testing.T) string { return taggedBin(t, "MOAT_LYING_BIN", "moat_lying_backend") }

// taggedBin is moat built with a test-only build tag: the binary named by
// $env (scripts/test builds it), else built here.
func taggedBin(t *testing.T, env, tag string) string {
	if p := os.Getenv(env); p != "" {
		return p
	}
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	out := filepath.Join(dir, "moat-"+tag)
	cmd := exec.Command("go", "build", "-tags", tag, "-o", out, "github.com/moat-sandbox/moat/cmd/moat")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building moat with -tags %s (set %s): %v\n%s", tag, env, err, b)
	}
	return out
}

// A backend that claims every property and confines only moat's own
// measurement is caught on filesystem, egress and privilege, each for the
// right reason.
func TestConformanceCatchesLyingBackend(t *testing.T) {
	needSandbox(t)
	rep, r := conformance(t, lyingBin(t), "--backend", "lying",
		"--scenario", "filesystem-confinement", "--scenario", "egress-confinement", "--scenario", "privilege-floor",
		"--scenario", "setid-and-sockets")
	if r.code == 0 {
		t.Errorf("conformance passed a lying backend\n%s", r)
	}
	want := map[string]string{
		"filesystem-confinement": "outside the grants",
		"egress-confinement":     "from inside the sandbox",
		"privilege-floor":        "user namespace",
		"setid-and-sockets":      "chmod=",
	}
	for _, res := range rep.Results {
		if res.Outcome != "fail" || !strings.HasPrefix(res.Reason, "violation succeeded") {
			t.Errorf("%s: got %s (%s), want fail because a violation succeeded", res.Scenario, res.Outcome, res.Reason)
			continue
		}
		if !strings.Contains(res.Reason, want[res.Scenario]) {
			t.Errorf("%s: reason %q does not name the violation (%q)", res.Scenario, res.Reason, want[res.Scenario])
		}
	}
	if len(rep.Results) != 4 {
		t.Errorf("got %d results, want 4", len(rep.Results))
	}
}
