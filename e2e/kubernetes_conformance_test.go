//go:build linux

package e2e

import (
	"strings"
	"testing"

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
