//go:build linux

package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/evidence"
	"github.com/moat-sandbox/moat/internal/k8stest"
)

// TestKubernetesConformance: `moat conformance run --backend kubernetes`
// against the real test cluster (internal/k8stest). Every scenario
// passes except attribution, which is unavailable as the backend declares
// (the broker sees the Pod's IP, never a process), and the run exits 0.
// The cluster comes from the environment as the CLI reads it (KUBECONFIG,
// MOAT_K8S_IMAGE) and the namespace from --k8s-namespace; nothing the
// scenarios made is left in it.
func TestKubernetesConformance(t *testing.T) {
	c := k8stest.Need(t)
	ns := c.Namespace(t, "moat-k8s-conf")
	rep, r := conformance(t, moatBin(t), "--backend", "kubernetes", "--k8s-namespace", ns, "--k8s-runtime-class", c.RuntimeClass)
	if rep.Backend != "kubernetes" || len(rep.Results) != 8 {
		t.Fatalf("backend %q, %d scenarios, want kubernetes and 8\n%s", rep.Backend, len(rep.Results), r)
	}
	for _, res := range rep.Results {
		want := "pass"
		if res.Scenario == "attribution" {
			want = "unavailable"
			if !strings.Contains(res.Reason, "declares attribution unavailable") || !strings.Contains(res.Reason, "Pod") {
				t.Errorf("attribution: the reason does not give the backend's declaration: %s", res.Reason)
			}
		}
		if res.Outcome != want {
			t.Errorf("%s: %s, want %s (%s)", res.Scenario, res.Outcome, want, res.Reason)
		}
	}
	if r.code != 0 {
		t.Errorf("exit %d, want 0\n%s", r.code, r.stderr)
	}
	noneLeft(t, c, ns)
}

// TestKubernetesConformanceNeedsCluster: without an image the kubernetes
// backend's policy cannot be written, and the suite refuses at once
// (exit 125) naming the flag and the variable, before any scenario.
func TestKubernetesConformanceNeedsCluster(t *testing.T) {
	e := &env{t: t, dir: t.TempDir()}
	cmd := e.command("conformance", "run", "--backend", "kubernetes", "--kubeconfig", "/nonexistent/kubeconfig", "--k8s-image", "")
	var so, se strings.Builder
	cmd.Stdout, cmd.Stderr = &so, &se
	cmd.Run()
	if code := cmd.ProcessState.ExitCode(); code != 125 || !strings.Contains(se.String(), "--k8s-image") || !strings.Contains(se.String(), "MOAT_K8S_IMAGE") {
		t.Errorf("no image: exit %d, want 125 naming --k8s-image and MOAT_K8S_IMAGE: %s", code, se.String())
	}
	if strings.Contains(se.String(), "[ 1/") {
		t.Errorf("a scenario ran: %s", se.String())
	}
	// Control: with an image but an unreadable kubeconfig the refusal
	// names the kubeconfig instead (the check reads the flags).
	cmd = e.command("conformance", "run", "--backend", "kubernetes", "--kubeconfig", "/nonexistent/kubeconfig", "--k8s-image", "moat.local/moat:1")
	se.Reset()
	cmd.Stderr = &se
	cmd.Run()
	if code := cmd.ProcessState.ExitCode(); code != 125 || !strings.Contains(se.String(), "/nonexistent/kubeconfig") {
		t.Errorf("bad kubeconfig: exit %d, want 125 naming it: %s", code, se.String())
	}
}

// TestKubernetesEvidence: `moat evidence run --backend kubernetes` against
// the real test cluster. Every case passes except those on the fixed
// not-applicable list for kubernetes, each reported with the list's
// reason; the bundle verifies complete against its pinned manifest, and
// the same bundle claiming another backend does not (the list is the
// verifier's, not the bundle's). Nothing the cases made is left in the
// namespace.
func TestKubernetesEvidence(t *testing.T) {
	c := k8stest.Need(t)
	ns := c.Namespace(t, "moat-k8s-ev")
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	probeBin := filepath.Join(dir, "moat-probe")
	build := exec.Command("go", "build", "-trimpath", "-o", probeBin, "github.com/moat-sandbox/moat/cmd/moat-probe")
	build.Env = append(os.Environ(), "CGO_ENABLED=0") // it runs in the Pod's image, which has no libc
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building moat-probe: %v\n%s", err, out)
	}
	out := filepath.Join(dir, "bundle")
	e := &env{t: t, dir: dir, stateDir: filepath.Join(dir, "state")}
	r := e.moat("evidence", "run", "--backend", "kubernetes", "--k8s-namespace", ns, "--k8s-runtime-class", c.RuntimeClass,
		"--probe", probeBin, "--out", out, "-o", "json")
	var res struct {
		Summary struct {
			Pass, Fail, Invalid, Insufficient int
			NotApplicable                     int `json:"not_applicable"`
		} `json:"summary"`
		ManifestSHA256 string `json:"manifest_sha256"`
		ExitCode       int    `json:"exit_code"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Fatalf("evidence run -o json: %v\n%s", err, r)
	}
	var rep evidence.Report
	if err := json.Unmarshal([]byte(readFile(t, filepath.Join(out, evidence.FileReport))), &rep); err != nil {
		t.Fatal(err)
	}
	na := 0
	for _, cr := range rep.Cases {
		why, listed := evidence.NotApplicable("kubernetes", cr.Name)
		switch {
		case listed:
			na++
			if cr.Outcome != evidence.OutcomeNotApplicable || len(cr.Reasons) != 1 || !strings.HasSuffix(cr.Reasons[0], why) {
				t.Errorf("%s: %s %v, want not-applicable with the list's reason", cr.Name, cr.Outcome, cr.Reasons)
			}
		case cr.Outcome != evidence.OutcomePass:
			t.Errorf("%s: %s: %v", cr.Name, cr.Outcome, cr.Reasons)
			for _, f := range []string{"moat.err", "later-runs.out"} {
				if b, err := os.ReadFile(filepath.Join(out, evidence.CasesDir, cr.Name, f)); err == nil {
					t.Logf("%s: %s:\n%s", cr.Name, f, b)
				}
			}
		}
	}
	if r.code != 0 || res.ExitCode != 0 || len(rep.Cases) != len(evidence.Cases) || na == 0 || res.Summary.NotApplicable != na ||
		res.Summary.Pass != len(evidence.Cases)-na || rep.Backend != "kubernetes" {
		t.Errorf("exit %d, summary %+v, %d cases (%d not applicable), backend %q\n%s", r.code, res.Summary, len(rep.Cases), na, rep.Backend, r.stderr)
	}
	if v := e.moat("evidence", "verify", out, "--manifest-sha256", res.ManifestSHA256); v.code != 0 || !strings.Contains(v.stdout, "valid and complete") {
		t.Errorf("verify: %s", v)
	}
	// The same bundle, re-signed as a native one: the not-applicable
	// cases are refused there.
	forged := filepath.Join(t.TempDir(), "bundle")
	if err := os.CopyFS(forged, os.DirFS(out)); err != nil {
		t.Fatal(err)
	}
	if err := evidence.ResignReport(forged, func(r *evidence.Report) { r.Backend = "native" }); err != nil {
		t.Fatal(err)
	}
	if v := evidence.VerifyBundlePinned(forged, evidence.Pins{}); v.ExitCode() != 1 {
		t.Errorf("the bundle re-signed as native verifies: exit %d %v", v.ExitCode(), v.Problems)
	}
	noneLeft(t, c, ns)
}
