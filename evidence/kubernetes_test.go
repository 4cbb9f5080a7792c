package evidence

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/internal/kubeapi/kubeopt"
	"github.com/moat-sandbox/moat/policy"
)

// --backend kubernetes is refused before any case without an image or a
// readable kubeconfig, naming what is missing; nothing is written.
// Control: with both, CheckKubernetes accepts and makes the path absolute.
func TestKubernetesRefusals(t *testing.T) {
	bin, probeBin := fakeBinaries(t)
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	writeFile(t, kc, []byte("apiVersion: v1\nkind: Config\n"))
	for _, c := range []struct {
		name string
		k    *Kubernetes
		want string
	}{
		{"no section", nil, "--k8s-image"},
		{"no image", &Kubernetes{Kubeconfig: kc}, "MOAT_K8S_IMAGE"},
		{"no kubeconfig", &Kubernetes{Image: "moat.local/moat:1"}, "--kubeconfig"},
		{"kubeconfig missing", &Kubernetes{Image: "moat.local/moat:1", Kubeconfig: kc + ".absent"}, kc + ".absent"},
	} {
		out := filepath.Join(t.TempDir(), "o")
		_, err := Run(context.Background(), Options{Out: out, Binary: bin, Probe: probeBin, Backend: "kubernetes", Kubernetes: c.k})
		var he *HarnessError
		if !errors.As(err, &he) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want a harness error naming %q", c.name, err, c.want)
		}
		if _, err := os.Stat(out); err == nil {
			t.Errorf("%s: the bundle directory was made", c.name)
		}
	}
	wd, _ := os.Getwd()
	rel, _ := filepath.Rel(wd, kc)
	k := &Kubernetes{Image: "moat.local/moat:1", Kubeconfig: rel}
	if err := CheckKubernetes(k); err != nil || k.Kubeconfig != kc {
		t.Errorf("control: %v, %q", err, k.Kubeconfig)
	}
}

// A case policy for the kubernetes backend loads, with the cluster's
// section, hostPath grants and no host system directories (the image's
// root serves them); for another backend the same case policy grants
// them and has no kubernetes section.
func TestKubernetesCasePolicy(t *testing.T) {
	dir := t.TempDir()
	kc := filepath.Join(dir, "kubeconfig")
	writeFile(t, kc, []byte("apiVersion: v1\nkind: Config\n"))
	k := &Kubernetes{Kubeconfig: kc, Image: "moat.local/moat:1", Namespace: "ev", RuntimeClass: "gvisor"}
	c, _ := CaseByName("direct-network")
	for _, kube := range []bool{true, false} {
		s := &suite{Options: Options{Kubernetes: k}, binDir: filepath.Join(dir, "bin")}
		if kube {
			s.kube = struct{ kubeopt.Cluster }{} // the policy only asks whether there is one
		}
		prov := &Provider{}
		if err := prov.Start(filepath.Join(dir, "events"), t.TempDir()); err != nil {
			t.Fatal(err)
		}
		defer prov.Close()
		r := &caseRun{s: s, c: c, workspace: filepath.Join(dir, "ws"), auditDir: filepath.Join(dir, "audit"), prov: prov}
		for _, d := range []string{s.binDir, r.workspace} {
			os.MkdirAll(d, 0o755)
		}
		p := filepath.Join(dir, "policy.yaml")
		writeFile(t, p, r.policy())
		pol, err := policy.Load(p)
		if err != nil {
			t.Fatalf("kube=%v: %v\n%s", kube, err, r.policy())
		}
		hasUsr := false
		for _, g := range pol.Filesystem.ReadOnly {
			hasUsr = hasUsr || g == "/usr"
		}
		got := pol.Kubernetes
		if kube && (hasUsr || got.Image != k.Image || got.Kubeconfig != kc || got.Namespace != "ev" || !got.HostPathGrants) {
			t.Errorf("kubernetes: read_only %v, section %+v", pol.Filesystem.ReadOnly, got)
		}
		if !kube && (!hasUsr || got.Image != "") {
			t.Errorf("native: read_only %v, section %+v", pol.Filesystem.ReadOnly, got)
		}
	}
}
