package cli_test

import (
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/internal/cli"
	"github.com/moat-sandbox/moat/internal/cli/k8sext"
	"github.com/moat-sandbox/moat/internal/reexec"
)

// TestHiddenListed: every hidden helper name that the module's code
// spells is listed once, in hidden (the lean moat's) or in k8sext.Helpers
// (moat-kubernetes's), and nothing else is listed. Every kubernetes
// helper's name starts with the prefix by which the lean moat hands it to
// moat-kubernetes, and no lean helper's does.
func TestHiddenListed(t *testing.T) {
	found := cli.ModuleHelperNames(t)
	all := append(append([]reexec.Helper{}, cli.Hidden...), k8sext.Helpers...)
	if err := reexec.Check(all); err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, h := range all {
		listed[h.Name] = true
		if found[h.Name] == "" {
			t.Errorf("%s is listed but spelled nowhere in the module", h.Name)
		}
	}
	for name, where := range found {
		if !listed[name] {
			t.Errorf("%s (%s) is listed neither in hidden.go nor in k8sext.Helpers", name, where)
		}
	}
	for _, h := range k8sext.Helpers {
		if !strings.HasPrefix(h.Name, cli.KubernetesHelperPrefix) {
			t.Errorf("kubernetes helper %s does not start with %q: the lean moat would not hand it off", h.Name, cli.KubernetesHelperPrefix)
		}
	}
	for _, h := range cli.Hidden {
		if strings.HasPrefix(h.Name, cli.KubernetesHelperPrefix) {
			t.Errorf("lean helper %s starts with %q", h.Name, cli.KubernetesHelperPrefix)
		}
	}
}
