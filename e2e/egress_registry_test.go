//go:build linux

package e2e

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/moat-sandbox/moat/internal/testenv"
)

// egressRegistryScript runs inside the sandbox: pip and npm, configured
// by nothing but moat's proxy variables and the test CA, fetch a package
// each from the test's registries through the egress port; then the
// same tools at a host the policy does not grant (refused).
const egressRegistryScript = `
set -u
cd "$WS"
export HOME=/tmp
pip download --no-cache-dir --no-deps --disable-pip-version-check --cert "$WS/ca.pem" \
  --index-url "https://egress.test:$P/simple/" -d "$WS/dl" demo-pkg >/tmp/pip.log 2>&1 && echo "pip ok $(ls "$WS/dl")" || { echo "pip failed"; cat /tmp/pip.log; }
pip download --no-cache-dir --no-deps --disable-pip-version-check --cert "$WS/ca.pem" --retries 0 --timeout 5 \
  --index-url "https://evil.test:$P/simple/" -d "$WS/dl2" demo-pkg >/tmp/pip2.log 2>&1 && echo "pip-ungranted fetched" || echo "pip-ungranted refused"
echo '{"name":"w","version":"1.0.0"}' > package.json
npm install --no-audit --no-fund --no-update-notifier --cache /tmp/npm-cache --cafile "$WS/ca.pem" \
  --registry "https://egress.test:$P/" demo-pkg >/tmp/npm.log 2>&1 && echo "npm ok $(cat node_modules/demo-pkg/index.js)" || { echo "npm failed"; cat /tmp/npm.log; }
npm install --no-audit --no-fund --no-update-notifier --cache /tmp/npm-cache2 --cafile "$WS/ca.pem" --fetch-retries 0 \
  --registry "https://evil.test:$P/" other-pkg >/tmp/npm2.log 2>&1 && echo "npm-ungranted fetched" || echo "npm-ungranted refused"
`

// TestEgressTunnelRegistries: pip download from a local HTTPS index and
// npm install from a local registry, inside a native sandbox, through
// the egress port (HTTPS_PROXY/PIP_PROXY/npm_config_https_proxy set by
// moat, the test CA given with --cert and --cafile); the same tools at an
// ungranted host in the same run are refused and reach nothing.
func TestEgressTunnelRegistries(t *testing.T) {
	for _, tool := range []string{"pip", "npm", "node"} {
		_, err := exec.LookPath(tool)
		testenv.Need(t, err == nil, tool+" is not installed")
	}
	bin := hooksBin(t)
	e := newEnv(t)
	caPEM, srvCert := egressTestCerts(t)
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	testenv.Need(t, err == nil, "cannot listen on 127.0.0.2")
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	whl := demoWheel(t)
	tgz := demoTarball(t)
	whlSum := sha256.Sum256(whl)
	sha1Sum := sha1.Sum(tgz)
	sha512Sum := sha512.Sum512(tgz)
	var mu sync.Mutex
	var paths []string
	base := "https://egress.test:" + port
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		paths = append(paths, r.TLS.ServerName+" "+r.URL.Path)
		mu.Unlock()
		switch r.URL.Path {
		case "/simple/demo-pkg/":
			fmt.Fprintf(w, `<!DOCTYPE html><html><body><a href="%s/files/demo_pkg-1.0-py3-none-any.whl#sha256=%s">demo_pkg-1.0-py3-none-any.whl</a></body></html>`, base, hex.EncodeToString(whlSum[:]))
		case "/files/demo_pkg-1.0-py3-none-any.whl":
			w.Write(whl)
		case "/demo-pkg":
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"name":"demo-pkg","dist-tags":{"latest":"1.0.0"},"versions":{"1.0.0":{"name":"demo-pkg","version":"1.0.0","dist":{"tarball":"%s/demo-pkg/-/demo-pkg-1.0.0.tgz","shasum":"%s","integrity":"sha512-%s"}}}}`,
				base, hex.EncodeToString(sha1Sum[:]), base64.StdEncoding.EncodeToString(sha512Sum[:]))
		case "/demo-pkg/-/demo-pkg-1.0.0.tgz":
			w.Write(tgz)
		default:
			http.NotFound(w, r)
		}
	}), TLSConfig: &tls.Config{Certificates: []tls.Certificate{srvCert}}}
	go srv.ServeTLS(ln, "", "")
	defer srv.Close()
	writeFile(t, filepath.Join(e.workspace, "ca.pem"), caPEM)
	pol := e.policy(fmt.Sprintf("egress:\n  hosts:\n    - {host: egress.test, port: %s}\n", port))
	writeFile(t, pol, strings.Replace(readFile(t, pol), "env: {PATH: /usr/bin:/bin}",
		fmt.Sprintf("env: {PATH: /usr/bin:/bin, WS: %s, P: \"%s\"}", e.workspace, port), 1))
	cmd := exec.Command(bin, "run", "--policy", pol, "--", "/bin/sh", "-c", egressRegistryScript)
	cmd.Dir = e.dir
	cmd.Env = append(os.Environ(), "MOAT_STATE_DIR="+e.stateDir, "MOAT_TEST_GLOBAL_ADDR=127.0.0.2",
		"MOAT_TEST_HOSTS=egress.test=127.0.0.2;evil.test=127.0.0.2")
	var so, se strings.Builder
	cmd.Stdout, cmd.Stderr = &so, &se
	cmd.Run()
	r := result{so.String(), se.String(), cmd.ProcessState.ExitCode()}
	for _, want := range []string{
		"pip ok demo_pkg-1.0-py3-none-any.whl\n", "pip-ungranted refused\n",
		"npm ok module.exports = 42;\n", "npm-ungranted refused\n",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("missing %q in the workload's output", want)
		}
	}
	// The refusals are moat's: the broker's refusal lines name the host.
	if n := strings.Count(r.stderr, "reason=egress_not_granted host=evil.test"); n < 2 {
		t.Errorf("%d egress_not_granted refusals of evil.test on stderr, want pip's and npm's", n)
	}
	mu.Lock()
	for _, p := range paths {
		if !strings.HasPrefix(p, "egress.test ") {
			t.Errorf("the server saw %q (only egress.test is granted)", p)
		}
	}
	if len(paths) != 4 {
		t.Errorf("the server saw %v, want the index, the wheel, the packument and the tarball", paths)
	}
	mu.Unlock()
	if t.Failed() || testing.Verbose() {
		t.Logf("%s", r)
	}
}

// demoWheel is a minimal wheel of demo-pkg 1.0.
func demoWheel(t *testing.T) []byte {
	t.Helper()
	var b bytes.Buffer
	z := zip.NewWriter(&b)
	files := [][2]string{
		{"demo_pkg/__init__.py", "VALUE = 42\n"},
		{"demo_pkg-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: demo-pkg\nVersion: 1.0\n"},
		{"demo_pkg-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: moat-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
	}
	var record strings.Builder
	for _, f := range files {
		w, _ := z.Create(f[0])
		w.Write([]byte(f[1]))
		sum := sha256.Sum256([]byte(f[1]))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", f[0], base64.RawURLEncoding.EncodeToString(sum[:]), len(f[1]))
	}
	record.WriteString("demo_pkg-1.0.dist-info/RECORD,,\n")
	w, _ := z.Create("demo_pkg-1.0.dist-info/RECORD")
	w.Write([]byte(record.String()))
	if err := z.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// demoTarball is an npm package tarball of demo-pkg 1.0.0.
func demoTarball(t *testing.T) []byte {
	t.Helper()
	var b bytes.Buffer
	gz := gzip.NewWriter(&b)
	tw := tar.NewWriter(gz)
	for _, f := range [][2]string{
		{"package/package.json", `{"name":"demo-pkg","version":"1.0.0","main":"index.js"}`},
		{"package/index.js", "module.exports = 42;\n"},
	} {
		tw.WriteHeader(&tar.Header{Name: f[0], Mode: 0o644, Size: int64(len(f[1])), Typeflag: tar.TypeReg})
		tw.Write([]byte(f[1]))
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := gz.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}
