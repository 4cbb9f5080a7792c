package kubernetes

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/moat-sandbox/moat/internal/fsutil"
	"github.com/moat-sandbox/moat/policy"
)

// checkCredentialFiles refuses a policy whose cluster credentials the
// workload could write. With host_path_grants, a read_write grant is the
// host's directory itself; a kubeconfig there, or a file it names (an
// exec credential plugin's command above all, also certificates, keys,
// token files), would be what the workload wrote by the time moat reads
// it again: the watchdog loads the kubeconfig afresh when the supervisor
// dies, the next run does, and client-go runs an exec plugin on this host
// outside any sandbox. Without host_path_grants the grants are emptyDir
// volumes and the workload writes nothing of the host.
func checkCredentialFiles(pol *policy.Policy) error {
	k := pol.Kubernetes
	if !k.HostPathGrants || k.InCluster || len(pol.Filesystem.ReadWrite) == 0 {
		return nil
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	files := rules.GetLoadingPrecedence()
	if k.Kubeconfig != "" {
		rules.ExplicitPath = k.Kubeconfig
		files = []string{k.Kubeconfig}
	}
	type named struct{ what, path string }
	var check []named
	for _, f := range files {
		check = append(check, named{"the kubeconfig", f})
	}
	cfg, err := rules.Load()
	if err != nil {
		return fmt.Errorf("kubernetes: loading the kubeconfig to check its files: %w", err)
	}
	for name, c := range cfg.Clusters {
		check = append(check, named{"cluster " + name + "'s certificate-authority", c.CertificateAuthority})
	}
	for name, a := range cfg.AuthInfos {
		check = append(check,
			named{"user " + name + "'s client-certificate", a.ClientCertificate},
			named{"user " + name + "'s client-key", a.ClientKey},
			named{"user " + name + "'s tokenFile", a.TokenFile})
		if a.Exec != nil && a.Exec.Command != "" {
			cmd := a.Exec.Command
			if !strings.Contains(cmd, "/") {
				if p, err := exec.LookPath(cmd); err == nil {
					cmd = p
				}
			}
			check = append(check, named{"user " + name + "'s exec credential plugin", cmd})
		}
		if a.AuthProvider != nil {
			return fmt.Errorf("kubernetes: user %s has an auth-provider; with host_path_grants moat accepts only credentials whose files it can check", name)
		}
	}
	for _, c := range check {
		if c.path == "" {
			continue
		}
		for _, p := range resolved(c.path) {
			for _, g := range pol.Filesystem.ReadWrite {
				for _, gp := range resolved(g) {
					if fsutil.Within(p, gp) {
						return fmt.Errorf("kubernetes: %s %s lies in the read_write grant %s, which the workload writes on this host (host_path_grants): moat's watchdog and the next run would read%s what the workload wrote; keep the cluster credentials outside the grants", c.what, c.path, g,
							map[bool]string{true: " and run", false: ""}[strings.Contains(c.what, "exec")])
					}
				}
			}
		}
	}
	return nil
}

// resolved is p made absolute and, when it exists, with its symlinks
// resolved too.
func resolved(p string) []string {
	a, err := filepath.Abs(p)
	if err != nil {
		return []string{p}
	}
	out := []string{a}
	if r, err := filepath.EvalSymlinks(a); err == nil && r != a {
		out = append(out, r)
	}
	return out
}
