package broker

// Red team of the lockfile-bound package route (issue 19): /pkg/npm,
// /pkg/pypi and /pkg/goproxy attacked from the workload (every request
// byte), from a malicious upstream (metadata, artifact bytes, redirects,
// encodings, sizes), across runs and while moat starts. Findings, each
// fixed with its test here (or in sandbox/packages_redteam_test.go and
// e2e/packages_redteam_test.go):
//
//   - npm manifest confusion: the packument's scripts of a pinned version
//     ran although the tarball matched, and its bin could shadow "node" in
//     node_modules/.bin (TestRedteamNPMManifestConfusion; scripts dropped,
//     hasInstallScript and bin taken from the lockfile);
//   - a small module zip inflating to 512 MiB per file was read whole into
//     memory (TestRedteamGoZipBomb);
//   - zip entries with symlink modes matched go.sum (TestRedteamGoZipSymlink);
//   - "-rfile" / "--requirem f" includes were skipped silently
//     (TestRedteamRequirementsInclude);
//   - pip's %2B (local version) was refused, epoch pins too
//     (TestRedteamPyPILocalVersion);
//   - a FIFO in a lockfile's place blocked the read (sandbox).
//
// Attacks that did not work, and why the code holds (TestRedteamHeld
// keeps several of them):
//
//   - dot segments, %2e%2e, %2f, %252f, "//", "\", ?query under /pkg/: the
//     front refuses every '%' but %21, %2B and npm's "@scope%2f" (each the
//     path character it stands for), dot and empty segments, backslashes.
//   - case folding (Left-Pad, LEFT-PAD, /pkg/NPM/): names, kinds and paths
//     are looked up exactly; the upstream is asked only for the lockfile's
//     canonical path. PEP 503 Foo_Bar: refused as not normalized (pip
//     sends foo-bar). Go !a escapes: decoded strictly, an upper-case byte
//     or a bad '!' refused; the upstream path is re-escaped from go.sum.
//   - tarball URL in a packument (other host, other package, same host other
//     path), a different dist.integrity algorithm: dist is replaced by the
//     lockfile's path and sha512; tarballs are fetched only at the pinned
//     path and checked against the lockfile's sha512.
//   - a packument or index page listing another version at the pinned file:
//     npm keeps only versions whose key and "version" equal the pin; PyPI
//     files are bound to the pinned sha256 and to the index page of their
//     own name; go .info/list come from go.sum, never the upstream.
//   - weak hashes: an md5/sha1 --hash refuses the requirements file; npm
//     integrity needs exactly one sha512; go.sum only h1. A go.sum with
//     only /go.mod lines for a version: its .zip is refused unfetched.
//   - zip with extra files or traversal names matching go.sum: h1 covers
//     every name and content (a newline in a name refused, duplicates
//     refused), so such a zip matches only a go.sum that pinned it.
//   - huge or infinite metadata, gzip bombs via Content-Encoding: every
//     response is capped at 64 MiB after decoding and charged to the
//     memory budget; at most 4 codings; PackageTimeout bounds the time.
//   - HEAD, PUT/DELETE/POST, X-HTTP-Method-Override, Range, If-None-Match:
//     only GET is served and the upstream request carries moat's own
//     headers only (no workload header is forwarded), always a whole GET.
//   - upstream redirects (to 127.0.0.1, metadata addresses, another host):
//     never followed (package_upstream_status, nothing fetched there); the
//     upstream's own address goes through the SSRF guard (loopback refused
//     with package_address_refused, after the pre-effect record).
//   - PyPI links to another host, http, userinfo, a host with a port: only
//     https links whose host equals upstream or files_upstream are kept.
//   - caching of a refused artifact: the broker caches nothing; a refused
//     tarball is never served, so no client caches it.
//   - fetch before the journal: every fetch appends package.requested
//     durably first and sends its SHA-256 as Moat-Pre-Effect-SHA256 (the
//     fake registries find that line in the journal on disk, verify its
//     signature and that it is this fetch's package.requested); .info and
//     list are answered from go.sum unfetched.
//   - the journal line leaking to a public registry (the red team's
//     finding: Moat-Pre-Effect named the executable and the lockfile's
//     host path): only the line's digest is sent, with Accept,
//     Accept-Encoding and User-Agent (TestPackagesFetchSendsDigestOnly).
//   - lockfile symlinks and TOCTOU: openat2 RESOLVE_NO_SYMLINKS, one read,
//     sha256 and parse of the same bytes; a lockfile edited during the run
//     admits nothing new (pins read once).
//   - a workload request that makes the upstream fetch unpinned data: each
//     fetch path is the lockfile's (npm), /simple/<pinned name>/ (PyPI),
//     re-escaped go.sum module@version (go); no workload byte reaches it.

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/moat-sandbox/moat/internal/netguard"
	"github.com/moat-sandbox/moat/internal/testenv"
	"github.com/moat-sandbox/moat/policy"
)

// npmTarballFiles builds a package tarball of the given package/... files.
func npmTarballFiles(t testing.TB, files [][2]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, f := range files {
		if err := tw.WriteHeader(&tar.Header{Name: "package/" + f[0], Mode: 0o644, Size: int64(len(f[1])), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(f[1]))
	}
	tw.Close()
	zw.Close()
	return buf.Bytes()
}

// npmRedteam is a registry serving one pinned package, hooked 1.0.0,
// whose tarball's package.json has an install script that writes
// TARBALL_RAN; the test sets the packument.
type npmRedteam struct {
	reg     *fakeRegistry
	tgz     []byte
	lock    []byte
	h       *harness
	mu      sync.Mutex
	accepts []string
}

const hookedPath = "/hooked/-/hooked-1.0.0.tgz"

func newNPMRedteam(t *testing.T) *npmRedteam {
	t.Helper()
	f := &npmRedteam{reg: &fakeRegistry{files: map[string][]byte{}, tampered: map[string][]byte{}}}
	f.reg.srv = newTLSRegistry(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.accepts = append(f.accepts, r.Header.Get("Accept"))
		f.mu.Unlock()
		f.reg.ServeHTTP(w, r)
	}))
	f.tgz = npmTarballFiles(t, [][2]string{
		{"package.json", `{"name":"hooked","version":"1.0.0","main":"index.js","bin":{"hooked":"cli.js"},` +
			`"scripts":{"install":"node -e \"require('fs').writeFileSync('TARBALL_RAN','x')\""}}`},
		{"index.js", "module.exports = 'hooked@1.0.0'\n"},
		{"cli.js", "#!/usr/bin/env node\nconsole.log('hooked')\n"},
	})
	f.reg.files[hookedPath] = f.tgz
	f.lock = []byte(`{"name":"app","version":"1.0.0","lockfileVersion":3,"requires":true,"packages":{` +
		`"":{"name":"app","version":"1.0.0","dependencies":{"hooked":"1.0.0"}},` +
		`"node_modules/hooked":{"version":"1.0.0","resolved":"https://registry.npmjs.org` + hookedPath + `","integrity":"` + sri(f.tgz) + `","hasInstallScript":true,"bin":{"hooked":"cli.js"}}}}`)
	lockfile := filepath.Join(t.TempDir(), "package-lock.json")
	os.WriteFile(lockfile, f.lock, 0o644)
	pins, err := ParseNPMLockfile(lockfile, f.lock)
	if err != nil {
		t.Fatal(err)
	}
	fp := newFakeProvider(t, false)
	f.h = startBroker(t, fp, testPolicy(fp.srv.URL, 10), nil, func(c *Config) {
		pk, err := NewPackages(PackagesConfig{
			Grants:  []policy.PackageGrant{{Kind: policy.PackageNPM, Upstream: f.reg.srv.URL, Lockfiles: []string{lockfile}, LockfileTrust: policy.TrustPinned, MaxRequests: 100}},
			NPM:     pins,
			BaseURL: "http://127.0.0.1:1",
			Dial:    testGuard(), RootCAs: f.reg.pool()})
		if err != nil {
			t.Fatal(err)
		}
		c.Packages = pk
	})
	f.reg.verify = f.h.j.verifyPackageFetch
	t.Cleanup(func() {
		if len(f.reg.bad) > 0 {
			t.Errorf("the registry got requests without a journaled pre-effect line: %v", f.reg.bad)
		}
	})
	return f
}

// confusedPackument is hooked's packument as a malicious upstream serves
// it: the pinned version's manifest carries an install script (and other
// fields) that the pinned tarball does not have.
const confusedPackument = `{"name":"hooked","dist-tags":{"latest":"1.0.0"},"versions":{"1.0.0":{` +
	`"name":"hooked","version":"1.0.0","bin":{"hooked":"cli.js","node":"index.js"},"dependencies":{},"_hasShrinkwrap":true,"gypfile":false,` +
	`"scripts":{"install":"node -e \"require('fs').writeFileSync('PWNED','x')\"","preinstall":"node -e \"require('fs').writeFileSync('PWNED','x')\""},` +
	`"dist":{"tarball":"https://registry.npmjs.org/hooked/-/hooked-1.0.0.tgz"}}}}`

// TestRedteamNPMManifestConfusion: the upstream cannot run code through
// the packument of a pinned version. npm runs the install scripts of the
// packument's manifest, not of the tarball's package.json, so a packument
// whose pinned version names scripts the pinned tarball lacks ran them
// although the tarball's digest matched. The served manifest keeps only
// resolution fields and bin, with the lockfile's hasInstallScript, so
// that npm runs the verified tarball's own scripts (the positive control).
func TestRedteamNPMManifestConfusion(t *testing.T) {
	f := newNPMRedteam(t)
	f.reg.files["/hooked"] = []byte(confusedPackument)
	r := f.h.raw(pkgGet("/pkg/npm/hooked"))
	if r.status != 200 {
		t.Fatalf("packument: %d %s", r.status, r.body)
	}
	var doc struct {
		Versions map[string]map[string]json.RawMessage `json:"versions"`
	}
	if err := json.Unmarshal([]byte(r.body), &doc); err != nil {
		t.Fatal(err)
	}
	v := doc.Versions["1.0.0"]
	for _, k := range []string{"scripts", "_hasShrinkwrap", "gypfile"} {
		if _, ok := v[k]; ok {
			t.Errorf("the served manifest keeps the upstream's %s: %s", k, r.body)
		}
	}
	if string(v["hasInstallScript"]) != "true" || string(v["bin"]) != `{"hooked":"cli.js"}` || string(v["name"]) != `"hooked"` {
		t.Errorf("the served manifest lost what npm needs: %s", r.body)
	}
	// A package the lockfile does not mark hasInstallScript is served
	// without it, whatever the upstream says: npm then runs no script.
	lp := newNPMFixture(t)
	lp.reg.files["/left-pad"] = []byte(`{"name":"left-pad","versions":{"1.3.0":{"name":"left-pad","version":"1.3.0","hasInstallScript":true,` +
		`"scripts":{"postinstall":"node -e \"require('fs').writeFileSync('PWNED','x')\""}}}}`)
	if r := lp.harness(t).raw(pkgGet("/pkg/npm/left-pad")); r.status != 200 || strings.Contains(r.body, "hasInstallScript") || strings.Contains(r.body, "PWNED") {
		t.Errorf("left-pad packument: %d %s", r.status, r.body)
	}
	f.mu.Lock()
	accept := f.accepts[len(f.accepts)-1]
	f.mu.Unlock()
	if !strings.HasPrefix(accept, "application/vnd.npm.install-v1+json") {
		t.Errorf("packument fetched with Accept %q, not the abbreviated document npm installs from", accept)
	}

	npm, err := exec.LookPath("npm")
	testenv.Need(t, err == nil, "npm is not installed (CI installs nodejs and npm)")
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "package.json"), []byte(`{"name":"app","version":"1.0.0"}`), 0o644)
	cmd := exec.Command(npm, "install", "--no-audit", "--no-fund", "--fetch-retries=0", "hooked@1.0.0")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "npm_config_registry=http://"+f.h.addr+"/pkg/npm/", "npm_config_replace_registry_host=always",
		"npm_config_cache="+filepath.Join(dir, ".cache"), "npm_config_userconfig="+filepath.Join(dir, ".npmrc"), "npm_config_update_notifier=false")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("npm install: %v\n%s", err, out)
	}
	pkg := filepath.Join(dir, "node_modules", "hooked")
	if _, err := os.Stat(filepath.Join(pkg, "PWNED")); err == nil {
		t.Errorf("npm ran the install script of the upstream's packument, which the pinned tarball does not have:\n%s", out)
	}
	// Positive control: the verified tarball's own install script runs,
	// and its bin is linked.
	if _, err := os.Stat(filepath.Join(pkg, "TARBALL_RAN")); err != nil {
		t.Errorf("the pinned tarball's own install script did not run: %v\n%s", err, out)
	}
	if _, err := os.Lstat(filepath.Join(dir, "node_modules", ".bin", "hooked")); err != nil {
		t.Errorf("the lockfile's bin was not linked: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "node_modules", ".bin", "node")); err == nil {
		t.Errorf("npm linked the upstream's bin \"node\", which the lockfile does not list")
	}
}

// TestRedteamGoZipBomb: a module zip that inflates far beyond its size
// (here 96 MiB of zeros in a zip of under 100 KiB) is hashed as it is
// inflated: hashing it allocates a small fraction of its contents. It
// read each file whole into memory (up to maxGoZipContent, 512 MiB, per
// file and per request, not charged to the memory budget), so an upstream
// serving such zips for a pinned module, fetched a few times at once,
// could exhaust the host's memory and end the run. The hash is still
// dirhash's (positive control), and the content cap still refuses.
func TestRedteamGoZipBomb(t *testing.T) {
	const size = 96 << 20
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	w, err := zw.Create("example.com/bomb@v1.0.0/zeros")
	if err != nil {
		t.Fatal(err)
	}
	zero := make([]byte, 1<<20)
	for i := 0; i < size>>20; i++ {
		w.Write(zero)
	}
	w, _ = zw.Create("example.com/bomb@v1.0.0/go.mod")
	w.Write([]byte("module example.com/bomb\n"))
	zw.Close()
	// dirhash's Hash1, computed here from the contents.
	fh := sha256.New()
	for i := 0; i < size>>20; i++ {
		fh.Write(zero)
	}
	sum := sha256.New()
	fmt.Fprintf(sum, "%x  %s\n", sha256.Sum256([]byte("module example.com/bomb\n")), "example.com/bomb@v1.0.0/go.mod")
	fmt.Fprintf(sum, "%x  %s\n", fh.Sum(nil), "example.com/bomb@v1.0.0/zeros")
	want := "h1:" + base64.StdEncoding.EncodeToString(sum.Sum(nil))

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	got, err := goZipHash(buf.Bytes(), maxGoZipContent)
	runtime.ReadMemStats(&after)
	if err != nil || got != want {
		t.Fatalf("hash %s %v, want %s", got, err, want)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > size/8 {
		t.Errorf("hashing a %d-byte zip of %d MiB of contents allocated %d MiB", buf.Len(), size>>20, alloc>>20)
	}
	if _, err := goZipHash(buf.Bytes(), size); err == nil || !strings.Contains(err.Error(), "over") {
		t.Errorf("contents over the cap: %v", err)
	}
	// Many small entries share one copy buffer: 100k empty files cost
	// archive/zip's bookkeeping, not 32 KiB each (3 GiB).
	buf.Reset()
	zw = zip.NewWriter(&buf)
	for i := 0; i < 100000; i++ {
		zw.CreateHeader(&zip.FileHeader{Name: fmt.Sprintf("example.com/bomb@v1.0.0/%06d", i), Method: zip.Store})
	}
	zw.Close()
	runtime.GC()
	runtime.ReadMemStats(&before)
	if _, err := goZipHash(buf.Bytes(), maxGoZipContent); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 512<<20 {
		t.Errorf("hashing a zip of 100000 empty files allocated %d MiB", alloc>>20)
	}
}

// TestRedteamRequirementsInclude: pip reads option lines with optparse,
// so "-rother.txt" and "--requirem other.txt" include other.txt as
// "-r other.txt" does; moat skipped them as client options, read the file
// as pinning nothing from other.txt, and the broker then refused
// other.txt's packages with a message saying to add them to the file
// that already includes them. Every spelling of an include, constraint
// or editable now refuses the file with a message naming it; client
// options (the positive control) are still skipped.
func TestRedteamRequirementsInclude(t *testing.T) {
	hash := " --hash=sha256:" + strings.Repeat("ab", 32)
	for _, bad := range []string{"-rother.txt", "-r other.txt", "--requirem=other.txt", "--requirement other.txt", "-cconstraints.txt",
		"--constr c.txt", "-e.", "--edit=.", "--r x"} {
		_, err := ParseRequirements("requirements.txt", []byte(bad+"\ndemo==1.0"+hash+"\n"))
		if err == nil || !strings.Contains(err.Error(), "requirements.txt:1: ") || !strings.Contains(err.Error(), "not supported") {
			t.Errorf("%q: %v, want refused naming line 1", bad, err)
		}
	}
	for _, ok := range []string{"--require-hashes", "-i https://pypi.org/simple", "--index-url=https://pypi.org/simple", "--extra-index-url x", "-f /wheels", "--prefer-binary", "--pre"} {
		pins, err := ParseRequirements("requirements.txt", []byte(ok+"\ndemo==1.0"+hash+"\n"))
		if err != nil || len(pins) != 1 || pins[0].Name != "demo" {
			t.Errorf("%q: %v %v, want the option skipped and demo pinned", ok, pins, err)
		}
	}
}

// pypiRedteam is a broker with a pypi grant in front of reg, pinning
// reqs.
func pypiRedteam(t *testing.T, reg *fakeRegistry, reqs string) *harness {
	t.Helper()
	lock := filepath.Join(t.TempDir(), "requirements.txt")
	os.WriteFile(lock, []byte(reqs), 0o644)
	pins, err := ParseRequirements(lock, []byte(reqs))
	if err != nil {
		t.Fatal(err)
	}
	fp := newFakeProvider(t, false)
	h := startBroker(t, fp, testPolicy(fp.srv.URL, 10), nil, func(c *Config) {
		pk, err := NewPackages(PackagesConfig{
			Grants:  []policy.PackageGrant{{Kind: policy.PackagePyPI, Upstream: reg.srv.URL, Lockfiles: []string{lock}, LockfileTrust: policy.TrustPinned, MaxRequests: 100}},
			PyPI:    pins,
			BaseURL: "http://127.0.0.1:1",
			Dial:    testGuard(), RootCAs: reg.pool()})
		if err != nil {
			t.Fatal(err)
		}
		c.Packages = pk
	})
	reg.verify = h.j.verifyPackageFetch
	t.Cleanup(func() {
		if len(reg.bad) > 0 {
			t.Errorf("the registry got requests without a journaled pre-effect line: %v", reg.bad)
		}
	})
	return h
}

// pipDownload runs pip download --require-hashes of reqs through h into
// a new directory and returns it.
func pipDownload(t *testing.T, h *harness, reqs string) (string, string, error) {
	t.Helper()
	pip, err := exec.LookPath("pip")
	testenv.Need(t, err == nil, "pip is not installed (CI installs python3-pip)")
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "requirements.txt"), []byte(reqs), 0o644)
	cmd := exec.Command(pip, "download", "--no-cache-dir", "--no-deps", "--disable-pip-version-check", "--retries", "0",
		"--require-hashes", "-r", "requirements.txt", "-d", filepath.Join(dir, "dl"), "--index-url", "http://"+h.addr+"/pkg/pypi/simple/")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PIP_CONFIG_FILE=/dev/null", "NO_PROXY=*")
	out, err := cmd.CombinedOutput()
	return filepath.Join(dir, "dl"), string(out), err
}

// TestRedteamPyPILocalVersion: pip percent-quotes the links of an index
// page before it fetches them, so a file whose name has a '+' (a local
// version, 1.0+cpu) or a '!' (an epoch) is requested as %2B or %21. The
// front refused every '%' but the go command's %21, so such wheels could
// not be installed at all, with a message about percent-encoding. %2B is
// now read as '+', like %21 as '!'; every other escape is still refused
// (the denial in the same setup).
func TestRedteamPyPILocalVersion(t *testing.T) {
	reg := &fakeRegistry{files: map[string][]byte{}, tampered: map[string][]byte{}}
	reg.srv = newTLSRegistry(t, reg)
	whl := pyWheel(t, "demo-pkg", "1.0+cpu", "42")
	epoch := pyWheel(t, "epoch-pkg", "1!2.0", "7")
	reg.files["/files/demo_pkg-1.0+cpu-py3-none-any.whl"] = whl
	reg.files["/files/epoch_pkg-1!2.0-py3-none-any.whl"] = epoch
	reg.files["/simple/demo-pkg/"] = []byte(`<a href="/files/demo_pkg-1.0+cpu-py3-none-any.whl#sha256=` + hexSum(whl) + `">w</a>`)
	reg.files["/simple/epoch-pkg/"] = []byte(`<a href="/files/epoch_pkg-1!2.0-py3-none-any.whl#sha256=` + hexSum(epoch) + `">w</a>`)
	reqs := "demo-pkg==1.0+cpu --hash=sha256:" + hexSum(whl) + "\nepoch-pkg==1!2.0 --hash=sha256:" + hexSum(epoch) + "\n"
	h := pypiRedteam(t, reg, reqs)
	if r := h.raw(pkgGet("/pkg/pypi/simple/demo-pkg/")); r.status != 200 {
		t.Fatalf("index: %d %s", r.status, r.body)
	}
	if r := h.raw(pkgGet("/pkg/pypi/files/" + hexSum(whl) + "/demo_pkg-1.0%2Bcpu-py3-none-any.whl")); r.status != 200 || r.body != string(whl) {
		t.Errorf("%%2B in the file name: %d %s", r.status, r.body)
	}
	if r := h.raw(pkgGet("/pkg/pypi/files/" + hexSum(whl) + "/demo_pkg-1.0%2Fcpu-py3-none-any.whl")); r.status != 400 || r.header.Get("Moat-Reason") != string(ReasonPathTrick) {
		t.Errorf("%%2F in the file name: %d %s", r.status, r.body)
	}
	dl, out, err := pipDownload(t, h, reqs)
	if err != nil {
		t.Fatalf("pip download of a local version and an epoch: %v\n%s", err, out)
	}
	if b, err := os.ReadFile(filepath.Join(dl, "demo_pkg-1.0+cpu-py3-none-any.whl")); err != nil || !bytes.Equal(b, whl) {
		t.Errorf("local-version wheel not downloaded: %v\n%s", err, out)
	}
	if b, err := os.ReadFile(filepath.Join(dl, "epoch_pkg-1!2.0-py3-none-any.whl")); err != nil || !bytes.Equal(b, epoch) {
		t.Errorf("epoch wheel not downloaded: %v\n%s", err, out)
	}
}

// TestRedteamGoZipSymlink: the h1 hash covers a module zip's names and
// contents, not its entries' modes, so an upstream could serve the pinned
// module with an entry turned into a symlink (contents "/etc/passwd")
// that still matched go.sum. The go command itself writes every entry as
// a regular file, but the zip is kept in the module cache as served; a
// zip entry that is not a regular file or a directory is now refused
// (the go command never makes one). Positive control: the same contents
// as regular files are served.
func TestRedteamGoZipSymlink(t *testing.T) {
	reg := &fakeRegistry{files: map[string][]byte{}, tampered: map[string][]byte{}}
	reg.srv = newTLSRegistry(t, reg)
	build := func(link bool) []byte {
		var buf bytes.Buffer
		zw := zip.NewWriter(&buf)
		for _, f := range [][2]string{{"go.mod", "module example.com/demo\n"}, {"passwd", "/etc/passwd"}} {
			hdr := &zip.FileHeader{Name: "example.com/demo@v1.0.0/" + f[0], Method: zip.Deflate}
			if link && f[0] == "passwd" {
				hdr.SetMode(os.ModeSymlink | 0o777)
			}
			w, err := zw.CreateHeader(hdr)
			if err != nil {
				t.Fatal(err)
			}
			w.Write([]byte(f[1]))
		}
		zw.Close()
		return buf.Bytes()
	}
	good, evil := build(false), build(true)
	zh, err := goZipHash(good, maxGoZipContent)
	if err != nil {
		t.Fatal(err)
	}
	reg.files["/example.com/demo/@v/v1.0.0.zip"] = good
	sum := []byte("example.com/demo v1.0.0 " + zh + "\n")
	gosum := filepath.Join(t.TempDir(), "go.sum")
	os.WriteFile(gosum, sum, 0o644)
	pins, err := ParseGoSum(gosum, sum)
	if err != nil {
		t.Fatal(err)
	}
	fp := newFakeProvider(t, false)
	h := startBroker(t, fp, testPolicy(fp.srv.URL, 10), nil, func(c *Config) {
		pk, err := NewPackages(PackagesConfig{
			Grants:  []policy.PackageGrant{{Kind: policy.PackageGoProxy, Upstream: reg.srv.URL, Lockfiles: []string{gosum}, LockfileTrust: policy.TrustPinned, MaxRequests: 100}},
			Go:      pins,
			BaseURL: "http://127.0.0.1:1",
			Dial:    testGuard(), RootCAs: reg.pool()})
		if err != nil {
			t.Fatal(err)
		}
		c.Packages = pk
	})
	reg.verify = h.j.verifyPackageFetch
	if r := h.raw(pkgGet("/pkg/goproxy/example.com/demo/@v/v1.0.0.zip")); r.status != 200 || r.body != string(good) {
		t.Fatalf("pinned zip: %d %s", r.status, r.body)
	}
	reg.mu.Lock()
	reg.tampered["/example.com/demo/@v/v1.0.0.zip"] = evil
	reg.mu.Unlock()
	r := h.raw(pkgGet("/pkg/goproxy/example.com/demo/@v/v1.0.0.zip"))
	if r.status != 502 || r.header.Get("Moat-Reason") != string(ReasonPackageDigest) || !strings.Contains(r.body, "not a regular file") {
		t.Errorf("zip with a symlink entry: %d %s", r.status, r.body)
	}
	if len(reg.bad) > 0 {
		t.Errorf("requests without a journaled pre-effect line: %v", reg.bad)
	}
}

// TestRedteamHeld keeps the attacks that did not work (see the list at
// the top of this file) from starting to: each with its positive control
// in the same broker.
func TestRedteamHeld(t *testing.T) {
	f := newNPMFixture(t)
	var mu sync.Mutex
	var hdrs []http.Header
	redirect := ""
	elsewhere := newTLSRegistry(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hdrs = append(hdrs, http.Header{"Elsewhere": {r.URL.Path}})
		mu.Unlock()
		w.Write(f.tgz["left-pad@1.3.0"])
	}))
	f.reg.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hdrs = append(hdrs, r.Header.Clone())
		to := redirect
		mu.Unlock()
		if to != "" {
			http.Redirect(w, r, to, http.StatusFound)
			return
		}
		f.reg.ServeHTTP(w, r)
	})
	h := f.harness(t)
	tgz := "/pkg/npm/left-pad/-/left-pad-1.3.0.tgz"
	// Positive control, then the same request with a method override and
	// a Range: a whole GET goes upstream with moat's headers only.
	for _, extra := range []string{"", "X-HTTP-Method-Override: PUT\r\nX-Method-Override: DELETE\r\nRange: bytes=0-1\r\nIf-None-Match: *\r\n"} {
		r := h.raw("GET " + tgz + " HTTP/1.1\r\nHost: 127.0.0.1\r\n" + extra + "Connection: close\r\n\r\n")
		if r.status != 200 || r.body != string(f.tgz["left-pad@1.3.0"]) {
			t.Fatalf("pinned tarball (%q): %d %s", extra, r.status, r.body)
		}
	}
	mu.Lock()
	for _, hd := range hdrs {
		for _, k := range []string{"X-Http-Method-Override", "X-Method-Override", "Range", "If-None-Match"} {
			if hd.Get(k) != "" {
				t.Errorf("the upstream got the workload's %s", k)
			}
		}
	}
	hdrs = nil
	mu.Unlock()
	for _, c := range []struct {
		in     string
		status int
		reason Reason
	}{
		{"HEAD " + tgz + " HTTP/1.1\r\nHost: x\r\n\r\n", 405, ReasonMethod},
		{pkgGet("/pkg/npm/left-pad/-/../-/left-pad-1.3.0.tgz"), 400, ReasonPathTrick},
		{pkgGet("/pkg/npm/left-pad/-/%2e%2e/left-pad-1.3.0.tgz"), 400, ReasonPathTrick},
		{pkgGet("/pkg/npm/left-pad%2f-%2fleft-pad-1.3.0.tgz"), 400, ReasonPathTrick},
		{pkgGet("/pkg/npm/left-pad/-/left-pad-1.3.0.tgz%252f"), 400, ReasonPathTrick},
		{pkgGet("/pkg/npm//left-pad"), 400, ReasonPathTrick},
		{pkgGet("/pkg/npm/left-pad/-/left-pad-1.3.0.tgz?x=1"), 400, ReasonQuery},
		{pkgGet("/pkg/npm/Left-Pad/-/left-pad-1.3.0.tgz"), 404, ReasonPackageNotPinned},
		{pkgGet("/pkg/npm/LEFT-PAD"), 404, ReasonPackageNotPinned},
		{pkgGet("/pkg/npm/left-pad/-/left-pad-1.3.0.tgz/"), 404, ReasonPackageVersion},
		{pkgGet("/pkg/npm/left-pad/-/left-pad-1.3.00.tgz"), 404, ReasonPackageVersion},
		{pkgGet("/pkg/NPM/left-pad"), 404, ReasonPackageUnknownKind},
	} {
		if r := h.raw(c.in); r.status != c.status || r.header.Get("Moat-Reason") != string(c.reason) {
			t.Errorf("%q: %d %s, want %d %s", c.in, r.status, r.body, c.status, c.reason)
		}
	}
	mu.Lock()
	if len(hdrs) != 0 {
		t.Errorf("refused requests reached the upstream: %v", hdrs)
	}
	// An upstream redirect (here to another host with the pinned bytes)
	// is not followed: nothing is fetched there, nothing served.
	redirect = elsewhere.URL + "/left-pad-1.3.0.tgz"
	mu.Unlock()
	r := h.raw(pkgGet(tgz))
	if r.status != 502 || r.header.Get("Moat-Reason") != string(ReasonPackageUpstream) || !strings.Contains(r.body, "redirects are not followed") {
		t.Errorf("redirected tarball: %d %s", r.status, r.body)
	}
	mu.Lock()
	for _, hd := range hdrs {
		if hd.Get("Elsewhere") != "" {
			t.Errorf("the redirect was followed to %s", hd.Get("Elsewhere"))
		}
	}
	redirect = ""
	mu.Unlock()

	// The SSRF guard as moat runs it: the registry on 127.0.0.1 is not
	// dialled; the refusal is journaled after the pre-effect record, with
	// the address's reason.
	fp := newFakeProvider(t, false)
	strict := startBroker(t, fp, testPolicy(fp.srv.URL, 10), nil, func(c *Config) {
		pk, err := NewPackages(PackagesConfig{
			Grants:  []policy.PackageGrant{{Kind: policy.PackageNPM, Upstream: f.reg.srv.URL, Lockfiles: []string{f.lockfile}, LockfileTrust: policy.TrustPinned, MaxRequests: 100}},
			NPM:     f.pins,
			BaseURL: "http://127.0.0.1:1",
			Dial:    netguard.New().DialContext, RootCAs: f.reg.pool()})
		if err != nil {
			t.Fatal(err)
		}
		c.Packages = pk
	})
	n := len(f.reg.requests())
	r = strict.raw(pkgGet(tgz))
	if r.status != 502 || r.header.Get("Moat-Reason") != string(ReasonPackageAddress) || !strings.Contains(r.body, netguard.ReasonLoopback) {
		t.Errorf("loopback upstream under the strict guard: %d %s", r.status, r.body)
	}
	if got := len(f.reg.requests()); got != n {
		t.Errorf("the strict guard let %d requests through", got-n)
	}
	if rq, fl := strict.records("package.requested"), strict.records("package.failed"); len(rq) != 1 || len(fl) != 1 || fl[0]["reason"] != string(ReasonPackageAddress) {
		t.Errorf("journal: requested %v failed %v", rq, fl)
	}
}

// FuzzGoZipHash: the module zip check reads upstream bytes; it never
// panics, and whenever it accepts a zip its hash is dirhash's over the
// zip's entries, computed here independently.
func FuzzGoZipHash(f *testing.F) {
	for _, files := range [][][2]string{
		{{"m@v1.0.0/go.mod", "module m\n"}, {"m@v1.0.0/a.go", "package m\n"}},
		{{"m@v1.0.0/", ""}, {"m@v1.0.0/x", "x"}},
	} {
		var buf bytes.Buffer
		zw := zip.NewWriter(&buf)
		for _, fl := range files {
			w, _ := zw.Create(fl[0])
			w.Write([]byte(fl[1]))
		}
		zw.Close()
		f.Add(buf.Bytes())
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := goZipHash(data, 1<<20)
		if err != nil {
			return
		}
		zr, zerr := zip.NewReader(bytes.NewReader(data), int64(len(data)))
		if zerr != nil {
			t.Fatalf("accepted a zip archive/zip cannot read: %v", zerr)
		}
		type entry struct{ name, sum string }
		var es []entry
		for _, zf := range zr.File {
			if m := zf.Mode(); m.Type() != 0 && !m.IsDir() {
				t.Fatalf("accepted entry %q of mode %s", zf.Name, m)
			}
			rc, err := zf.Open()
			if err != nil {
				t.Fatalf("accepted a zip whose %q does not open: %v", zf.Name, err)
			}
			h := sha256.New()
			_, err = io.Copy(h, rc)
			rc.Close()
			if err != nil {
				t.Fatalf("accepted a zip whose %q does not read: %v", zf.Name, err)
			}
			es = append(es, entry{zf.Name, fmt.Sprintf("%x", h.Sum(nil))})
		}
		slices.SortFunc(es, func(a, b entry) int { return strings.Compare(a.name, b.name) })
		sum := sha256.New()
		for _, e := range es {
			fmt.Fprintf(sum, "%s  %s\n", e.sum, e.name)
		}
		if want := "h1:" + base64.StdEncoding.EncodeToString(sum.Sum(nil)); got != want {
			t.Fatalf("hash %s, dirhash %s", got, want)
		}
	})
}
