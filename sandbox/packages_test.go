package sandbox

import (
	"bytes"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/audit"
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
	// uv.lock: a pypi lockfile named uv.lock is read as one.
	uv := filepath.Join(t.TempDir(), "uv.lock")
	os.WriteFile(uv, []byte("version = 1\n[[package]]\nname = \"Demo_Pkg\"\nversion = \"1.0\"\nsource = { registry = \"https://pypi.org/simple\" }\nwheels = [{ url = \"https://x/d.whl\", hash = \"sha256:"+strings.Repeat("b", 64)+"\" }]\n"), 0o644)
	up := &policy.Policy{Egress: policy.Egress{Packages: []policy.PackageGrant{{Kind: policy.PackagePyPI, Lockfiles: []string{uv}, LockfileTrust: policy.TrustWorkspace}}}}
	if c, read, err := readLockfiles(up, nil); err != nil || len(c.PyPI) != 1 || c.PyPI[0].Name != "demo-pkg" || c.PyPI[0].SHA256[0] != strings.Repeat("b", 64) || read[0].Pins != 1 {
		t.Errorf("uv.lock: %v %+v", err, c)
	}
	os.WriteFile(uv, []byte("version = 1\n[[package]]\nname = \"d\"\nversion = \"1.0\"\nsource = { registry = \"r\" }\nwheels = [{ url = \"u\" }]\n"), 0o644)
	if _, _, err := readLockfiles(up, nil); err == nil || !strings.Contains(err.Error(), "has no hash") {
		t.Errorf("uv.lock without a hash: %v", err)
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

// reloadSession is a Session with a journal (run.started carrying the
// lockfiles read at start) and a package route, as open leaves them.
func reloadSession(t *testing.T, pol *policy.Policy) *Session {
	t.Helper()
	w, err := audit.Create(filepath.Join(t.TempDir(), "run"), "run-reload")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	s := &Session{pol: pol, w: w, BrokerPort: 1}
	if err := s.readPackages(nil); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Append(audit.RunStarted{PolicySHA256: strings.Repeat("a", 64), Backend: "native", BinarySHA256: strings.Repeat("b", 64),
		PublicKey: string(w.PublicKeyPEM()), Lockfiles: s.lockfiles}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Append(audit.BoundaryConfirmed{Ready: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.openPackages(); err != nil {
		t.Fatal(err)
	}
	return s
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// TestReloadLockfiles: an operator's reload reads the lockfiles by the
// rule of the start and journals old and new digests before the new set
// is in force; a lockfile that does not parse, is a symlink, fails the
// trust rule or its pinned sha256 is refused, journaled, and leaves the
// set in force (each refusal next to an applied reload: the controls).
// The journal verifies.
func TestReloadLockfiles(t *testing.T) {
	dir := t.TempDir()
	lf, sum := testLockfile(t, dir)
	s := reloadSession(t, npmPolicy(lf, policy.TrustPinned, nil))
	if len(s.lockfiles) != 1 || s.lockfiles[0].SHA256 != sum || s.lockfiles[0].Pins != 1 {
		t.Fatalf("lockfiles at start %+v", s.lockfiles)
	}
	// Unchanged: applied, old = new.
	rec, err := s.ReloadLockfiles("uid 0 pid 1")
	if err != nil || rec.Outcome != audit.ReloadApplied || rec.Lockfiles[0].OldSHA256 != sum || rec.Lockfiles[0].SHA256 != sum {
		t.Fatalf("unchanged reload: %v %+v", err, rec)
	}
	// The operator pins another package.
	b, _ := os.ReadFile(lf)
	wider := bytes.Replace(b, []byte(`"packages":{`), []byte(`"packages":{"node_modules/right-pad":{"version":"1.0.0","resolved":"https://registry.npmjs.org/right-pad/-/right-pad-1.0.0.tgz","integrity":"sha512-`+strings.Repeat("A", 86)+`=="},`), 1)
	os.WriteFile(lf, wider, 0o644)
	rec, err = s.ReloadLockfiles("uid 0 pid 2")
	if err != nil || rec.Outcome != audit.ReloadApplied || rec.Lockfiles[0].OldSHA256 != sum || rec.Lockfiles[0].SHA256 != sha256Hex(wider) || rec.Lockfiles[0].Pins != 2 {
		t.Fatalf("reload of a wider lockfile: %v %+v", err, rec)
	}
	if s.lockfiles[0].SHA256 != sha256Hex(wider) {
		t.Errorf("set in force %+v", s.lockfiles)
	}
	refused := func(what, reason string) {
		t.Helper()
		before := s.lockfiles[0].SHA256
		rec, err := s.ReloadLockfiles("uid 0 pid 3")
		if err == nil || rec.Outcome != audit.ReloadRefused || rec.Reason != reason || rec.Lockfiles[0].OldSHA256 != before || rec.Lockfiles[0].Pins != 0 {
			t.Errorf("%s: %v %+v, want refused %s", what, err, rec, reason)
		}
		if s.lockfiles[0].SHA256 != before {
			t.Errorf("%s: the set in force changed to %+v", what, s.lockfiles)
		}
	}
	os.WriteFile(lf, []byte(`{"lockfileVersion":3,"packages":`), 0o644)
	refused("truncated lockfile", lockfileInvalid)
	os.Remove(lf)
	other, _ := testLockfile(t, t.TempDir())
	os.Symlink(other, lf)
	refused("lockfile replaced by a symlink", lockfileUnreadable)
	os.Remove(lf)
	os.WriteFile(lf, wider, 0o644)
	// The trust rule, applied again: a writable grant over the lockfile
	// (the workload could have written it).
	s.pol.Filesystem.ReadWrite = []string{dir}
	refused("lockfile in a writable grant", lockfileUntrusted)
	// Pinned by sha256: only the pinned bytes are accepted.
	s.pol.Egress.Packages[0].LockfileSHA256 = map[string]string{lf: sha256Hex(wider)}
	if rec, err := s.ReloadLockfiles("uid 0 pid 4"); err != nil || rec.Outcome != audit.ReloadApplied {
		t.Errorf("pinned, unchanged: %v %+v", err, rec)
	}
	os.WriteFile(lf, b, 0o644)
	refused("lockfile edited away from its pinned sha256", lockfileUntrusted)
	if _, err := s.w.Append(audit.RunTerminated{Reason: audit.ReasonCompleted}); err != nil {
		t.Fatal(err)
	}
	j, _ := os.ReadFile(s.w.JournalPath())
	if res := audit.Verify(j, s.w.PublicKey()); res.Status != audit.Complete {
		t.Errorf("journal: %v %v", res.Status, res.Err)
	}
	payloads, err := audit.Payloads(j)
	if err != nil {
		t.Fatal(err)
	}
	var outcomes []string
	for _, p := range payloads {
		var r struct{ Type, Outcome, Reason string }
		json.Unmarshal(p, &r)
		if r.Type == audit.TypePackageReload {
			outcomes = append(outcomes, r.Outcome+" "+r.Reason)
		}
	}
	want := []string{"applied ", "applied ", "refused lockfile_invalid", "refused lockfile_unreadable", "refused lockfile_untrusted", "applied ", "refused lockfile_untrusted"}
	if !slices.Equal(outcomes, want) {
		t.Errorf("package.reload outcomes %q, want %q", outcomes, want)
	}
	// Without a package grant there is nothing to reload.
	if _, err := (&Session{pol: &policy.Policy{}}).ReloadLockfiles("uid 0 pid 5"); err == nil {
		t.Error("reload without package grants succeeded")
	}
}
