//go:build linux

package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// moat hands a kubernetes run to the moat-kubernetes beside it, by exec:
// with no cluster configured, the refusal is the kubernetes backend's own
// (which only moat-kubernetes links), with moat-kubernetes's exit code.
// Control: a copy of moat alone in a directory refuses with exit 125,
// naming the moat-kubernetes it looked for and how to build it; a
// group-writable moat-kubernetes is refused the same way.
func TestRunKubernetesHandOff(t *testing.T) {
	e := newEnv(t)
	bin := moatBin(t)
	if _, err := os.Stat(filepath.Join(filepath.Dir(bin), "moat-kubernetes")); err != nil {
		t.Fatalf("no moat-kubernetes beside %s (scripts/test and moatBin build it there): %v", bin, err)
	}
	// No cluster, whatever the environment says (the k8s phase of CI
	// sets KUBECONFIG): the backend refuses at Prepare.
	t.Setenv("KUBECONFIG", filepath.Join(e.dir, "no-kubeconfig"))
	r := e.moat("run", "--backend", "kubernetes", "--", "/bin/true")
	if r.code != 125 || !strings.Contains(r.stderr, "backend kubernetes could not prepare the sandbox") || strings.Contains(r.stderr, "beside itself") {
		t.Fatalf("with moat-kubernetes: exit %d, stderr %q; want 125 from the kubernetes backend", r.code, r.stderr)
	}

	dir := filepath.Join(e.dir, "lean")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	lean := filepath.Join(dir, "moat")
	copyFile(t, bin, lean, 0o755)
	run := func() (string, int) {
		cmd := exec.Command(lean, "run", "--backend", "kubernetes", "--", "/bin/true")
		cmd.Dir = e.dir
		out, err := cmd.CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
		return string(out), code
	}
	mk := filepath.Join(dir, "moat-kubernetes")
	if out, code := run(); code != 125 || !strings.Contains(out, "there is no "+mk) || !strings.Contains(out, "go build -o "+mk) {
		t.Errorf("alone: exit %d, %q; want 125 naming %s and the go build command", code, out, mk)
	}
	copyFile(t, filepath.Join(filepath.Dir(bin), "moat-kubernetes"), mk, 0o755)
	os.Chmod(mk, 0o775)
	if out, code := run(); code != 125 || !strings.Contains(out, "writable by group or others") {
		t.Errorf("group-writable moat-kubernetes: exit %d, %q; want 125", code, out)
	}
}
