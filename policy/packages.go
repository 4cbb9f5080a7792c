package policy

import (
	"encoding/hex"
	"fmt"
	"os"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/moat-sandbox/moat/internal/fsutil"
)

// PackageGrant is one egress.packages entry: a package registry the
// workload's package manager reaches through the broker, which serves only
// the artifacts the grant's lockfiles pin (by name, version and digest):
//
//	egress:
//	  packages:
//	    - kind: npm                              # http://127.0.0.1:<port>/pkg/npm/
//	      upstream: https://registry.npmjs.org   # the default for npm
//	      lockfiles: [package-lock.json]         # read once, when the sandbox starts
//	      lockfile_trust: pinned                 # pinned (default) | workspace
//	      lockfile_sha256: {package-lock.json: "<hex>"}
//	      ca_file: mirror-ca.pem                 # optional: roots for a private mirror
//	    - kind: goproxy                          # GOPROXY=http://127.0.0.1:<port>/pkg/goproxy
//	      lockfiles: [go.sum]                    # upstream https://proxy.golang.org by default
//	    - kind: pypi                             # PIP_INDEX_URL=http://127.0.0.1:<port>/pkg/pypi/simple/
//	      lockfiles: [requirements.txt, uv.lock] # hashed requirements, or a file named uv.lock
//
// Lockfile trust: a lockfile inside a read_write grant is written by the
// workload, so one run could widen what the next admits. Such a lockfile
// is accepted only when lockfile_sha256 pins its digest (checked when the
// sandbox starts) or lockfile_trust is "workspace", which moat announces
// at start: the workload then controls what is admitted.
type PackageGrant struct {
	Kind      string   `yaml:"kind" json:"kind"`
	Upstream  string   `yaml:"upstream" json:"upstream"` // https, no trailing slash
	Lockfiles []string `yaml:"lockfiles" json:"lockfiles"`
	// LockfileTrust is TrustPinned or TrustWorkspace.
	LockfileTrust string `yaml:"lockfile_trust" json:"lockfile_trust"`
	// LockfileSHA256 maps a lockfile (absolute, as in Lockfiles) to the
	// lower-case hex sha256 its bytes must have when the sandbox starts.
	LockfileSHA256 map[string]string `yaml:"lockfile_sha256,omitempty" json:"lockfile_sha256,omitempty"`
	MaxRequests    int               `yaml:"max_requests" json:"max_requests"`
	// CAFile adds PEM certificates to the system's roots for the upstream
	// (a private mirror); empty: the system's roots only.
	CAFile string `yaml:"ca_file,omitempty" json:"ca_file,omitempty"`
	// FilesUpstream (pypi only) is where the index's file links may
	// point besides upstream itself (https; default
	// https://files.pythonhosted.org when upstream is the default).
	FilesUpstream string `yaml:"files_upstream,omitempty" json:"files_upstream,omitempty"`
}

// Package kinds, trust modes and limits.
const (
	PackageNPM              = "npm"
	PackageGoProxy          = "goproxy"
	PackagePyPI             = "pypi"
	TrustPinned             = "pinned"
	TrustWorkspace          = "workspace"
	DefaultNPMUpstream      = "https://registry.npmjs.org"
	DefaultGoProxyUpstream  = "https://proxy.golang.org"
	DefaultPyPIUpstream     = "https://pypi.org"
	DefaultPyPIFiles        = "https://files.pythonhosted.org"
	DefaultPackageRequests  = 4096
	MaxPackageGrants        = 8
	MaxLockfilesPerGrant    = 16
	MaxPackageRequestsLimit = 1 << 20
)

// PackageKinds are the registry kinds moat serves.
var PackageKinds = []string{PackageNPM, PackageGoProxy, PackagePyPI}

// defaultUpstreams are the upstreams of the kinds that have one.
var defaultUpstreams = map[string]string{PackageNPM: DefaultNPMUpstream, PackageGoProxy: DefaultGoProxyUpstream, PackagePyPI: DefaultPyPIUpstream}

var packageKeys = []string{"kind", "upstream", "lockfiles", "lockfile_trust", "lockfile_sha256", "max_requests", "ca_file", "files_upstream"}

// PinnedDigest returns the sha256 the policy pins for lockfile, if any.
func (g *PackageGrant) PinnedDigest(lockfile string) (string, bool) {
	s, ok := g.LockfileSHA256[lockfile]
	return s, ok
}

func (d *decoder) packages(n *yaml.Node, path string) []PackageGrant {
	var out []PackageGrant
	kinds := map[string]string{}
	for i, item := range d.seq(n, path, MaxPackageGrants) {
		ip := fmt.Sprintf("%s[%d]", path, i)
		g, ok := d.packageGrant(item, ip)
		if !ok {
			continue
		}
		if prev, dup := kinds[g.Kind]; dup {
			d.add(item, CodeDuplicate, ip+".kind", "kind %s is already granted by %s; list every lockfile of that registry in one grant", g.Kind, prev)
			continue
		}
		kinds[g.Kind] = ip
		out = append(out, g)
	}
	return out
}

func (d *decoder) packageGrant(n *yaml.Node, ip string) (PackageGrant, bool) {
	g := PackageGrant{LockfileTrust: TrustPinned, MaxRequests: DefaultPackageRequests}
	nprobs := len(d.probs)
	f := d.mapping(n, ip, packageKeys...)
	if n.Kind != yaml.MappingNode {
		return g, false
	}
	if v := f["kind"]; v != nil {
		if k, ok := d.str(v, ip+".kind"); ok {
			if !slices.Contains(PackageKinds, k) {
				d.add(v, CodeBadValue, ip+".kind", "kind %q is not one moat serves; kinds: %s", k, strings.Join(PackageKinds, ", "))
			}
			g.Kind = k
		}
	} else {
		d.add(n, CodeMissing, ip+".kind", "missing; name the registry kind: %s", strings.Join(PackageKinds, ", "))
	}
	if v := f["upstream"]; v != nil {
		if u, ok := d.str(v, ip+".upstream"); ok {
			if msg := checkServiceURL(u); msg != "" {
				d.add(v, CodeURL, ip+".upstream", "%s", strings.Replace(msg, "base_url", "upstream", 1))
			}
			g.Upstream = strings.TrimSuffix(u, "/")
		}
	} else {
		g.Upstream = defaultUpstreams[g.Kind]
	}
	if v := f["lockfiles"]; v != nil {
		items := d.seq(v, ip+".lockfiles", MaxLockfilesPerGrant)
		if len(items) == 0 && v.Kind == yaml.SequenceNode {
			d.add(v, CodeMissing, ip+".lockfiles", "empty; list the lockfiles whose pins the broker serves, e.g. [package-lock.json]")
		}
		for i, item := range items {
			lp := fmt.Sprintf("%s.lockfiles[%d]", ip, i)
			p, ok := d.path(item, lp)
			if !ok {
				continue
			}
			if slices.Contains(g.Lockfiles, p) {
				d.add(item, CodeDuplicate, lp, "%s is listed twice", p)
				continue
			}
			if st, err := os.Lstat(p); err != nil {
				d.add(item, CodeNotFound, lp, "%s: %s", p, errText(err))
			} else if st.Mode()&os.ModeSymlink != 0 {
				d.add(item, CodeSymlink, lp, "%s is a symlink; moat opens lockfiles without following symlinks: name the file itself", p)
			} else if !st.Mode().IsRegular() {
				d.add(item, CodeBadType, lp, "%s is not a regular file", p)
			}
			g.Lockfiles = append(g.Lockfiles, p)
		}
	} else {
		d.add(n, CodeMissing, ip+".lockfiles", "missing; list the lockfiles whose pins the broker serves, e.g. [package-lock.json]")
	}
	if v := f["lockfile_trust"]; v != nil {
		if t, ok := d.str(v, ip+".lockfile_trust"); ok {
			if t != TrustPinned && t != TrustWorkspace {
				d.add(v, CodeBadValue, ip+".lockfile_trust", "%q is not pinned or workspace", t)
			}
			g.LockfileTrust = t
		}
	}
	if v := f["lockfile_sha256"]; v != nil {
		g.LockfileSHA256 = d.lockfileDigests(v, ip+".lockfile_sha256", g.Lockfiles)
	}
	if v := f["max_requests"]; v != nil {
		if x, ok := d.limit(v, ip+".max_requests", 0, MaxPackageRequestsLimit); ok {
			g.MaxRequests = x
		}
	}
	if v := f["files_upstream"]; v != nil {
		if u, ok := d.str(v, ip+".files_upstream"); ok {
			if g.Kind != PackagePyPI {
				d.add(v, CodeBadValue, ip+".files_upstream", "files_upstream is for kind pypi only")
			} else if msg := checkServiceURL(u); msg != "" {
				d.add(v, CodeURL, ip+".files_upstream", "%s", strings.Replace(msg, "base_url", "files_upstream", 1))
			}
			g.FilesUpstream = strings.TrimSuffix(u, "/")
		}
	} else if g.Kind == PackagePyPI && g.Upstream == DefaultPyPIUpstream {
		g.FilesUpstream = DefaultPyPIFiles
	}
	if v := f["ca_file"]; v != nil {
		if p, ok := d.path(v, ip+".ca_file"); ok {
			g.CAFile = p
			if st, err := os.Stat(p); err != nil {
				d.add(v, CodeNotFound, ip+".ca_file", "%s: %s", p, errText(err))
			} else if !st.Mode().IsRegular() {
				d.add(v, CodeBadValue, ip+".ca_file", "%s is not a regular file", p)
			}
		}
	}
	return g, len(d.probs) == nprobs
}

// lockfileDigests decodes {lockfile: sha256 hex}; each key must resolve to
// one of the grant's lockfiles.
func (d *decoder) lockfileDigests(n *yaml.Node, path string, lockfiles []string) map[string]string {
	if !d.kind(n, path, yaml.MappingNode, "a mapping of lockfile to sha256") {
		return nil
	}
	out := map[string]string{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		kn, vn := n.Content[i], n.Content[i+1]
		kp := path + "." + kn.Value
		p, ok := d.path(kn, kp)
		if !ok {
			continue
		}
		if !slices.Contains(lockfiles, p) {
			d.add(kn, CodeBadValue, kp, "%s is not one of this grant's lockfiles", p)
			continue
		}
		s, ok := d.str(vn, kp)
		if !ok {
			continue
		}
		if b, err := hex.DecodeString(s); err != nil || len(b) != 32 || strings.ToLower(s) != s {
			d.add(vn, CodeBadValue, kp, "%q is not a sha256 in lower-case hex (64 characters; sha256sum prints it)", s)
			continue
		}
		if _, dup := out[p]; dup {
			d.add(kn, CodeDuplicate, kp, "%s is pinned twice", p)
			continue
		}
		out[p] = s
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// validatePackages applies the lockfile trust rule: a lockfile inside a
// read_write grant (as written or after resolving symlinks) needs its
// sha256 pinned, or lockfile_trust: workspace.
func (d *decoder) validatePackages(p *Policy) {
	for i, g := range p.Egress.Packages {
		for j, lf := range g.Lockfiles {
			if msg := p.LockfileUntrusted(i, lf); msg != "" {
				key := fmt.Sprintf("egress.packages[%d].lockfiles[%d]", i, j)
				d.add(d.nodes[key], CodeBadValue, key, "%s", msg)
			}
		}
	}
}

// LockfileUntrusted applies the lockfile trust rule to lockfile of the
// grant egress.packages[grant]: "" when it is trusted (lockfile_trust
// workspace, its sha256 pinned in lockfile_sha256, which the caller
// checks against the bytes it reads, or outside every read_write grant,
// as written and after resolving symlinks), else why not. The policy
// check applies it when the policy is loaded; the sandbox again each
// time it reads the lockfiles (at start, and on an operator's reload).
func (p *Policy) LockfileUntrusted(grant int, lockfile string) string {
	if grant < 0 || grant >= len(p.Egress.Packages) {
		return fmt.Sprintf("egress.packages[%d] does not exist", grant)
	}
	g := &p.Egress.Packages[grant]
	if !slices.Contains(g.Lockfiles, lockfile) {
		return fmt.Sprintf("%s is not a lockfile of egress.packages[%d]", lockfile, grant)
	}
	if g.LockfileTrust == TrustWorkspace {
		return ""
	}
	if _, ok := g.LockfileSHA256[lockfile]; ok {
		return ""
	}
	for k, rw := range p.Filesystem.ReadWrite {
		if fsutil.Within(lockfile, rw) || fsutil.Within(realPrefix(lockfile), realPrefix(rw)) {
			return fmt.Sprintf("lockfile %s lies inside the writable grant filesystem.read_write[%d] (%s): the workload could widen what a later run admits; pin its digest in lockfile_sha256 (sha256sum %s), or set lockfile_trust: workspace to let the workload control what is admitted",
				lockfile, k, rw, lockfile)
		}
	}
	return ""
}

// explainPackages is moat policy check's line per package grant.
func (e *Egress) explainPackages() []string {
	var out []string
	for _, g := range e.Packages {
		trust := "each lockfile outside every read_write grant or pinned by sha256"
		if g.LockfileTrust == TrustWorkspace {
			trust = "lockfile_trust workspace: the workload controls what is admitted"
		}
		out = append(out, fmt.Sprintf("egress.packages %s: GET at /pkg/%s/ of only the names, versions and digests pinned by %s (read once at start, again only on moat sandbox reload-lockfiles; no symlinks; %s), fetched from %s over TLS; publish and other methods refused; at most %d requests",
			g.Kind, g.Kind, strings.Join(g.Lockfiles, ", "), trust, g.Upstream, g.MaxRequests))
	}
	return out
}
