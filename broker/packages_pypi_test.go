package broker

import (
	"archive/zip"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/internal/testenv"
	"github.com/moat-sandbox/moat/policy"
)

func TestParseRequirements(t *testing.T) {
	h1, h2 := strings.Repeat("a", 64), strings.Repeat("B", 64)
	in := "# comment\n--index-url https://pypi.org/simple\nRequests[socks]==2.31.0 ; python_version >= \"3.8\" \\\n    --hash=sha256:" + h1 + " \\\n    --hash sha256:" + h2 + "  # via app\n\nzope.interface==6.0 --hash=sha256:" + h1 + "\n"
	pins, err := ParseRequirements("requirements.txt", []byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(pins) != 2 || pins[0].Name != "requests" || pins[0].Version != "2.31.0" || len(pins[0].SHA256) != 2 || pins[0].SHA256[1] != strings.ToLower(h2) ||
		pins[1].Name != "zope-interface" {
		t.Errorf("pins %+v", pins)
	}
	for _, c := range []struct{ in, want string }{
		{"requests>=2.0 --hash=sha256:" + h1, "not pinned with =="},
		{"requests==2.31.0", "has no --hash"},
		{"requests==2.31.0 --hash=md5:abc", "not sha256"},
		{"requests==2.31.0 --hash=sha256:abc", "not sha256"},
		{"-r other.txt", "-r is not supported"},
		{"-e .", "-e is not supported"},
		{"pkg @ https://x.example/p.whl --hash=sha256:" + h1, "URL requirement"},
		{"p%kg==1.0 --hash=sha256:" + h1, "holds byte"},
		{"pkg===1.0 --hash=sha256:" + h1, "not pinned"},
		{"pkg==1.0 --no-binary :all: --hash=sha256:" + h1, "not supported"},
	} {
		if _, err := ParseRequirements("r", []byte(c.in)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want %q", c.in, err, c.want)
		}
	}
}

// FuzzRequirements: no input panics; every pin of an accepted file has a
// normalized name, a version and sha256 hashes.
func FuzzRequirements(f *testing.F) {
	seeds, _ := filepath.Glob("testdata/pypi/*.txt")
	for _, s := range seeds {
		b, err := os.ReadFile(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		pins, err := ParseRequirements("r", data)
		if err != nil {
			return
		}
		for _, p := range pins {
			if n, msg := normalizePyPIName(p.Name); msg != "" || n != p.Name || checkPyPIVersion(p.Version) != "" || len(p.SHA256) == 0 {
				t.Fatalf("malformed pin %+v", p)
			}
			for _, h := range p.SHA256 {
				if b, err := hex.DecodeString(h); err != nil || len(b) != 32 || strings.ToLower(h) != h {
					t.Fatalf("malformed hash %q", h)
				}
			}
		}
	})
}

// pyWheel is a minimal wheel of name==version.
func pyWheel(t testing.TB, name, version, value string) []byte {
	t.Helper()
	var b bytes.Buffer
	z := zip.NewWriter(&b)
	mod := strings.ReplaceAll(name, "-", "_")
	di := mod + "-" + version + ".dist-info/"
	files := [][2]string{
		{mod + "/__init__.py", "VALUE = " + value + "\n"},
		{di + "METADATA", "Metadata-Version: 2.1\nName: " + name + "\nVersion: " + version + "\n"},
		{di + "WHEEL", "Wheel-Version: 1.0\nGenerator: moat-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
	}
	var record strings.Builder
	for _, f := range files {
		w, _ := z.Create(f[0])
		w.Write([]byte(f[1]))
		sum := sha256.Sum256([]byte(f[1]))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", f[0], base64.RawURLEncoding.EncodeToString(sum[:]), len(f[1]))
	}
	record.WriteString(di + "RECORD,,\n")
	w, _ := z.Create(di + "RECORD")
	w.Write([]byte(record.String()))
	z.Close()
	return b.Bytes()
}

func hexSum(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

// TestPackagesPyPI: pip download --require-hashes through the broker
// gets the pinned wheel; the index page keeps only pinned links on
// allowed hosts; a tampered file, an unpinned name and an upload are
// refused.
func TestPackagesPyPI(t *testing.T) {
	reg := &fakeRegistry{files: map[string][]byte{}, tampered: map[string][]byte{}}
	reg.srv = newTLSRegistry(t, reg)
	good := pyWheel(t, "demo-pkg", "1.0", "42")
	newer := pyWheel(t, "demo-pkg", "1.1", "43")
	reg.files["/files/demo_pkg-1.0-py3-none-any.whl"] = good
	reg.files["/files/demo_pkg-1.1-py3-none-any.whl"] = newer
	reg.files["/simple/demo-pkg/"] = []byte(fmt.Sprintf(`<!DOCTYPE html><html><body>
<a href="../../files/demo_pkg-1.0-py3-none-any.whl#sha256=%s" data-requires-python="&gt;=3.7">demo_pkg-1.0-py3-none-any.whl</a>
<a href="/files/demo_pkg-1.1-py3-none-any.whl#sha256=%s">demo_pkg-1.1-py3-none-any.whl</a>
<a href="https://evil.example/demo_pkg-1.0-py3-none-any.whl#sha256=%s">evil</a>
</body></html>`, hexSum(good), hexSum(newer), hexSum(good)))
	reqs := "demo-pkg==1.0 --hash=sha256:" + hexSum(good) + "\n"
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
	// A file before its index page: refused, nothing fetched.
	if r := h.raw(pkgGet("/pkg/pypi/files/" + hexSum(good) + "/demo_pkg-1.0-py3-none-any.whl")); r.header.Get("Moat-Reason") != string(ReasonPackageNotPinned) {
		t.Errorf("file before index: %d %s", r.status, r.body)
	}
	r := h.raw(pkgGet("/pkg/pypi/simple/demo-pkg/"))
	if r.status != 200 || !strings.Contains(r.body, `href="/pkg/pypi/files/`+hexSum(good)+`/demo_pkg-1.0-py3-none-any.whl#sha256=`) ||
		strings.Contains(r.body, "1.1") || strings.Contains(r.body, "evil") {
		t.Fatalf("index: %d %s", r.status, r.body)
	}
	pip, err := exec.LookPath("pip")
	testenv.Need(t, err == nil, "pip is not installed (CI installs python3-pip)")
	download := func() (string, error) {
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "requirements.txt"), []byte(reqs), 0o644)
		cmd := exec.Command(pip, "download", "--no-cache-dir", "--no-deps", "--disable-pip-version-check", "--retries", "0",
			"--require-hashes", "-r", "requirements.txt", "-d", filepath.Join(dir, "dl"), "--index-url", "http://"+h.addr+"/pkg/pypi/simple/")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "PIP_CONFIG_FILE=/dev/null", "NO_PROXY=*")
		out, err := cmd.CombinedOutput()
		if err == nil {
			if b, rerr := os.ReadFile(filepath.Join(dir, "dl", "demo_pkg-1.0-py3-none-any.whl")); rerr != nil || !bytes.Equal(b, good) {
				return string(out), fmt.Errorf("wheel not downloaded: %v", rerr)
			}
		}
		return string(out), err
	}
	if out, err := download(); err != nil {
		t.Fatalf("pip download: %v\n%s", err, out)
	}
	n := len(reg.requests())
	for _, c := range []struct {
		in     string
		reason Reason
	}{
		{pkgGet("/pkg/pypi/simple/dem0-pkg/"), ReasonPackageNotPinned},
		{pkgGet("/pkg/pypi/simple/Demo_Pkg/"), ReasonPackageNotPinned},
		{pkgGet("/pkg/pypi/files/" + hexSum(newer) + "/demo_pkg-1.1-py3-none-any.whl"), ReasonPackageNotPinned},
		{"POST /pkg/pypi/legacy/ HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", ReasonMethod},
		{pkgGet("/pkg/pypi/pypi/demo-pkg/json"), ReasonPackageEndpoint},
	} {
		if r := h.raw(c.in); r.header.Get("Moat-Reason") != string(c.reason) {
			t.Errorf("%q: %d %s, want %s", c.in, r.status, r.body, c.reason)
		}
	}
	if got := reg.requests(); len(got) != n {
		t.Errorf("refused requests reached the registry: %v", got[n:])
	}
	reg.mu.Lock()
	reg.tampered["/files/demo_pkg-1.0-py3-none-any.whl"] = pyWheel(t, "demo-pkg", "1.0", "__import__('os').system('id')")
	reg.mu.Unlock()
	if out, err := download(); err == nil {
		t.Fatalf("pip download succeeded with a tampered wheel:\n%s", out)
	}
	if fl := h.records("package.failed"); len(fl) == 0 || fl[len(fl)-1]["reason"] != string(ReasonPackageDigest) {
		t.Errorf("package.failed %v", fl)
	}
	if len(reg.bad) > 0 {
		t.Errorf("requests without a journaled pre-effect line: %v", reg.bad)
	}
	h.j.verifyAll(t)
}
