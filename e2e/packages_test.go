//go:build linux

package e2e

import (
	"archive/zip"
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/internal/testenv"
)

// packagesScript runs inside the sandbox with nothing but moat's npm
// variables: npm ci of the pinned lockfile (the positive control), then
// the attacks, each in its own directory.
const packagesScript = `
set -u
export HOME=/tmp npm_config_fetch_retries=0
try() { # dir label command...
  d=$1; l=$2; shift 2
  cd "$d" && "$@" --cache "/tmp/cache-$l" >"/tmp/$l.log" 2>&1 && echo "$l installed $(cat node_modules/demo-pkg/index.js 2>/dev/null)" || echo "$l refused"
}
cp -r "$WS/app" /tmp/app; try /tmp/app ci npm ci
cp -r "$WS/bad" /tmp/bad; try /tmp/bad tampered npm ci
mkdir -p /tmp/t /tmp/n /tmp/l /tmp/p
for d in t n l; do echo '{"name":"t","version":"1.0.0"}' > /tmp/$d/package.json; done
try /tmp/t typosquat npm install dem0-pkg
try /tmp/n newer npm install demo-pkg@1.1.0
try /tmp/l latest npm install demo-pkg
echo '{"name":"pub-pkg","version":"1.0.0"}' > /tmp/p/package.json
echo "${npm_config_registry#http:}:_authToken=e2e-token" > /tmp/p/.npmrc
try /tmp/p publish npm publish
cp -r "$WS/app" /tmp/orig
# The workload rewrites its lockfile to pin a package of its choice.
cp "$WS/evil/package-lock.json" "$WS/app/package-lock.json.new" && mv -f "$WS/app/package-lock.json.new" "$WS/app/package-lock.json"
cp "$WS/evil/package.json" "$WS/app/package.json.new" && mv -f "$WS/app/package.json.new" "$WS/app/package.json"
rm -rf /tmp/e; cp -r "$WS/app" /tmp/e; try /tmp/e edited npm ci
# Positive control: what the lockfile pinned at start is still served.
try /tmp/orig after npm ci
cat /tmp/ci.log /tmp/latest.log >&2
`

func sri512(b []byte) string {
	s := sha512.Sum512(b)
	return "sha512-" + base64.StdEncoding.EncodeToString(s[:])
}

// npmProject writes package.json and a package-lock.json v3 pinning each
// name@version to its tarball's integrity, resolved on the public
// registry's host (moat fetches the path from the grant's upstream).
func npmProject(t *testing.T, dir string, pins map[string][]byte) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var deps, entries []string
	keys := make([]string, 0, len(pins))
	for k := range pins {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		name, version, _ := strings.Cut(k, "@")
		deps = append(deps, fmt.Sprintf("%q:%q", name, version))
		entries = append(entries, fmt.Sprintf(`"node_modules/%s":{"version":%q,"resolved":"https://registry.npmjs.org/%s/-/%s-%s.tgz","integrity":%q}`,
			name, version, name, name, version, sri512(pins[k])))
	}
	writeFile(t, filepath.Join(dir, "package.json"), `{"name":"app","version":"1.0.0","dependencies":{`+strings.Join(deps, ",")+`}}`)
	lock := `{"name":"app","version":"1.0.0","lockfileVersion":3,"requires":true,"packages":{"":{"name":"app","version":"1.0.0","dependencies":{` +
		strings.Join(deps, ",") + `}},` + strings.Join(entries, ",") + `}}`
	p := filepath.Join(dir, "package-lock.json")
	writeFile(t, p, lock)
	sum := sha256.Sum256([]byte(lock))
	return hex.EncodeToString(sum[:])
}

// TestPackagesNPM: a real npm ci inside a native sandbox installs the
// pinned lockfile through the broker's /pkg/npm/ (from a local TLS
// registry on 127.0.0.2); in the same run a tampered tarball, a
// typosquat, a version newer than the pin, a publish and a lockfile the
// workload rewrote are refused, none of them reaching the registry except
// the tampered tarball (fetched, checked, not served). The next run is
// refused: the rewritten lockfile no longer has the sha256 the policy
// pins.
func TestPackagesNPM(t *testing.T) {
	_, err := exec.LookPath("npm")
	testenv.Need(t, err == nil, "npm is not installed (CI installs nodejs and npm)")
	bin := hooksBin(t)
	e := newEnv(t)
	good := pkgTarball(t, "demo-pkg", "1.0.0", "module.exports = 'pinned';\n")
	newer := pkgTarball(t, "demo-pkg", "1.1.0", "module.exports = 'newer';\n")
	bad := pkgTarball(t, "bad-pkg", "1.0.0", "module.exports = 'honest';\n")
	evil := pkgTarball(t, "evil-pkg", "6.6.6", "module.exports = 'evil';\n")
	files := map[string][]byte{
		"/demo-pkg/-/demo-pkg-1.0.0.tgz": good,
		"/demo-pkg/-/demo-pkg-1.1.0.tgz": newer,
		"/bad-pkg/-/bad-pkg-1.0.0.tgz":   pkgTarball(t, "bad-pkg", "1.0.0", "require('child_process').exec('id');\n"),
		"/evil-pkg/-/evil-pkg-6.6.6.tgz": evil,
		"/dem0-pkg/-/dem0-pkg-1.0.0.tgz": good,
		"/demo-pkg": []byte(`{"name":"demo-pkg","dist-tags":{"latest":"1.1.0"},"versions":{` +
			`"1.0.0":{"name":"demo-pkg","version":"1.0.0","dist":{"tarball":"https://evil.test/demo-pkg-1.0.0.tgz","integrity":"` + sri512(newer) + `"}},` +
			`"1.1.0":{"name":"demo-pkg","version":"1.1.0","dist":{"tarball":"https://evil.test/demo-pkg-1.1.0.tgz","integrity":"` + sri512(newer) + `"}}}}`),
	}
	reg := startRegistry(t, files, preEffectSeen(e.auditDir))

	ws := e.workspace
	appSum := npmProject(t, filepath.Join(ws, "app"), map[string][]byte{"demo-pkg@1.0.0": good})
	badSum := npmProject(t, filepath.Join(ws, "bad"), map[string][]byte{"bad-pkg@1.0.0": bad})
	npmProject(t, filepath.Join(ws, "evil"), map[string][]byte{"demo-pkg@1.0.0": good, "evil-pkg@6.6.6": evil})
	if os.Geteuid() == 0 {
		os.Chown(filepath.Join(ws, "app"), 65534, 65534)
	}
	ca := filepath.Join(e.dir, "ca.pem")
	writeFile(t, ca, reg.caPEM)
	appLock, badLock := filepath.Join(ws, "app", "package-lock.json"), filepath.Join(ws, "bad", "package-lock.json")
	pol := e.policy(fmt.Sprintf(`egress:
  packages:
    - kind: npm
      upstream: https://127.0.0.2:%s
      ca_file: %s
      lockfiles: [%s, %s]
      lockfile_sha256: {%s: %s, %s: %s}
`, reg.port, ca, appLock, badLock, appLock, appSum, badLock, badSum))
	setPolicyEnv(t, pol, "PATH: /usr/bin:/bin, WS: "+ws)
	runMoat := func(argv ...string) result {
		return e.runHooks(t.Context(), bin, nil, append([]string{"run", "--policy", pol, "--"}, argv...)...)
	}
	r := runMoat("/bin/sh", "-c", packagesScript)
	for _, want := range []string{
		"ci installed module.exports = 'pinned';\n", "latest installed module.exports = 'pinned';\n",
		"tampered refused\n", "typosquat refused\n", "newer refused\n", "publish refused\n", "edited refused\n",
		"after installed module.exports = 'pinned';\n",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("missing %q in the workload's output", want)
		}
	}
	seen := reg.saw()
	for _, s := range seen {
		if !strings.HasSuffix(s, "pre-effect=true") || !strings.HasPrefix(s, "GET ") ||
			strings.Contains(s, "dem0-pkg") || strings.Contains(s, "1.1.0") || strings.Contains(s, "evil") || strings.Contains(s, "pub-pkg") {
			t.Errorf("the registry saw %q", s)
		}
	}
	if !slices.Contains(seen, "GET /demo-pkg/-/demo-pkg-1.0.0.tgz pre-effect=true") || !slices.Contains(seen, "GET /bad-pkg/-/bad-pkg-1.0.0.tgz pre-effect=true") {
		t.Errorf("the registry saw %v, want the pinned tarballs", seen)
	}
	dir := onlyRunDir(t, e.auditDir)
	if v := e.moat("audit", "verify", dir); v.code != 0 {
		t.Errorf("audit verify: %s", v)
	}
	var refused []string
	digest, lockRead := 0, 0
	for _, p := range journalPayloads(t, filepath.Join(dir, "journal.jsonl")) {
		switch p["type"] {
		case "run.started":
			// The digests of the lockfiles as they were at start, not
			// as the workload left them.
			lfs, _ := p["lockfiles"].([]any)
			for _, l := range lfs {
				lf, _ := l.(map[string]any)
				if (lf["path"] == appLock && lf["sha256"] == appSum || lf["path"] == badLock && lf["sha256"] == badSum) && lf["trust"] == "pinned" && lf["pins"] == float64(1) && lf["kind"] == "npm" {
					lockRead++
				}
			}
		case "package.lockfile":
			t.Errorf("package.lockfile record %v: the lockfiles belong in run.started", p)
		case "package.refused":
			name, _ := p["name"].(string)
			refused = append(refused, fmt.Sprint(p["method"], " ", name, " ", p["reason"]))
		case "package.failed":
			if p["reason"] == "package_digest_mismatch" {
				digest++
			}
		}
	}
	for _, want := range []string{"GET dem0-pkg package_not_pinned", "GET evil-pkg package_not_pinned", "PUT  method_not_allowed"} {
		if !slices.Contains(refused, want) {
			t.Errorf("package.refused %v lacks %q", refused, want)
		}
	}
	if digest == 0 {
		t.Errorf("no package.failed package_digest_mismatch for the tampered tarball")
	}
	if lockRead != 2 {
		t.Errorf("run.started lists %d lockfiles with their digests at start, want 2", lockRead)
	}
	if sum := sha256.Sum256([]byte(readFile(t, appLock))); hex.EncodeToString(sum[:]) == appSum {
		t.Errorf("the workload's rewrite of %s did not happen: the edit is not tested", appLock)
	}
	if t.Failed() || testing.Verbose() {
		t.Logf("%s\nregistry saw %v", r, seen)
	}
	// The next run: the lockfile the workload rewrote no longer has the
	// pinned sha256, so moat refuses to start.
	r2 := runMoat("/bin/true")
	if r2.code == 0 || !strings.Contains(r2.stderr, "the policy pins "+appSum) {
		t.Errorf("run after the lockfile was rewritten: %s", r2)
	}
}

// goModZip is a module zip and its go.mod, and their go.sum lines.
func goModZip(t *testing.T, mod, ver, code string) (gomod, z []byte, sumLines string) {
	t.Helper()
	gomod = []byte("module " + mod + "\n\ngo 1.21\n")
	files := map[string][]byte{mod + "@" + ver + "/go.mod": gomod, mod + "@" + ver + "/demo.go": []byte(code)}
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	var names []string
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		w, _ := zw.Create(n)
		w.Write(files[n])
	}
	zw.Close()
	h1 := func(names []string, get func(string) []byte) string {
		h := sha256.New()
		for _, n := range names {
			fmt.Fprintf(h, "%x  %s\n", sha256.Sum256(get(n)), n)
		}
		return "h1:" + base64.StdEncoding.EncodeToString(h.Sum(nil))
	}
	sumLines = fmt.Sprintf("%s %s %s\n%s %s/go.mod %s\n", mod, ver, h1(names, func(n string) []byte { return files[n] }),
		mod, ver, h1([]string{"go.mod"}, func(string) []byte { return gomod }))
	return gomod, buf.Bytes(), sumLines
}

const goProxyScript = `
set -u
export HOME=/tmp GOCACHE=/tmp/gocache GOTOOLCHAIN=local GOFLAGS=-modcacherw
dl() { # label dir
  rm -rf /tmp/modcache; cp -r "$WS/$2" "/tmp/$2"; cd "/tmp/$2" && GOMODCACHE=/tmp/modcache go mod download all >"/tmp/$1.log" 2>&1 \
    && echo "$1 downloaded $(cat /tmp/modcache/example.com/demo@v1.0.0/demo.go | tail -1)" || echo "$1 refused"
}
dl pinned app
dl tampered bad
dl unpinned squat
`

// TestPackagesGoProxy: the go command inside a native sandbox downloads
// the modules go.sum pins through /pkg/goproxy (GOPROXY set by moat)
// from a local TLS proxy; a tampered zip and a module go.sum does not
// pin are refused in the same run.
func TestPackagesGoProxy(t *testing.T) {
	bin := hooksBin(t)
	e := newEnv(t)
	goBin := "/usr/local/go/bin/go"
	_, err := os.Stat(goBin)
	testenv.Need(t, err == nil, "no Go toolchain at /usr/local/go")
	files := map[string][]byte{}
	gomod, z, demoSum := goModZip(t, "example.com/demo", "v1.0.0", "package demo\n\nconst V = \"pinned\"\n")
	files["/example.com/demo/@v/v1.0.0.mod"], files["/example.com/demo/@v/v1.0.0.zip"] = gomod, z
	gomod, _, badSum := goModZip(t, "example.com/bad", "v1.0.0", "package bad\n\nconst V = \"honest\"\n")
	_, badZip, _ := goModZip(t, "example.com/bad", "v1.0.0", "package bad\n\nconst V = \"evil\"\n")
	files["/example.com/bad/@v/v1.0.0.mod"], files["/example.com/bad/@v/v1.0.0.zip"] = gomod, badZip
	gomod, z, _ = goModZip(t, "example.com/dem0", "v1.0.0", "package dem0\n")
	files["/example.com/dem0/@v/v1.0.0.mod"], files["/example.com/dem0/@v/v1.0.0.zip"] = gomod, z
	reg := startRegistry(t, files, preEffectSeen(e.auditDir))
	ws := e.workspace
	project := func(dir, mod, sum string) string {
		os.MkdirAll(filepath.Join(ws, dir), 0o755)
		writeFile(t, filepath.Join(ws, dir, "go.mod"), "module app\n\ngo 1.21\n\nrequire "+mod+" v1.0.0\n")
		writeFile(t, filepath.Join(ws, dir, "go.sum"), sum)
		return filepath.Join(ws, dir, "go.sum")
	}
	appSum := project("app", "example.com/demo", demoSum)
	badGoSum := project("bad", "example.com/bad", badSum)
	project("squat", "example.com/dem0", demoSum) // go.sum lacks dem0: the workload's own edit
	ca := filepath.Join(e.dir, "ca.pem")
	writeFile(t, ca, reg.caPEM)
	pol := e.policy(fmt.Sprintf(`egress:
  packages:
    - kind: goproxy
      upstream: https://127.0.0.2:%s
      ca_file: %s
      lockfiles: [%s, %s]
      lockfile_trust: workspace
`, reg.port, ca, appSum, badGoSum))
	setPolicyEnv(t, pol, "PATH: /usr/local/go/bin:/usr/bin:/bin, WS: "+ws)
	r := e.runHooks(t.Context(), bin, nil, "run", "--policy", pol, "--", "/bin/sh", "-c", goProxyScript)
	for _, want := range []string{"pinned downloaded const V = \"pinned\"\n", "tampered refused\n", "unpinned refused\n"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("missing %q in the workload's output", want)
		}
	}
	if !strings.Contains(r.stderr, "lockfile_trust is workspace") {
		t.Errorf("moat did not announce lockfile_trust: workspace")
	}
	seen := reg.saw()
	for _, s := range seen {
		if !strings.HasSuffix(s, "pre-effect=true") || strings.Contains(s, "dem0") || strings.Contains(s, "uv_pkg-2.1") {
			t.Errorf("the proxy saw %q", s)
		}
	}
	if !slices.Contains(seen, "GET /example.com/demo/@v/v1.0.0.zip pre-effect=true") || !slices.Contains(seen, "GET /example.com/bad/@v/v1.0.0.zip pre-effect=true") {
		t.Errorf("the proxy saw %v, want the pinned zips", seen)
	}
	dir := onlyRunDir(t, e.auditDir)
	if v := e.moat("audit", "verify", dir); v.code != 0 {
		t.Errorf("audit verify: %s", v)
	}
	var squat, digest int
	for _, p := range journalPayloads(t, filepath.Join(dir, "journal.jsonl")) {
		if p["type"] == "package.refused" && p["name"] == "example.com/dem0" && p["reason"] == "package_not_pinned" {
			squat++
		}
		if p["type"] == "package.failed" && p["reason"] == "package_digest_mismatch" {
			digest++
		}
	}
	if squat == 0 || digest == 0 {
		t.Errorf("journal: %d refusals of example.com/dem0, %d digest mismatches; want both", squat, digest)
	}
	if t.Failed() || testing.Verbose() {
		t.Logf("%s\nproxy saw %v", r, seen)
	}
}

const pypiScript = `
set -u
export HOME=/tmp
pd() { # label requirements
  pip download --no-cache-dir --no-deps --disable-pip-version-check --retries 0 --require-hashes -r "$WS/$2" -d "/tmp/dl-$1" >"/tmp/$1.log" 2>&1 \
    && echo "$1 downloaded $(ls /tmp/dl-$1)" || echo "$1 refused"
}
pd pinned req-good.txt
pd tampered req-bad.txt
pd uvlock req-uv.txt
pd uvnewer req-uvnewer.txt
pip download --no-cache-dir --no-deps --disable-pip-version-check --retries 0 -d /tmp/dl-squat dem0-pkg >/tmp/squat.log 2>&1 && echo "squat downloaded" || echo "squat refused"
# A publish: twine uploads a wheel to the legacy upload endpoint next to
# the index moat set (upload.pypi.org/legacy/ on the public index).
PYTHON_KEYRING_BACKEND=keyring.backends.null.Keyring twine upload --non-interactive --disable-progress-bar \
  --repository-url "${PIP_INDEX_URL%simple/}legacy/" -u __token__ -p e2e-token "$WS/dist/pub_pkg-1.0-py3-none-any.whl" >/tmp/upload.log 2>&1 \
  && echo "upload accepted" || echo "upload refused"
sed 's/^/twine: /' /tmp/upload.log >&2
`

// TestPackagesPyPI: pip download --require-hashes inside a native
// sandbox (PIP_INDEX_URL set by moat) gets the pinned wheel through
// /pkg/pypi from a local TLS index; a tampered wheel and an unpinned
// name are refused in the same run. A uv.lock is a lockfile of the same
// grant: the wheel it pins is served, a newer version of that package
// (on the index, not in the lock) is not. A twine upload to the legacy
// endpoint next to the index is refused by the broker (journaled,
// method_not_allowed) and never reaches the index.
func TestPackagesPyPI(t *testing.T) {
	_, err := exec.LookPath("pip")
	testenv.Need(t, err == nil, "pip is not installed")
	_, err = exec.LookPath("twine")
	testenv.Need(t, err == nil, "twine is not installed (CI installs Debian's twine)")
	bin := hooksBin(t)
	e := newEnv(t)
	whl := namedWheel(t, "demo_pkg", "1.0")
	sum := sha256.Sum256(whl)
	good := hex.EncodeToString(sum[:])
	bad := strings.Repeat("0", 64) // pinned for other-pkg; the index serves different bytes
	files := map[string][]byte{
		"/files/demo_pkg-1.0-py3-none-any.whl":  whl,
		"/files/other_pkg-1.0-py3-none-any.whl": whl,
		"/simple/demo-pkg/":                     []byte(`<html><body><a href="/files/demo_pkg-1.0-py3-none-any.whl#sha256=` + good + `">demo_pkg-1.0-py3-none-any.whl</a></body></html>`),
		"/simple/other-pkg/":                    []byte(`<html><body><a href="/files/other_pkg-1.0-py3-none-any.whl#sha256=` + bad + `">other_pkg-1.0-py3-none-any.whl</a></body></html>`),
		"/simple/dem0-pkg/":                     []byte(`<html><body><a href="/files/demo_pkg-1.0-py3-none-any.whl#sha256=` + good + `">x</a></body></html>`),
	}
	uv20, uv21 := namedWheel(t, "uv_pkg", "2.0"), namedWheel(t, "uv_pkg", "2.1")
	hexSum := func(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }
	files["/files/uv_pkg-2.0-py3-none-any.whl"] = uv20
	files["/files/uv_pkg-2.1-py3-none-any.whl"] = uv21
	files["/simple/uv-pkg/"] = []byte(`<html><body><a href="/files/uv_pkg-2.0-py3-none-any.whl#sha256=` + hexSum(uv20) + `">uv_pkg-2.0-py3-none-any.whl</a>` +
		`<a href="/files/uv_pkg-2.1-py3-none-any.whl#sha256=` + hexSum(uv21) + `">uv_pkg-2.1-py3-none-any.whl</a></body></html>`)
	reg := startRegistry(t, files, preEffectSeen(e.auditDir))
	ws := e.workspace
	if err := os.MkdirAll(filepath.Join(ws, "dist"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(ws, "dist", "pub_pkg-1.0-py3-none-any.whl"), string(namedWheel(t, "pub_pkg", "1.0")))
	goodReq, badReq := filepath.Join(ws, "req-good.txt"), filepath.Join(ws, "req-bad.txt")
	writeFile(t, goodReq, "demo-pkg==1.0 --hash=sha256:"+good+"\n")
	writeFile(t, badReq, "other-pkg==1.0 --hash=sha256:"+bad+"\n")
	// The workload's requirements for the uv.lock's package (the grant
	// admits by the uv.lock, not by these).
	writeFile(t, filepath.Join(ws, "req-uv.txt"), "uv-pkg==2.0 --hash=sha256:"+hexSum(uv20)+"\n")
	writeFile(t, filepath.Join(ws, "req-uvnewer.txt"), "uv-pkg==2.1 --hash=sha256:"+hexSum(uv21)+"\n")
	uvDir := filepath.Join(e.dir, "uvproject")
	os.MkdirAll(uvDir, 0o755)
	uvLock := filepath.Join(uvDir, "uv.lock")
	writeFile(t, uvLock, `version = 1
revision = 2
requires-python = ">=3.8"

[[package]]
name = "app"
version = "0.1.0"
source = { editable = "." }
dependencies = [
    { name = "uv-pkg" },
]

[package.metadata]
requires-dist = [{ name = "uv-pkg", specifier = "==2.0" }]

[[package]]
name = "uv-pkg"
version = "2.0"
source = { registry = "https://pypi.org/simple" }
wheels = [
    { url = "https://files.pythonhosted.org/packages/00/00/uv_pkg-2.0-py3-none-any.whl", hash = "sha256:`+hexSum(uv20)+`", size = `+strconv.Itoa(len(uv20))+`, upload-time = "2026-01-01T00:00:00Z" },
]
`)
	ca := filepath.Join(e.dir, "ca.pem")
	writeFile(t, ca, reg.caPEM)
	pol := e.policy(fmt.Sprintf(`egress:
  packages:
    - kind: pypi
      upstream: https://127.0.0.2:%s
      ca_file: %s
      lockfiles: [%s, %s, %s]
      lockfile_trust: workspace
`, reg.port, ca, goodReq, badReq, uvLock))
	setPolicyEnv(t, pol, "PATH: /usr/bin:/bin, WS: "+ws)
	r := e.runHooks(t.Context(), bin, nil, "run", "--policy", pol, "--", "/bin/sh", "-c", pypiScript)
	for _, want := range []string{"pinned downloaded demo_pkg-1.0-py3-none-any.whl\n", "tampered refused\n", "squat refused\n",
		"uvlock downloaded uv_pkg-2.0-py3-none-any.whl\n", "uvnewer refused\n", "upload refused\n"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("missing %q in the workload's output", want)
		}
	}
	// twine failed on the broker's answer, not before sending (a missing
	// module, an unreadable wheel): it reports the 405 it was given.
	if !strings.Contains(r.stderr, "HTTPError: 405 Method Not Allowed") {
		t.Errorf("twine's output does not report the broker's 405")
	}
	seen := reg.saw()
	for _, s := range seen {
		if !strings.HasPrefix(s, "GET ") || !strings.HasSuffix(s, "pre-effect=true") || strings.Contains(s, "dem0") || strings.Contains(s, "uv_pkg-2.1") ||
			strings.Contains(s, "legacy") || strings.Contains(s, "pub_pkg") {
			t.Errorf("the index saw %q", s)
		}
	}
	if !slices.Contains(seen, "GET /files/demo_pkg-1.0-py3-none-any.whl pre-effect=true") || !slices.Contains(seen, "GET /files/uv_pkg-2.0-py3-none-any.whl pre-effect=true") {
		t.Errorf("the index saw %v, want the pinned wheel", seen)
	}
	// The upload's refusal is journaled with its reason and why; the
	// pinned wheel of the same run was served.
	dir := onlyRunDir(t, e.auditDir)
	if v := e.moat("audit", "verify", dir); v.code != 0 {
		t.Errorf("audit verify: %s", v)
	}
	uploads := 0
	pinned := map[any]bool{} // request_id of the pinned wheel's fetch -> completed
	for _, p := range journalPayloads(t, filepath.Join(dir, "journal.jsonl")) {
		switch p["type"] {
		case "package.refused":
			if p["method"] != "POST" {
				continue
			}
			detail, _ := p["detail"].(string)
			if p["kind"] == "pypi" && p["reason"] == "method_not_allowed" && strings.Contains(detail, `method "POST" is refused`) &&
				strings.Contains(detail, "only installs what the lockfiles pin") && strings.Contains(detail, "no publish") {
				uploads++
			} else {
				t.Errorf("package.refused for the POST: %v", p)
			}
		case "package.requested":
			if path, _ := p["path"].(string); strings.Contains(path, "pub_pkg") || strings.Contains(path, "legacy") {
				t.Errorf("package.requested for the upload: %v", p)
			}
			if path, _ := p["path"].(string); p["name"] == "demo-pkg" && p["artifact"] == "file" && p["expected"] == "sha256:"+good &&
				strings.HasSuffix(path, "/files/demo_pkg-1.0-py3-none-any.whl") {
				pinned[p["request_id"]] = false
			}
		case "package.completed":
			if _, ok := pinned[p["request_id"]]; ok && p["body_sha256"] == good {
				pinned[p["request_id"]] = true
			}
		}
	}
	if uploads == 0 {
		t.Errorf("no package.refused POST method_not_allowed naming why, for the twine upload")
	}
	if !slices.Contains(slices.Collect(maps.Values(pinned)), true) {
		t.Errorf("no package.requested/package.completed of the pinned wheel in the run that refused the upload (%v)", pinned)
	}
	if t.Failed() || testing.Verbose() {
		t.Logf("%s\nindex saw %v", r, seen)
	}
}

// npmLock is a package-lock.json v3 with one entry per pin: key (the
// node_modules path), name, version and tarball, resolved on the public
// registry's host.
type npmLockEntry struct {
	key, name, version string
	tgz                []byte
}

func npmLock(entries ...npmLockEntry) string {
	var parts []string
	for _, e := range entries {
		base := e.name[strings.LastIndex(e.name, "/")+1:]
		parts = append(parts, fmt.Sprintf(`"%s":{"version":%q,"resolved":"https://registry.npmjs.org/%s/-/%s-%s.tgz","integrity":%q}`,
			e.key, e.version, e.name, base, e.version, sri512(e.tgz)))
	}
	return `{"name":"app","version":"1.0.0","lockfileVersion":3,"requires":true,"packages":{"":{"name":"app","version":"1.0.0"},` + strings.Join(parts, ",") + `}}`
}

// reloadScript installs each "label module spec" given in $TRY inside a
// fresh project (npm resolves through the filtered packuments) and says
// whether it was installed, with the module's code.
const reloadScript = `
set -u
export HOME=/tmp npm_config_fetch_retries=0
echo "$TRY" | while read -r l m spec; do
  [ -n "$l" ] || continue
  d=/tmp/w-$l; rm -rf "$d"; mkdir -p "$d"; cd "$d"
  echo '{"name":"t","version":"1.0.0"}' > package.json
  if npm install "$spec" --cache "/tmp/cache-$l" --no-audit --no-fund >"/tmp/$l.log" 2>&1; then
    echo "$l installed $(cat node_modules/$m/index.js)"
  else
    echo "$l refused"
  fi
done
`

// TestPackagesReload: moat sandbox reload-lockfiles (issue 19). A sandbox
// admits what its lockfiles pinned at creation (run.started's digests);
// scoped packages resolve through their packuments (@scope%2fname),
// while the same name under another scope and a typosquat are refused.
// The operator pins a newer version in a lockfile outside every writable
// grant and reloads: the newly pinned version is served (positive). The
// workload rewrites a lockfile whose sha256 the policy pins and the
// operator reloads: refused for trust, journaled, and the set in force
// is kept (the version pinned by the first reload is still served, the
// workload's pin is not). The journal verifies and records both reloads
// with old and new digests and who asked.
func TestPackagesReload(t *testing.T) {
	_, err := exec.LookPath("npm")
	testenv.Need(t, err == nil, "npm is not installed (CI installs nodejs and npm)")
	bin := hooksBin(t)
	e := newEnv(t)
	v1 := pkgTarball(t, "demo-pkg", "1.0.0", "module.exports = 'v1';\n")
	v2 := pkgTarball(t, "demo-pkg", "1.1.0", "module.exports = 'v2';\n")
	good := pkgTarball(t, "@good/util", "1.0.0", "module.exports = 'good';\n")
	evilScoped := pkgTarball(t, "@evil/util", "1.0.0", "module.exports = 'evil';\n")
	evil := pkgTarball(t, "evil-pkg", "6.6.6", "module.exports = 'evil';\n")
	version := func(name, ver string, tgz []byte) string {
		base := name[strings.LastIndex(name, "/")+1:]
		return fmt.Sprintf(`%q:{"name":%q,"version":%q,"dist":{"tarball":"https://registry.npmjs.org/%s/-/%s-%s.tgz","integrity":%q}}`, ver, name, ver, name, base, ver, sri512(tgz))
	}
	files := map[string][]byte{
		"/demo-pkg/-/demo-pkg-1.0.0.tgz": v1,
		"/demo-pkg/-/demo-pkg-1.1.0.tgz": v2,
		"/@good/util/-/util-1.0.0.tgz":   good,
		"/@evil/util/-/util-1.0.0.tgz":   evilScoped,
		"/@good/utill/-/utill-1.0.0.tgz": evilScoped,
		"/evil-pkg/-/evil-pkg-6.6.6.tgz": evil,
		"/demo-pkg":                      []byte(`{"name":"demo-pkg","dist-tags":{"latest":"1.1.0"},"versions":{` + version("demo-pkg", "1.0.0", v1) + "," + version("demo-pkg", "1.1.0", v2) + `}}`),
		"/@good/util":                    []byte(`{"name":"@good/util","dist-tags":{"latest":"1.0.0"},"versions":{` + version("@good/util", "1.0.0", good) + `}}`),
		"/@evil/util":                    []byte(`{"name":"@evil/util","dist-tags":{"latest":"1.0.0"},"versions":{` + version("@evil/util", "1.0.0", evilScoped) + `}}`),
		"/@good/utill":                   []byte(`{"name":"@good/utill","dist-tags":{"latest":"1.0.0"},"versions":{` + version("@good/utill", "1.0.0", evilScoped) + `}}`),
		"/evil-pkg":                      []byte(`{"name":"evil-pkg","dist-tags":{"latest":"6.6.6"},"versions":{` + version("evil-pkg", "6.6.6", evil) + `}}`),
	}
	reg := startRegistry(t, files, func(r *http.Request) string { return r.Method + " " + r.URL.Path })

	// The operator's lockfile lies outside every grant; the workspace's
	// is pinned by sha256.
	opDir := filepath.Join(e.dir, "locks")
	os.MkdirAll(opDir, 0o755)
	opLock := filepath.Join(opDir, "package-lock.json")
	start := npmLock(npmLockEntry{"node_modules/demo-pkg", "demo-pkg", "1.0.0", v1}, npmLockEntry{"node_modules/@good/util", "@good/util", "1.0.0", good})
	writeFile(t, opLock, start)
	wsDir := filepath.Join(e.workspace, "pinned")
	os.MkdirAll(wsDir, 0o755)
	wsLock := filepath.Join(wsDir, "package-lock.json")
	wsText := npmLock(npmLockEntry{"node_modules/@good/util", "@good/util", "1.0.0", good})
	writeFile(t, wsLock, wsText)
	if os.Geteuid() == 0 {
		os.Chown(wsDir, 65534, 65534)
		os.Chown(wsLock, 65534, 65534)
	}
	hex256 := func(s string) string { h := sha256.Sum256([]byte(s)); return hex.EncodeToString(h[:]) }
	startSum, wsSum := hex256(start), hex256(wsText)
	ca := filepath.Join(e.dir, "ca.pem")
	writeFile(t, ca, reg.caPEM)
	pol := e.policy(fmt.Sprintf(`egress:
  packages:
    - kind: npm
      upstream: https://127.0.0.2:%s
      ca_file: %s
      lockfiles: [%s, %s]
      lockfile_sha256: {%s: %s}
`, reg.port, ca, opLock, wsLock, wsLock, wsSum))
	setPolicyEnv(t, pol, "PATH: /usr/bin:/bin, WS: "+e.workspace)
	moat := func(env []string, args ...string) result { return e.runHooks(t.Context(), bin, env, args...) }
	const name = "pkgreload"
	if r := moat(nil, "sandbox", "create", name, "--policy", pol); r.code != 0 {
		t.Fatalf("sandbox create: %s", r)
	}
	defer moat(nil, "sandbox", "delete", name, "--ignore-not-found")
	try := func(lines ...string) result {
		t.Helper()
		return moat(nil, "sandbox", "exec", name, "--", "/usr/bin/env", "TRY="+strings.Join(lines, "\n"), "/bin/sh", "-c", reloadScript)
	}
	expect := func(step string, r result, want ...string) {
		t.Helper()
		for _, w := range want {
			if !strings.Contains(r.stdout, w+"\n") {
				t.Errorf("%s: missing %q in the workload's output:\n%s", step, w, r)
			}
		}
	}

	r := try("pinned demo-pkg demo-pkg@1.0.0", "newer demo-pkg demo-pkg@1.1.0", "scoped @good/util @good/util@1.0.0",
		"confused @evil/util @evil/util@1.0.0", "squat @good/utill @good/utill@1.0.0")
	expect("at start", r, "pinned installed module.exports = 'v1';", "newer refused", "scoped installed module.exports = 'good';",
		"confused refused", "squat refused")
	for _, s := range reg.saw() {
		if strings.Contains(s, "1.1.0") || strings.Contains(s, "evil") || strings.Contains(s, "utill") {
			t.Errorf("before the reload the registry saw %q", s)
		}
	}

	// The operator pins 1.1.0 as well (outside every writable grant) and
	// reloads: applied; the newly pinned version is served.
	next := npmLock(npmLockEntry{"node_modules/demo-pkg", "demo-pkg", "1.1.0", v2}, npmLockEntry{"node_modules/x/node_modules/demo-pkg", "demo-pkg", "1.0.0", v1},
		npmLockEntry{"node_modules/@good/util", "@good/util", "1.0.0", good})
	writeFile(t, opLock, next)
	nextSum := hex256(next)
	if r := moat(nil, "sandbox", "reload-lockfiles", name, "-o", "json"); r.code != 0 || !strings.Contains(r.stdout, `"outcome": "applied"`) || !strings.Contains(r.stdout, nextSum) {
		t.Fatalf("reload-lockfiles: %s", r)
	}
	r = try("newer demo-pkg demo-pkg@1.1.0", "pinned demo-pkg demo-pkg@1.0.0")
	expect("after the reload", r, "newer installed module.exports = 'v2';", "pinned installed module.exports = 'v1';")

	// The workload rewrites the workspace lockfile to pin its own package;
	// the operator's reload is refused for trust and changes nothing.
	evilLock := npmLock(npmLockEntry{"node_modules/@good/util", "@good/util", "1.0.0", good}, npmLockEntry{"node_modules/evil-pkg", "evil-pkg", "6.6.6", evil})
	if r := moat(nil, "sandbox", "exec", name, "--", "/bin/sh", "-c", `printf '%s' "$1" > "$2"`, "sh", evilLock, wsLock); r.code != 0 {
		t.Fatalf("the workload's rewrite: %s", r)
	}
	r = moat(nil, "sandbox", "reload-lockfiles", name)
	if r.code != 125 || !strings.Contains(r.stderr, "the policy pins "+wsSum) || !strings.Contains(r.stdout, "outcome:") || !strings.Contains(r.stdout, "refused") {
		t.Errorf("reload after the workload's rewrite: %s", r)
	}
	// The workload cannot ask for a reload: the supervisor's control
	// socket is outside its filesystem view (the operator's reloads above
	// are the positive control; the journal holds only those two).
	sock := filepath.Join(e.stateDir, "sandboxes", name, "control.sock")
	if _, err := os.Stat(sock); err != nil {
		t.Fatalf("control socket: %v", err)
	}
	r = moat(nil, "sandbox", "exec", name, "--", "/usr/bin/node", "-e",
		`const s=require("net").connect(process.argv[1]);s.on("connect",()=>s.end(JSON.stringify({op:"reload-lockfiles"})+"\n"));`+
			`s.on("data",d=>console.log("control answered "+d));s.on("error",e=>console.log("control refused "+e.code));`, sock)
	if !strings.Contains(r.stdout, "control refused ") || strings.Contains(r.stdout, "answered") {
		t.Errorf("the workload reached the control socket: %s", r)
	}
	r = try("kept demo-pkg demo-pkg@1.1.0", "evil evil-pkg evil-pkg@6.6.6")
	expect("after the refused reload", r, "kept installed module.exports = 'v2';", "evil refused")
	for _, s := range reg.saw() {
		if strings.Contains(s, "evil") || strings.Contains(s, "utill") {
			t.Errorf("the registry saw %q", s)
		}
	}
	if !slices.Contains(reg.saw(), "GET /demo-pkg/-/demo-pkg-1.1.0.tgz") || !slices.Contains(reg.saw(), "GET /@good/util/-/util-1.0.0.tgz") {
		t.Errorf("the registry saw %v, want the newly pinned and the scoped tarball", reg.saw())
	}
	if r := moat(nil, "sandbox", "delete", name); r.code != 0 {
		t.Fatalf("sandbox delete: %s", r)
	}

	dir := onlyRunDir(t, e.auditDir)
	if v := e.moat("audit", "verify", dir); v.code != 0 {
		t.Errorf("audit verify: %s", v)
	}
	var reloads []string
	for _, p := range journalPayloads(t, filepath.Join(dir, "journal.jsonl")) {
		switch p["type"] {
		case "run.started":
			var got []string
			lfs, _ := p["lockfiles"].([]any)
			for _, l := range lfs {
				lf, _ := l.(map[string]any)
				got = append(got, fmt.Sprint(lf["path"], " ", lf["sha256"], " ", lf["pins"], " ", lf["trust"]))
			}
			want := []string{opLock + " " + startSum + " 2 pinned", wsLock + " " + wsSum + " 1 pinned"}
			if !slices.Equal(got, want) {
				t.Errorf("run.started lockfiles %q, want %q", got, want)
			}
		case "package.reload":
			requester, _ := p["requester"].(string)
			if !strings.HasPrefix(requester, "uid ") {
				t.Errorf("package.reload requester %q", requester)
			}
			s := fmt.Sprint(p["outcome"], " ", p["reason"])
			lfs, _ := p["lockfiles"].([]any)
			for _, l := range lfs {
				lf, _ := l.(map[string]any)
				s += fmt.Sprint(" ", lf["old_sha256"], "->", lf["sha256"])
			}
			reloads = append(reloads, s)
		}
	}
	want := []string{
		"applied <nil> " + startSum + "->" + nextSum + " " + wsSum + "->" + wsSum,
		"refused lockfile_untrusted " + nextSum + "->" + nextSum + " " + wsSum + "->" + hex256(evilLock),
	}
	if !slices.Equal(reloads, want) {
		t.Errorf("package.reload records:\n%q\nwant\n%q", reloads, want)
	}
}

// preEffectOnDisk checks an upstream package fetch as the registry's
// operator holding the journal would, at the moment the fetch arrives:
// its Moat-Pre-Effect-SHA256 is the SHA-256 of a complete line already in
// a run's journal under auditDir, that line is signed by the run's key
// (run.started's public_key) and is the package.requested of this very
// path, and the line itself (Moat-Pre-Effect, which names the executable
// and the lockfile's host path) is not sent. It returns "true" or why not.
func preEffectOnDisk(auditDir string, r *http.Request) string {
	if len(r.Header.Values("Moat-Pre-Effect")) > 0 {
		return "journal-line-sent"
	}
	d := r.Header.Get("Moat-Pre-Effect-SHA256")
	if len(d) != 64 || strings.Trim(d, "0123456789abcdef") != "" {
		return "no-digest"
	}
	journals, _ := filepath.Glob(filepath.Join(auditDir, "*", "journal.jsonl"))
	for _, j := range journals {
		b, err := os.ReadFile(j)
		if err != nil {
			continue
		}
		lines := bytes.Split(b, []byte("\n"))
		lines = lines[:len(lines)-1] // "" after the last LF, or a line not yet whole
		var pub ed25519.PublicKey
		for i, l := range lines {
			if i == 0 {
				if ent, err := audit.ParseLine(l); err == nil {
					if rs, ok := ent.Record.(audit.RunStarted); ok {
						pub, _ = audit.ParsePublicKeyPEM([]byte(rs.PublicKey))
					}
				}
			}
			if audit.LineHash(l) != d {
				continue
			}
			if pub == nil {
				return "no-run-key"
			}
			ent, err := audit.VerifyLine(l, pub)
			if err != nil {
				return "bad-signature"
			}
			rec, ok := ent.Record.(audit.PackageRequested)
			if !ok {
				return "not-package.requested"
			}
			path := rec.Path
			if u, err := url.Parse(rec.Path); err == nil && u.Scheme == "https" {
				path = u.EscapedPath()
			}
			if !strings.HasSuffix(r.URL.EscapedPath(), path) && !strings.HasSuffix(r.URL.Path, path) {
				return "record-of-" + rec.Path
			}
			return "true"
		}
	}
	return "not-in-journal"
}
