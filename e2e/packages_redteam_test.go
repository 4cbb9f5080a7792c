//go:build linux

package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/testenv"
)

// Red team of the lockfile-bound package route (issue 19), end to end;
// the broker-level attacks, and the list of those that did not work, are
// in broker/packages_redteam_test.go.

// redteamNPMScript installs the pinned hooked@1.0.0 by name (npm reads
// its packument), reports which install scripts ran, then plants a named
// pipe where the lockfile was, for the next run.
const redteamNPMScript = `
set -u
export HOME=/tmp npm_config_fetch_retries=0
mkdir -p /tmp/x && cd /tmp/x && echo '{"name":"x","version":"1.0.0"}' > package.json
npm install hooked@1.0.0 --cache /tmp/cache >/tmp/install.log 2>&1 && echo "installed" || echo "install failed"
[ -e node_modules/hooked/PWNED ] && echo "packument script ran"
[ -e node_modules/hooked/TARBALL_RAN ] && echo "tarball script ran"
rm -f "$WS/app/package-lock.json" && mkfifo "$WS/app/package-lock.json" && echo "fifo planted"
cat /tmp/install.log >&2
`

// TestPackagesRedteamNPM: inside a native sandbox, npm install of a pinned
// name whose upstream packument gives the pinned version install scripts
// its tarball does not have (manifest confusion) runs the tarball's own
// script, not the packument's. Then a named pipe takes the lockfile's
// place (planted by the workload where its backend lets it, else by the
// test): the next run is refused at once, saying why, instead of waiting
// on the pipe.
func TestPackagesRedteamNPM(t *testing.T) {
	_, err := exec.LookPath("npm")
	testenv.Need(t, err == nil, "npm is not installed (CI installs nodejs and npm)")
	bin := hooksBin(t)
	e := newEnv(t)
	tgz := tarGz(t,
		[2]string{"package/package.json", `{"name":"hooked","version":"1.0.0","main":"index.js","scripts":{"install":"node -e \"require('fs').writeFileSync('TARBALL_RAN','x')\""}}`},
		[2]string{"package/index.js", "module.exports = 'pinned';\n"})
	pwn := `node -e \"require('fs').writeFileSync('PWNED','x')\"`
	files := map[string][]byte{
		"/hooked/-/hooked-1.0.0.tgz": tgz,
		"/hooked": []byte(`{"name":"hooked","dist-tags":{"latest":"1.0.0"},"versions":{"1.0.0":{"name":"hooked","version":"1.0.0",` +
			`"scripts":{"preinstall":"` + pwn + `","install":"` + pwn + `"},"dist":{"tarball":"https://evil.test/hooked-1.0.0.tgz"}}}}`),
	}
	reg := startRegistry(t, files, preEffectSeen(e.auditDir))

	ws := e.workspace
	lock := `{"name":"app","version":"1.0.0","lockfileVersion":3,"requires":true,"packages":{"":{"name":"app","version":"1.0.0","dependencies":{"hooked":"1.0.0"}},` +
		`"node_modules/hooked":{"version":"1.0.0","resolved":"https://registry.npmjs.org/hooked/-/hooked-1.0.0.tgz","integrity":"` + sri512(tgz) + `","hasInstallScript":true}}}`
	appLock := filepath.Join(ws, "app", "package-lock.json")
	os.MkdirAll(filepath.Dir(appLock), 0o755)
	writeFile(t, appLock, lock)
	if os.Geteuid() == 0 {
		os.Chown(filepath.Dir(appLock), 65534, 65534)
	}
	sum := sha256.Sum256([]byte(lock))
	ca := filepath.Join(e.dir, "ca.pem")
	writeFile(t, ca, reg.caPEM)
	pol := e.policy(fmt.Sprintf(`egress:
  packages:
    - kind: npm
      upstream: https://127.0.0.2:%s
      ca_file: %s
      lockfiles: [%s]
      lockfile_sha256: {%s: %s}
`, reg.port, ca, appLock, appLock, hex.EncodeToString(sum[:])))
	setPolicyEnv(t, pol, "PATH: /usr/bin:/bin, WS: "+ws)
	runMoat := func(timeout time.Duration, argv ...string) result {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		r := e.runHooks(ctx, bin, nil, append([]string{"run", "--policy", pol, "--"}, argv...)...)
		if ctx.Err() != nil {
			t.Errorf("moat run %v did not end within %s", argv, timeout)
		}
		return r
	}
	r := runMoat(5*time.Minute, "/bin/sh", "-c", redteamNPMScript)
	if !strings.Contains(r.stdout, "installed\n") || strings.Contains(r.stdout, "install failed") {
		t.Fatalf("npm install of the pinned name: %s", r)
	}
	if strings.Contains(r.stdout, "packument script ran") {
		t.Errorf("npm ran the install script of the upstream's packument, which the pinned tarball does not have: %s", r)
	}
	if !strings.Contains(r.stdout, "tarball script ran") {
		t.Errorf("the pinned tarball's own install script did not run (positive control): %s", r)
	}
	if seen := reg.saw(); !slices.Contains(seen, "GET /hooked pre-effect=true") || !slices.Contains(seen, "GET /hooked/-/hooked-1.0.0.tgz pre-effect=true") || len(seen) != 2 {
		t.Errorf("the registry saw %v, want the packument and the tarball, each after its pre-effect record", seen)
	}
	if v := e.moat("audit", "verify", onlyRunDir(t, e.auditDir)); v.code != 0 {
		t.Errorf("audit verify: %s", v)
	}
	if !strings.Contains(r.stdout, "fifo planted") {
		// The native sandbox refuses mkfifo; another process that may
		// write the workspace (a second sandbox, a tool on the host)
		// can still do it: the test plants the pipe itself.
		t.Logf("the workload could not plant a named pipe; the test does")
		os.Remove(appLock)
		if err := syscall.Mkfifo(appLock, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	r2 := runMoat(time.Minute, "/bin/true")
	if r2.code == 0 || !strings.Contains(r2.stderr, "not a regular file") {
		t.Errorf("run with a named pipe in the lockfile's place: %s", r2)
	}
}
