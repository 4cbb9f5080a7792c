package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func writeLockfile(t *testing.T, path string) string {
	t.Helper()
	b := []byte(`{"lockfileVersion": 3, "packages": {}}`)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func TestPackagesDecode(t *testing.T) {
	f := newFixture(t)
	outside := filepath.Join(f.data, "package-lock.json")
	writeLockfile(t, outside)
	p, pe := f.parse(t, "version: 1\negress: {packages: [{kind: npm, lockfiles: [data/package-lock.json]}]}\n")
	if pe != nil {
		t.Fatal(pe)
	}
	g := p.Egress.Packages[0]
	if g.Kind != PackageNPM || g.Upstream != DefaultNPMUpstream || g.LockfileTrust != TrustPinned ||
		len(g.Lockfiles) != 1 || g.Lockfiles[0] != outside || g.MaxRequests != DefaultPackageRequests {
		t.Errorf("grant %+v", g)
	}
	p, pe = f.parse(t, "version: 1\negress: {packages: [{kind: npm, upstream: \"https://npm.example.com/\", lockfiles: [data/package-lock.json], max_requests: 9}]}\n")
	if pe != nil {
		t.Fatal(pe)
	}
	if g := p.Egress.Packages[0]; g.Upstream != "https://npm.example.com" || g.MaxRequests != 9 {
		t.Errorf("grant %+v", g)
	}
	if ex := strings.Join(p.ExplainEgress(), "\n"); !strings.Contains(ex, "egress.packages npm: GET at /pkg/npm/") || !strings.Contains(ex, outside) || !strings.Contains(ex, "at most 9 requests") {
		t.Errorf("explain: %s", ex)
	}
	gs := filepath.Join(f.data, "go.sum")
	os.WriteFile(gs, nil, 0o644)
	p2, pe := f.parse(t, "version: 1\negress: {packages: [{kind: goproxy, lockfiles: [data/go.sum]}, {kind: npm, lockfiles: [data/package-lock.json]}]}\n")
	if pe != nil {
		t.Fatal(pe)
	}
	p3, pe := f.parse(t, "version: 1\negress: {packages: [{kind: pypi, lockfiles: [data/go.sum]}]}\n")
	if pe != nil || p3.Egress.Packages[0].Upstream != DefaultPyPIUpstream || p3.Egress.Packages[0].FilesUpstream != DefaultPyPIFiles {
		t.Errorf("pypi grant %v %+v", pe, p3)
	}
	if g := p2.Egress.Packages[0]; g.Kind != PackageGoProxy || g.Upstream != DefaultGoProxyUpstream || g.Lockfiles[0] != gs {
		t.Errorf("goproxy grant %+v", g)
	}
	// The printed policy loads back the same.
	y, err := p.YAML()
	if err != nil {
		t.Fatal(err)
	}
	if q, err := Parse(y, ""); err != nil || q.Egress.Packages[0].Upstream != "https://npm.example.com" {
		t.Fatalf("round trip: %v\n%s", err, y)
	}
}

// TestPackagesLockfileTrust: a lockfile inside a read_write grant is refused
// unless its digest is pinned or lockfile_trust is workspace; the same
// lockfile outside every writable grant (read_only) is accepted (control).
func TestPackagesLockfileTrust(t *testing.T) {
	f := newFixture(t)
	lf := filepath.Join(f.ws, "package-lock.json")
	sum := writeLockfile(t, lf)
	base := "version: 1\nfilesystem: {%s: [workspace]}\negress: {packages: [{kind: npm, lockfiles: [workspace/package-lock.json]%s}]}\n"
	for _, c := range []struct {
		name, grant, extra string
		ok                 bool
	}{
		{"read_only", "read_only", "", true},
		{"read_write", "read_write", "", false},
		{"read_write_pinned", "read_write", ", lockfile_sha256: {workspace/package-lock.json: " + sum + "}", true},
		{"read_write_workspace", "read_write", ", lockfile_trust: workspace", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, pe := f.parse(t, strings.Replace(strings.Replace(base, "%s", c.grant, 1), "%s", c.extra, 1))
			if c.ok != (pe == nil) {
				t.Fatalf("ok=%v, problems %v", c.ok, pe)
			}
			if !c.ok {
				if !pe.Has(CodeBadValue, "egress.packages[0].lockfiles[0]") || !strings.Contains(pe.Error(), "lockfile_sha256") {
					t.Errorf("problem %v does not name the lockfile and the fix", pe)
				}
				return
			}
			if msg := p.LockfileUntrusted(0, lf); msg != "" {
				t.Errorf("LockfileUntrusted of an accepted lockfile: %s", msg)
			}
			if c.name == "read_only" {
				// The rule again, as the sandbox applies it on each read:
				// the same policy with the workspace writable refuses it.
				p.Filesystem.ReadWrite = append(p.Filesystem.ReadWrite, f.ws)
				if msg := p.LockfileUntrusted(0, lf); !strings.Contains(msg, "lockfile_sha256") {
					t.Errorf("LockfileUntrusted in a writable grant: %q", msg)
				}
				if p.LockfileUntrusted(0, "/elsewhere/package-lock.json") == "" || p.LockfileUntrusted(1, lf) == "" {
					t.Error("LockfileUntrusted accepted a lockfile or grant the policy does not name")
				}
			}
			if c.name == "read_write_pinned" {
				if d, ok := p.Egress.Packages[0].PinnedDigest(lf); !ok || d != sum {
					t.Errorf("pinned digest %q %v", d, ok)
				}
			}
		})
	}
}

func TestPackagesRefused(t *testing.T) {
	f := newFixture(t)
	lf := filepath.Join(f.data, "package-lock.json")
	writeLockfile(t, lf)
	if err := os.Symlink(lf, filepath.Join(f.data, "link.json")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ y, code, path string }{
		{"{kind: npm, lockfiles: [data/link.json]}", CodeSymlink, "egress.packages[0].lockfiles[0]"},
		{"{kind: npm, lockfiles: [data/missing.json]}", CodeNotFound, "egress.packages[0].lockfiles[0]"},
		{"{kind: npm, lockfiles: [data]}", CodeBadType, "egress.packages[0].lockfiles[0]"},
		{"{kind: npm, lockfiles: [data/package-lock.json, data/package-lock.json]}", CodeDuplicate, "egress.packages[0].lockfiles[1]"},
		{"{kind: npm, lockfiles: []}", CodeMissing, "egress.packages[0].lockfiles"},
		{"{kind: npm, lockfiles: [data/package-lock.json], lockfile_sha256: {data/package-lock.json: ABC}}", CodeBadValue, "egress.packages[0].lockfile_sha256.data/package-lock.json"},
		{"{kind: npm, lockfiles: [data/package-lock.json], lockfile_sha256: {data/other.json: " + strings.Repeat("a", 64) + "}}", CodeBadValue, "egress.packages[0].lockfile_sha256.data/other.json"},
		{"{kind: npm, lockfiles: [data/package-lock.json]}, {kind: npm, lockfiles: [data/package-lock.json]}", CodeDuplicate, "egress.packages[1].kind"},
		{"{kind: rubygems, lockfiles: [data/package-lock.json]}", CodeBadValue, "egress.packages[0].kind"},
		{"{kind: npm, lockfiles: [data/package-lock.json], files_upstream: \"https://x.example\"}", CodeBadValue, "egress.packages[0].files_upstream"},
		{"{kind: pypi, lockfiles: [data/package-lock.json], files_upstream: \"http://x.example\"}", CodeURL, "egress.packages[0].files_upstream"},
		{"{kind: npm, lockfiles: [data/package-lock.json], ca_file: data/none.pem}", CodeNotFound, "egress.packages[0].ca_file"},
		{"{kind: npm, lockfiles: [data/package-lock.json], ca_file: data}", CodeBadValue, "egress.packages[0].ca_file"},
	} {
		_, pe := f.parse(t, "version: 1\negress: {packages: ["+c.y+"]}\n")
		if pe == nil || !pe.Has(c.code, c.path) {
			t.Errorf("%s: got %v, want %s at %s", c.y, pe, c.code, c.path)
		}
	}
	// Control: the well-formed grant loads.
	if _, pe := f.parse(t, "version: 1\negress: {packages: [{kind: npm, ca_file: data/package-lock.json, lockfiles: [data/package-lock.json], lockfile_sha256: {data/package-lock.json: "+strings.Repeat("a", 64)+"}}]}\n"); pe != nil {
		t.Errorf("control: %v", pe)
	}
}

func TestSchemaPackages(t *testing.T) {
	s := loadSchema(t)
	n := s.Defs["package_grant"]
	if got, want := sorted(yamlKeys(reflect.TypeFor[PackageGrant]())), sorted(packageKeys); !slices.Equal(got, want) {
		t.Errorf("struct yaml tags %v, decoder keys %v", got, want)
	}
	if got, want := sortedKeys(n.Properties), sorted(packageKeys); !slices.Equal(got, want) {
		t.Errorf("schema properties %v, decoder keys %v", got, want)
	}
	if !slices.Equal(n.Properties["kind"].Enum, PackageKinds) {
		t.Errorf("kind enum %v, want %v", n.Properties["kind"].Enum, PackageKinds)
	}
	if !slices.Equal(n.Properties["lockfile_trust"].Enum, []string{TrustPinned, TrustWorkspace}) {
		t.Errorf("lockfile_trust enum %v", n.Properties["lockfile_trust"].Enum)
	}
	if m := n.Properties["max_requests"]; *m.Maximum != MaxPackageRequestsLimit || m.Default != float64(DefaultPackageRequests) {
		t.Errorf("max_requests schema %v %v", *m.Maximum, m.Default)
	}
	if *s.Properties["egress"].Properties["packages"].MaxItems != MaxPackageGrants || *n.Properties["lockfiles"].MaxItems != MaxLockfilesPerGrant {
		t.Errorf("maxItems disagree with the decoder's limits")
	}
}
