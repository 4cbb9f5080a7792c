//go:build linux

package e2e

import (
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
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
	up := listenUpstream(t)
	whl := namedWheel(t, "demo_pkg", "1.0")
	tgz := pkgTarball(t, "demo-pkg", "1.0.0", "module.exports = 42;\n")
	whlSum := sha256.Sum256(whl)
	sha1Sum := sha1.Sum(tgz)
	sha512Sum := sha512.Sum512(tgz)
	base := "https://egress.test:" + up.port
	up.serve(func(w http.ResponseWriter, r *http.Request) {
		up.see(r.TLS.ServerName + " " + r.URL.Path)
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
	})
	writeFile(t, filepath.Join(e.workspace, "ca.pem"), up.caPEM)
	pol := e.policy(fmt.Sprintf("egress:\n  hosts:\n    - {host: egress.test, port: %s}\n", up.port))
	setPolicyEnv(t, pol, fmt.Sprintf("PATH: /usr/bin:/bin, WS: %s, P: \"%s\"", e.workspace, up.port))
	r := e.runHooks(t.Context(), bin, []string{"MOAT_TEST_HOSTS=egress.test=127.0.0.2;evil.test=127.0.0.2"},
		"run", "--policy", pol, "--", "/bin/sh", "-c", egressRegistryScript)
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
	paths := up.saw()
	for _, p := range paths {
		if !strings.HasPrefix(p, "egress.test ") {
			t.Errorf("the server saw %q (only egress.test is granted)", p)
		}
	}
	if len(paths) != 4 {
		t.Errorf("the server saw %v, want the index, the wheel, the packument and the tarball", paths)
	}
	if t.Failed() || testing.Verbose() {
		t.Logf("%s", r)
	}
}
