package conformance

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// --backend kubernetes is refused before any scenario when the policy's
// kubernetes section cannot be written: no image, no kubeconfig, or a
// kubeconfig that does not exist. Control: with both, the check passes
// and makes the kubeconfig's path absolute.
func TestCheckKubernetes(t *testing.T) {
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kc, []byte("apiVersion: v1\nkind: Config\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		k    *Kubernetes
		want string
	}{
		{"no section", nil, "--k8s-image"},
		{"no image", &Kubernetes{Kubeconfig: kc}, "MOAT_K8S_IMAGE"},
		{"no kubeconfig", &Kubernetes{Image: "moat.local/moat:1"}, "--kubeconfig"},
		{"missing kubeconfig", &Kubernetes{Image: "moat.local/moat:1", Kubeconfig: kc + ".absent"}, kc + ".absent"},
	} {
		err := checkKubernetes(c.k)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error naming %q", c.name, err, c.want)
		}
		// Run refuses the same way, before any scenario.
		if _, err := Run(context.Background(), Options{Backend: "kubernetes", Binary: "/nonexistent", Kubernetes: c.k}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Run: %v, want an error naming %q", c.name, err, c.want)
		}
	}
	wd, _ := os.Getwd()
	rel, err := filepath.Rel(wd, kc)
	if err != nil {
		t.Fatal(err)
	}
	k := &Kubernetes{Image: "moat.local/moat:1", Kubeconfig: rel}
	if err := checkKubernetes(k); err != nil || k.Kubeconfig != kc {
		t.Errorf("control: %v, kubeconfig %q, want nil and %q", err, k.Kubeconfig, kc)
	}
}
