package conformance

import (
	"os"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/policy"
)

// The harness's policy for the kubernetes backend loads as a policy, with
// the cluster's section as given, hostPath grants, and without the host's
// system directories as grants (the image's root serves them; a hostPath
// /usr would hide the image's moat). Control: for another backend the
// same harness grants them and has no kubernetes section.
func TestHarnessKubernetesPolicy(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	kc := t.TempDir() + "/kubeconfig"
	os.WriteFile(kc, []byte("apiVersion: v1\nkind: Config\n"), 0o600)
	k := &Kubernetes{Kubeconfig: kc, Image: "moat.local/moat:1", Namespace: "moat-conf", RuntimeClass: "gvisor", BrokerAddress: "192.0.2.2"}
	for _, backend := range []string{"kubernetes", "native"} {
		h, err := newHarness(self, backend, k)
		if err != nil {
			t.Fatal(err)
		}
		p, err := h.policyFile()
		if err != nil {
			t.Fatal(err)
		}
		pol, err := policy.Load(p)
		h.close()
		if err != nil {
			t.Fatalf("%s: %v", backend, err)
		}
		hasUsr := false
		for _, g := range pol.Filesystem.ReadOnly {
			hasUsr = hasUsr || g == "/usr"
		}
		got := pol.Kubernetes
		if backend == "kubernetes" {
			if hasUsr || got.Image != k.Image || got.Kubeconfig != kc || got.Namespace != "moat-conf" || !got.HostPathGrants || got.BrokerAddress != "192.0.2.2" || got.RuntimeClassName != "gvisor" {
				t.Errorf("kubernetes: read_only %v, section %+v", pol.Filesystem.ReadOnly, got)
			}
		} else if !hasUsr || got.Image != "" || strings.Contains(got.Kubeconfig, "kubeconfig") {
			t.Errorf("%s: read_only %v, section %+v", backend, pol.Filesystem.ReadOnly, got)
		}
	}
}
