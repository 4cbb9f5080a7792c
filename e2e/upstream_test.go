//go:build linux

package e2e

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/moat-sandbox/moat/internal/testenv"
)

// The fixtures the egress and package tests share: a local TLS upstream
// on 127.0.0.2 (which the moat_test_hooks binary's guard counts as
// global), the registry that serves files from it, the package archives
// it serves, and the hooks binary's run with the test's variables.

// testUpstream is a local HTTPS server on 127.0.0.2 with a certificate
// of egressTestCerts, recording what it was asked.
type testUpstream struct {
	t     *testing.T
	ln    net.Listener
	port  string // its port, as a policy names it
	caPEM string // the CA that signed its certificate
	cert  tls.Certificate

	mu   sync.Mutex
	seen []string
}

// listenUpstream listens on 127.0.0.2 (the test is skipped where it
// cannot); serve starts the server.
func listenUpstream(t *testing.T) *testUpstream {
	t.Helper()
	caPEM, cert := egressTestCerts(t)
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	testenv.Need(t, err == nil, "cannot listen on 127.0.0.2")
	return &testUpstream{t: t, ln: ln, port: strconv.Itoa(ln.Addr().(*net.TCPAddr).Port), caPEM: caPEM, cert: cert}
}

// serve answers every request with h, over TLS, until the test ends.
func (u *testUpstream) serve(h http.HandlerFunc) {
	srv := &http.Server{Handler: h, TLSConfig: &tls.Config{Certificates: []tls.Certificate{u.cert}}}
	go srv.ServeTLS(u.ln, "", "")
	u.t.Cleanup(func() { srv.Close() })
}

// see records s as seen.
func (u *testUpstream) see(s string) {
	u.mu.Lock()
	u.seen = append(u.seen, s)
	u.mu.Unlock()
}

// saw is what it has recorded so far.
func (u *testUpstream) saw() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.seen...)
}

// startRegistry is a package registry's stand-in: it records each
// request as record says, then answers a GET of a path in files with its
// bytes and everything else with 404.
func startRegistry(t *testing.T, files map[string][]byte, record func(*http.Request) string) *testUpstream {
	t.Helper()
	u := listenUpstream(t)
	u.serve(func(w http.ResponseWriter, r *http.Request) {
		u.see(record(r))
		if b, ok := files[r.URL.Path]; ok && r.Method == http.MethodGet {
			w.Write(b)
			return
		}
		http.NotFound(w, r)
	})
	return u
}

// preEffectSeen records a request as "METHOD PATH pre-effect=…", with
// preEffectOnDisk's verdict on it against the journals under auditDir.
func preEffectSeen(auditDir string) func(*http.Request) string {
	return func(r *http.Request) string {
		return fmt.Sprintf("%s %s pre-effect=%s", r.Method, r.URL.Path, preEffectOnDisk(auditDir, r))
	}
}

// setPolicyEnv replaces the process.env that policy and policyAt write
// with env (the braces' content), failing the test where pol has none.
func setPolicyEnv(t *testing.T, pol, env string) {
	t.Helper()
	const def = "env: {PATH: /usr/bin:/bin}"
	y := readFile(t, pol)
	if !strings.Contains(y, def) {
		t.Fatalf("%s has no %q to replace", pol, def)
	}
	writeFile(t, pol, strings.Replace(y, def, "env: {"+env+"}", 1))
}

// runHooks runs the moat_test_hooks binary bin with args in e's directory
// and state, with 127.0.0.2 counted as a global address and env added,
// and returns what it printed; ctx ends it.
func (e *env) runHooks(ctx context.Context, bin string, env []string, args ...string) result {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = e.dir
	cmd.Env = append(append(os.Environ(), "MOAT_STATE_DIR="+e.stateDir, "MOAT_TEST_GLOBAL_ADDR=127.0.0.2"), env...)
	var so, se strings.Builder
	cmd.Stdout, cmd.Stderr = &so, &se
	cmd.Run()
	return result{so.String(), se.String(), cmd.ProcessState.ExitCode()}
}

// tarGz is a gzipped tar of regular files, each {name, content}.
func tarGz(t *testing.T, files ...[2]string) []byte {
	t.Helper()
	var b bytes.Buffer
	gz := gzip.NewWriter(&b)
	tw := tar.NewWriter(gz)
	for _, f := range files {
		if err := tw.WriteHeader(&tar.Header{Name: f[0], Mode: 0o644, Size: int64(len(f[1])), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(f[1])); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := gz.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// pkgTarball is an npm package tarball of name@version whose main module
// is code.
func pkgTarball(t *testing.T, name, version, code string) []byte {
	t.Helper()
	return tarGz(t,
		[2]string{"package/package.json", fmt.Sprintf(`{"name":%q,"version":%q,"main":"index.js"}`, name, version)},
		[2]string{"package/index.js", code})
}

// namedWheel is a pure-Python wheel of dist (a module of the same name)
// at version.
func namedWheel(t *testing.T, dist, version string) []byte {
	t.Helper()
	var b bytes.Buffer
	z := zip.NewWriter(&b)
	info := dist + "-" + version + ".dist-info/"
	files := [][2]string{
		{dist + "/__init__.py", "VALUE = " + strconv.Quote(version) + "\n"},
		{info + "METADATA", "Metadata-Version: 2.1\nName: " + strings.ReplaceAll(dist, "_", "-") + "\nVersion: " + version + "\n"},
		{info + "WHEEL", "Wheel-Version: 1.0\nGenerator: moat-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
	}
	var record strings.Builder
	for _, f := range files {
		w, _ := z.Create(f[0])
		w.Write([]byte(f[1]))
		sum := sha256.Sum256([]byte(f[1]))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", f[0], base64.RawURLEncoding.EncodeToString(sum[:]), len(f[1]))
	}
	record.WriteString(info + "RECORD,,\n")
	w, _ := z.Create(info + "RECORD")
	w.Write([]byte(record.String()))
	if err := z.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}
