package sandbox

import (
	"bytes"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"encoding/hex"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/policy"
)

func testLockfile(t *testing.T, dir string) (string, string) {
	t.Helper()
	s := sha512.Sum512([]byte("tgz"))
	data := []byte(`{"lockfileVersion":3,"packages":{"node_modules/left-pad":{"version":"1.3.0","resolved":"https://registry.npmjs.org/left-pad/-/left-pad-1.3.0.tgz","integrity":"sha512-` +
		base64.StdEncoding.EncodeToString(s[:]) + `"}}}`)
	p := filepath.Join(dir, "package-lock.json")
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	return p, hex.EncodeToString(sum[:])
}

func npmPolicy(lf, trust string, pinned map[string]string) *policy.Policy {
	return &policy.Policy{Egress: policy.Egress{Packages: []policy.PackageGrant{{Kind: policy.PackageNPM, Upstream: policy.DefaultNPMUpstream,
		Lockfiles: []string{lf}, LockfileTrust: trust, LockfileSHA256: pinned, MaxRequests: 10}}}}
}

// TestReadLockfiles: the pinned digest is checked at start (an edited
// lockfile refuses the run; the unedited one is read: control), a
// symlink anywhere in the path is refused (the real path: control), and
// lockfile_trust: workspace is announced.
func TestReadLockfiles(t *testing.T) {
	dir := t.TempDir()
	lf, sum := testLockfile(t, dir)
	cfg, read, err := readLockfiles(npmPolicy(lf, policy.TrustPinned, map[string]string{lf: sum}), nil)
	if err != nil || len(cfg.NPM) != 1 || cfg.NPM[0].Name != "left-pad" || cfg.NPM[0].Lockfile != lf {
		t.Fatalf("control: %v %+v", err, cfg)
	}
	if len(read) != 1 || read[0].SHA256 != sum || read[0].Pins != 1 || read[0].Path != lf || read[0].Trust != policy.TrustPinned {
		t.Errorf("package.lockfile records %+v", read)
	}
	// The workload edits the lockfile (adds a package) after the policy
	// pinned it.
	b, _ := os.ReadFile(lf)
	os.WriteFile(lf, bytes.Replace(b, []byte(`"packages":{`), []byte(`"packages":{"node_modules/evil":{"version":"1.0.0","resolved":"https://registry.npmjs.org/evil/-/evil-1.0.0.tgz","integrity":"sha512-`+strings.Repeat("A", 86)+`=="},`), 1), 0o644)
	if _, _, err := readLockfiles(npmPolicy(lf, policy.TrustPinned, map[string]string{lf: sum}), nil); err == nil || !strings.Contains(err.Error(), "the policy pins "+sum) {
		t.Errorf("edited lockfile: %v", err)
	}
	// Symlinks: the final component, and a directory on the way.
	lf2, _ := testLockfile(t, t.TempDir())
	link := filepath.Join(dir, "link.json")
	os.Symlink(lf2, link)
	linkDir := filepath.Join(dir, "linkdir")
	os.Symlink(filepath.Dir(lf2), linkDir)
	for _, p := range []string{link, filepath.Join(linkDir, "package-lock.json")} {
		if _, _, err := readLockfiles(npmPolicy(p, policy.TrustWorkspace, nil), nil); err == nil || !strings.Contains(err.Error(), "symlink") {
			t.Errorf("%s: %v, want a symlink refusal", p, err)
		}
	}
	var notice bytes.Buffer
	if _, _, err := readLockfiles(npmPolicy(lf2, policy.TrustWorkspace, nil), &notice); err != nil {
		t.Fatalf("control through the real path: %v", err)
	}
	if !strings.Contains(notice.String(), "lockfile_trust is workspace") || !strings.Contains(notice.String(), lf2) {
		t.Errorf("notice %q", notice.String())
	}
	// go.sum: parsed as such (a malformed line refuses the run).
	gs := filepath.Join(t.TempDir(), "go.sum")
	os.WriteFile(gs, []byte("example.com/a v1.0.0 h1:"+strings.Repeat("A", 43)+"=\n"), 0o644)
	gp := &policy.Policy{Egress: policy.Egress{Packages: []policy.PackageGrant{{Kind: policy.PackageGoProxy, Lockfiles: []string{gs}, LockfileTrust: policy.TrustWorkspace}}}}
	if c, _, err := readLockfiles(gp, nil); err != nil || len(c.Go) != 1 || c.Go[0].Module != "example.com/a" {
		t.Errorf("go.sum: %v %+v", err, c)
	}
	rq := filepath.Join(t.TempDir(), "requirements.txt")
	os.WriteFile(rq, []byte("Demo_Pkg==1.0 --hash=sha256:"+strings.Repeat("a", 64)+"\n"), 0o644)
	pp := &policy.Policy{Egress: policy.Egress{Packages: []policy.PackageGrant{{Kind: policy.PackagePyPI, Lockfiles: []string{rq}, LockfileTrust: policy.TrustWorkspace}}}}
	if c, _, err := readLockfiles(pp, nil); err != nil || len(c.PyPI) != 1 || c.PyPI[0].Name != "demo-pkg" {
		t.Errorf("requirements: %v %+v", err, c)
	}
	if env := packageEnv(4242, pp); !slices.Equal(env, []string{"PIP_INDEX_URL=http://127.0.0.1:4242/pkg/pypi/simple/"}) {
		t.Errorf("pypi env %v", env)
	}
	os.WriteFile(gs, []byte("example.com/a v1.0.0\n"), 0o644)
	if _, _, err := readLockfiles(gp, nil); err == nil || !strings.Contains(err.Error(), "malformed") {
		t.Errorf("malformed go.sum: %v", err)
	}
	// A malformed lockfile refuses the run.
	os.WriteFile(lf2, []byte(`{"lockfileVersion":1}`), 0o644)
	if _, _, err := readLockfiles(npmPolicy(lf2, policy.TrustWorkspace, nil), nil); err == nil || !strings.Contains(err.Error(), "lockfileVersion 1") {
		t.Errorf("v1 lockfile: %v", err)
	}
}

func TestPackageEnv(t *testing.T) {
	env := packageEnv(4242, npmPolicy("/x", policy.TrustPinned, nil))
	if !slices.Contains(env, "npm_config_registry=http://127.0.0.1:4242/pkg/npm/") || !slices.Contains(env, "npm_config_replace_registry_host=always") {
		t.Errorf("env %v", env)
	}
	gp := &policy.Policy{Egress: policy.Egress{Packages: []policy.PackageGrant{{Kind: policy.PackageGoProxy, Lockfiles: []string{"/x/go.sum"}}}}}
	if env := packageEnv(4242, gp); !slices.Equal(env, []string{"GOPROXY=http://127.0.0.1:4242/pkg/goproxy", "GOSUMDB=off"}) {
		t.Errorf("goproxy env %v", env)
	}
	if env := packageEnv(4242, &policy.Policy{}); env != nil {
		t.Errorf("no grant: %v", env)
	}
}
