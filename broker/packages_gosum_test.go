package broker

import (
	"archive/zip"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/internal/testenv"
	"github.com/moat-sandbox/moat/policy"
)

// TestGoHashes: hash1 agrees with the go command's hashes of real
// modules (the module cache's files of two modules this repository
// uses, their go.sum lines from its go.sum); a changed byte changes it.
func TestGoHashes(t *testing.T) {
	read := func(n string) []byte {
		b, err := os.ReadFile(filepath.Join("testdata", "gosum", n))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	sum, err := ParseGoSum("go.sum", read("moat.go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	pin := func(m, v string) GoPin {
		for _, p := range sum {
			if p.Module == m && p.Version == v {
				return p
			}
		}
		t.Fatalf("%s %s not in go.sum", m, v)
		return GoPin{}
	}
	oa := pin("cloud.google.com/go/auth/oauth2adapt", "v0.2.3")
	if h := goModHash(read("oauth2adapt-v0.2.3.mod")); h != oa.ModHash {
		t.Errorf("go.mod hash %s, go.sum %s", h, oa.ModHash)
	}
	z := read("oauth2adapt-v0.2.3.zip")
	if h, err := goZipHash(z, maxGoZipContent); err != nil || h != oa.ZipHash {
		t.Errorf("zip hash %s %v, go.sum %s", h, err, oa.ZipHash)
	}
	if h := goModHash(read("sys-v0.50.0.mod")); h != pin("golang.org/x/sys", "v0.50.0").ModHash {
		t.Errorf("x/sys go.mod hash %s", h)
	}
	if h := goModHash(append(read("sys-v0.50.0.mod"), ' ')); h == pin("golang.org/x/sys", "v0.50.0").ModHash {
		t.Error("a changed go.mod has the same hash")
	}
	if _, err := goZipHash(z, 100); err == nil {
		t.Error("the content cap was not applied")
	}
	if _, err := goZipHash([]byte("not a zip"), maxGoZipContent); err == nil {
		t.Error("not a zip hashed")
	}
}

func TestParseGoSum(t *testing.T) {
	h := "h1:" + strings.Repeat("A", 43) + "="
	h2 := "h1:" + strings.Repeat("B", 43) + "="
	pins, err := ParseGoSum("go.sum", []byte("example.com/A v1.0.0 "+h+"\nexample.com/A v1.0.0/go.mod "+h2+"\r\n\nexample.com/b v0.0.0-20200101000000-abcdefabcdef/go.mod "+h+"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(pins) != 2 || pins[0].ZipHash != h || pins[0].ModHash != h2 || pins[1].ZipHash != "" || pins[1].Module != "example.com/b" {
		t.Errorf("pins %+v", pins)
	}
	for _, c := range []struct{ in, want string }{
		{"example.com/a v1.0.0", "malformed"},
		{"example.com/a v1.0.0 h2:xyz", "not h1"},
		{"example.com/a v1.0.0 h1:AAAA", "not an h1 hash"},
		{"example.com/a 1.0.0 " + h, "not a module version"},
		{"example.com/../a v1.0.0 " + h, "dotted element"},
		{"example.com/a%2f v1.0.0 " + h, "holds byte"},
		{"example.com/a v1.0.0 " + h + "\nexample.com/a v1.0.0 " + h2, "two different hashes"},
	} {
		if _, err := ParseGoSum("go.sum", []byte(c.in)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want %q", c.in, err, c.want)
		}
	}
	for _, c := range []struct{ raw, esc string }{{"github.com/BurntSushi/toml", "github.com/!burnt!sushi/toml"}, {"v1.0.0-RC1", "v1.0.0-!r!c1"}} {
		if got := goEscape(c.raw); got != c.esc {
			t.Errorf("goEscape(%q) = %q", c.raw, got)
		}
		if got, ok := goUnescape(c.esc); !ok || got != c.raw {
			t.Errorf("goUnescape(%q) = %q %v", c.esc, got, ok)
		}
	}
	for _, bad := range []string{"github.com/Burnt", "a!", "a!B", "a!!b"} {
		if _, ok := goUnescape(bad); ok {
			t.Errorf("goUnescape(%q) accepted", bad)
		}
	}
}

// FuzzGoSum: no input panics; every pin of an accepted go.sum is well
// formed and carries at least one h1 hash.
func FuzzGoSum(f *testing.F) {
	b, err := os.ReadFile("testdata/gosum/moat.go.sum")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Add([]byte("example.com/a v1.0.0/go.mod h1:" + strings.Repeat("A", 43) + "=\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		pins, err := ParseGoSum("go.sum", data)
		if err != nil {
			return
		}
		for _, p := range pins {
			if checkGoModule(p.Module) != "" || checkGoVersion(p.Version) != "" || (p.ZipHash == "" && p.ModHash == "") ||
				(p.ZipHash != "" && checkH1(p.ZipHash) != "") || (p.ModHash != "" && checkH1(p.ModHash) != "") {
				t.Fatalf("malformed pin %+v", p)
			}
			if u, ok := goUnescape(goEscape(p.Module)); !ok || u != p.Module {
				t.Fatalf("escape round trip of %q: %q", p.Module, u)
			}
		}
	})
}

// goModule builds a module zip as the go command expects it.
func goModule(t testing.TB, mod, ver, code string) (gomod, zipData []byte) {
	t.Helper()
	gomod = []byte("module " + mod + "\n\ngo 1.21\n")
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, f := range [][2]string{{"go.mod", string(gomod)}, {"demo.go", code}} {
		w, err := zw.Create(mod + "@" + ver + "/" + f[0])
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte(f[1]))
	}
	zw.Close()
	return gomod, buf.Bytes()
}

// goFixture: a registry serving example.com/demo v1.0.0 (pinned) and
// v1.1.0 (not), example.com/Upper v0.1.0 (pinned; escaped paths) and a
// typosquat example.com/dem0, with a go.sum pinning the two modules.
type goFixture struct {
	reg   *fakeRegistry
	gosum string
	sum   []byte
	pins  []GoPin
	zips  map[string][]byte
}

func newGoFixture(t *testing.T) *goFixture {
	t.Helper()
	f := &goFixture{reg: &fakeRegistry{files: map[string][]byte{}, tampered: map[string][]byte{}}, zips: map[string][]byte{}}
	f.reg.srv = newTLSRegistry(t, f.reg)
	var sum strings.Builder
	for _, m := range []struct {
		mod, ver string
		pinned   bool
	}{{"example.com/demo", "v1.0.0", true}, {"example.com/demo", "v1.1.0", false}, {"example.com/Upper", "v0.1.0", true}, {"example.com/dem0", "v1.0.0", false}} {
		gomod, z := goModule(t, m.mod, m.ver, "package demo\n\nconst V = "+fmt.Sprintf("%q", m.mod+"@"+m.ver)+"\n")
		base := "/" + goEscape(m.mod) + "/@v/" + goEscape(m.ver)
		f.reg.files[base+".mod"] = gomod
		f.reg.files[base+".zip"] = z
		f.zips[m.mod+"@"+m.ver] = z
		if m.pinned {
			zh, err := goZipHash(z, maxGoZipContent)
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&sum, "%s %s %s\n%s %s/go.mod %s\n", m.mod, m.ver, zh, m.mod, m.ver, goModHash(gomod))
		}
	}
	f.sum = []byte(sum.String())
	f.gosum = filepath.Join(t.TempDir(), "go.sum")
	os.WriteFile(f.gosum, f.sum, 0o644)
	pins, err := ParseGoSum(f.gosum, f.sum)
	if err != nil {
		t.Fatal(err)
	}
	f.pins = pins
	return f
}

func (f *goFixture) harness(t *testing.T) *harness {
	t.Helper()
	fp := newFakeProvider(t, false)
	h := startBroker(t, fp, testPolicy(fp.srv.URL, 10), nil, func(c *Config) {
		pk, err := NewPackages(PackagesConfig{
			Grants:  []policy.PackageGrant{{Kind: policy.PackageGoProxy, Upstream: f.reg.srv.URL, Lockfiles: []string{f.gosum}, LockfileTrust: policy.TrustPinned, MaxRequests: 100}},
			Go:      f.pins,
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

// TestPackagesGoProxy: pinned .mod and .zip are served after a durable
// package.requested and their h1 check; list and .info come from go.sum;
// the attacks are refused in the same setup.
func TestPackagesGoProxy(t *testing.T) {
	f := newGoFixture(t)
	h := f.harness(t)
	if r := h.raw(pkgGet("/pkg/goproxy/example.com/demo/@v/v1.0.0.zip")); r.status != 200 || r.body != string(f.zips["example.com/demo@v1.0.0"]) {
		t.Fatalf("pinned zip: %d %s", r.status, r.body)
	}
	if r := h.raw(pkgGet("/pkg/goproxy/example.com/!upper/@v/v0.1.0.mod")); r.status != 200 || !strings.HasPrefix(r.body, "module example.com/Upper") {
		t.Errorf("escaped .mod: %d %s", r.status, r.body)
	}
	// The go command sends '!' as %21: decoded; any other escape is refused.
	if r := h.raw(pkgGet("/pkg/goproxy/example.com/%21upper/@v/v0.1.0.mod")); r.status != 200 {
		t.Errorf("%%21 escape: %d %s", r.status, r.body)
	}
	if r := h.raw(pkgGet("/pkg/goproxy/example.com%2fdemo/@v/list")); r.status != 400 || r.header.Get("Moat-Reason") != string(ReasonPathTrick) {
		t.Errorf("%%2f escape: %d %s", r.status, r.body)
	}
	if r := h.raw(pkgGet("/pkg/goproxy/example.com/demo/@v/list")); r.status != 200 || r.body != "v1.0.0\n" {
		t.Errorf("list: %d %q", r.status, r.body)
	}
	if r := h.raw(pkgGet("/pkg/goproxy/example.com/demo/@v/v1.0.0.info")); r.status != 200 || r.body != `{"Version":"v1.0.0"}` {
		t.Errorf("info: %d %q", r.status, r.body)
	}
	rq := h.records("package.requested")
	if len(rq) != 3 || rq[0]["kind"] != "goproxy" || rq[0]["artifact"] != "zip" || rq[0]["name"] != "example.com/demo" || rq[0]["expected"] != f.pins[0].ZipHash && rq[0]["expected"] != f.pins[1].ZipHash {
		t.Errorf("package.requested %v", rq)
	}
	n := len(f.reg.requests())
	for _, c := range []struct {
		path   string
		reason Reason
	}{
		{"/pkg/goproxy/example.com/dem0/@v/v1.0.0.zip", ReasonPackageNotPinned},
		{"/pkg/goproxy/example.com/dem0/@v/list", ReasonPackageNotPinned},
		{"/pkg/goproxy/example.com/demo/@v/v1.1.0.zip", ReasonPackageVersion},
		{"/pkg/goproxy/example.com/demo/@v/v1.1.0.info", ReasonPackageVersion},
		{"/pkg/goproxy/example.com/demo/@latest", ReasonPackageEndpoint},
		{"/pkg/goproxy/sumdb/sum.golang.org/supported", ReasonPackageEndpoint},
		{"/pkg/goproxy/example.com/Upper/@v/v0.1.0.zip", ReasonPackageNotPinned},
	} {
		if r := h.raw(pkgGet(c.path)); r.header.Get("Moat-Reason") != string(c.reason) {
			t.Errorf("%s: %d %s, want %s", c.path, r.status, r.body, c.reason)
		}
	}
	if got := f.reg.requests(); len(got) != n {
		t.Errorf("refused requests reached the registry: %v", got[n:])
	}
	f.reg.mu.Lock()
	_, bad := goModule(t, "example.com/demo", "v1.0.0", "package demo\n\nfunc init() { panic(\"evil\") }\n")
	f.reg.tampered["/example.com/demo/@v/v1.0.0.zip"] = bad
	f.reg.mu.Unlock()
	if r := h.raw(pkgGet("/pkg/goproxy/example.com/demo/@v/v1.0.0.zip")); r.status != 502 || r.header.Get("Moat-Reason") != string(ReasonPackageDigest) || strings.Contains(r.body, "evil") {
		t.Errorf("tampered zip: %d %s", r.status, r.body)
	}
	h.j.verifyAll(t)
}

// TestPackagesGoClient: the real go command downloads the go.sum's
// modules through the broker, and fails on a tampered zip.
func TestPackagesGoClient(t *testing.T) {
	goBin, err := exec.LookPath("go")
	testenv.Need(t, err == nil, "the go command is not on PATH")
	f := newGoFixture(t)
	h := f.harness(t)
	run := func() (string, error) {
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module app\n\ngo 1.21\n\nrequire (\n\texample.com/demo v1.0.0\n\texample.com/Upper v0.1.0\n)\n"), 0o644)
		os.WriteFile(filepath.Join(dir, "go.sum"), f.sum, 0o644)
		cmd := exec.Command(goBin, "mod", "download", "all")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOPROXY=http://"+h.addr+"/pkg/goproxy", "GOSUMDB=off", "GOTOOLCHAIN=local", "GOFLAGS=-modcacherw",
			"GOMODCACHE="+filepath.Join(dir, "modcache"), "GONOSUMDB=", "GOPRIVATE=", "GONOPROXY=")
		out, err := cmd.CombinedOutput()
		if err != nil {
			return string(out), err
		}
		b, err := os.ReadFile(filepath.Join(dir, "modcache", "example.com", "demo@v1.0.0", "demo.go"))
		if err != nil || !strings.Contains(string(b), "example.com/demo@v1.0.0") {
			return string(out), fmt.Errorf("demo not downloaded: %v", err)
		}
		return string(out), nil
	}
	if out, err := run(); err != nil {
		t.Fatalf("go mod download: %v\n%s", err, out)
	}
	if c := h.records("package.completed"); len(c) != 4 {
		t.Errorf("%d package.completed, want the 2 zips and 2 go.mod files", len(c))
	}
	f.reg.mu.Lock()
	_, bad := goModule(t, "example.com/demo", "v1.0.0", "package demo\n\nconst V = \"evil\"\n")
	f.reg.tampered["/example.com/demo/@v/v1.0.0.zip"] = bad
	f.reg.mu.Unlock()
	if out, err := run(); err == nil {
		t.Fatalf("go mod download succeeded with a tampered zip:\n%s", out)
	}
	if fl := h.records("package.failed"); len(fl) == 0 || fl[len(fl)-1]["reason"] != string(ReasonPackageDigest) {
		t.Errorf("package.failed %v", fl)
	}
}
