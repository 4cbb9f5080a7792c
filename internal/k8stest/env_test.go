package k8stest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FromEnv is what decides between "run against the cluster" and "skip" (a
// failure under MOAT_REQUIRE_ALL=1): it must name what is missing.
func TestFromEnv(t *testing.T) {
	kc := filepath.Join(t.TempDir(), "admin.kubeconfig")
	if err := os.WriteFile(kc, []byte("apiVersion: v1\nkind: Config\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"MOAT_K8S_RUNTIMECLASS", "MOAT_K8S_NODE", "MOAT_K8S_BUSYBOX_IMAGE", "MOAT_K8S_CLUSTER", "MOAT_K8S_KUBECTL"} {
		t.Setenv(v, "")
	}
	cases := []struct {
		name, kubeconfig, image, wantErr string
	}{
		{"nothing", "", "", "KUBECONFIG and MOAT_K8S_IMAGE unset"},
		{"no image", kc, "", "MOAT_K8S_IMAGE unset"},
		{"no kubeconfig", "", "moat.local/moat:x", "KUBECONFIG unset"},
		{"unreadable kubeconfig", filepath.Join(t.TempDir(), "missing"), "moat.local/moat:x", "no such file"},
		{"complete", kc, "moat.local/moat:x", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("KUBECONFIG", tc.kubeconfig)
			t.Setenv("MOAT_K8S_IMAGE", tc.image)
			c, err := FromEnv()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("FromEnv() error = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Kubeconfig != kc || c.Image != "moat.local/moat:x" {
				t.Errorf("cluster = %+v", c)
			}
			if c.RuntimeClass != "gvisor" || c.Kubectl != "kubectl" {
				t.Errorf("defaults: RuntimeClass %q, Kubectl %q; want gvisor, kubectl", c.RuntimeClass, c.Kubectl)
			}
		})
	}
}
