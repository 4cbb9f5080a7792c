//go:build linux

package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/probekit"
	"github.com/moat-sandbox/moat/internal/reexec"
	"github.com/moat-sandbox/moat/internal/reexec/reexectest"
	"github.com/moat-sandbox/moat/internal/testenv"
)

// The e2e tests drive the real moat binary. MOAT_BIN names it (scripts/test
// builds it, with moat-kubernetes beside it); otherwise both are built
// once here.
var (
	buildOnce sync.Once
	builtBin  string
	buildErr  error
)

func TestMain(m *testing.M) {
	// The test binary doubles as the in-sandbox workload (probe_test.go),
	// and as the euid report that its fork and exec actions run.
	code := reexectest.Run(m, reexec.Helper{Name: helperArg, Main: helperMain},
		reexec.Helper{Name: probekit.EUIDHelper, Main: probekit.EUIDMain})
	if builtBin != "" {
		os.RemoveAll(filepath.Dir(builtBin))
	}
	os.Exit(code)
}

func moatBin(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("MOAT_BIN"); p != "" {
		return p
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "moat-e2e-bin-")
		if err != nil {
			buildErr = err
			return
		}
		os.Chmod(dir, 0o755)
		builtBin = filepath.Join(dir, "moat")
		// moat hands kubernetes commands to moat-kubernetes beside it.
		for _, b := range []struct{ out, pkg string }{
			{builtBin, "github.com/moat-sandbox/moat/cmd/moat"},
			{filepath.Join(dir, "moat-kubernetes"), "github.com/moat-sandbox/moat/cmd/moat-kubernetes"},
		} {
			cmd := exec.Command("go", "build", "-o", b.out, b.pkg)
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
			if out, err := cmd.CombinedOutput(); err != nil {
				buildErr = fmt.Errorf("go build %s: %v\n%s", b.pkg, err, out)
				return
			}
		}
	})
	if buildErr != nil {
		t.Fatalf("building moat (set MOAT_BIN to use a prebuilt one): %v", buildErr)
	}
	return builtBin
}

// needSandbox checks the host capabilities that the native backend needs.
func needSandbox(t *testing.T) {
	t.Helper()
	testenv.Need(t, runtime.GOOS == "linux", "the native backend is Linux-only")
	_, err := os.Stat("/proc/self/ns/user")
	testenv.Need(t, err == nil, "user namespaces are not available")
}

// env is one test's sandbox setup: a world-traversable directory holding a
// workspace, an audit directory and a copy of the test binary.
type env struct {
	t         *testing.T
	dir       string
	workspace string
	auditDir  string
	binDir    string
	probe     string // the test binary, copied where the sandbox may read it
	stateDir  string // MOAT_STATE_DIR for the lifecycle commands
}

func newEnv(t *testing.T) *env {
	t.Helper()
	needSandbox(t)
	dir, err := os.MkdirTemp("", "moat-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	e := &env{t: t, dir: dir,
		workspace: filepath.Join(dir, "workspace"),
		auditDir:  filepath.Join(dir, "audit"),
		binDir:    filepath.Join(dir, "bin"),
		stateDir:  filepath.Join(dir, "state"),
	}
	for _, d := range []string{e.workspace, e.binDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.Chmod(dir, 0o755)
	if os.Geteuid() == 0 {
		// As root the workload runs as host uid 65534 (DESIGN: a
		// root-owned workspace needs an idmapped mount); tests hand the
		// workspace to that uid, as the docs tell users to.
		if err := os.Chown(e.workspace, 65534, 65534); err != nil {
			t.Fatal(err)
		}
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	e.probe = filepath.Join(e.binDir, "probe")
	copyFile(t, self, e.probe, 0o755)
	return e
}

func copyFile(t *testing.T, src, dst string, mode os.FileMode) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

// policy writes a policy file granting the usual system directories
// read-only, the probe's directory read-only and the workspace read-write.
func (e *env) policy(extra string) string {
	e.t.Helper()
	return e.policyAt(filepath.Join(e.dir, "policy.yaml"), e.workspace, extra)
}

// policyAt writes a policy like policy's, with its own workspace, to p.
func (e *env) policyAt(p, workspace, extra string) string {
	e.t.Helper()
	y := fmt.Sprintf(`version: 1
filesystem:
  read_only: [/usr, /bin, /lib, /lib64, %s]
  read_write: [%s]
process:
  env: {PATH: /usr/bin:/bin}
audit:
  dir: %s
%s`, e.binDir, workspace, e.auditDir, extra)
	if err := os.WriteFile(p, []byte(y), 0o644); err != nil {
		e.t.Fatal(err)
	}
	return p
}

// newWorkspace makes another workspace in the test's directory, owned as
// newEnv's is.
func (e *env) newWorkspace(name string) string {
	e.t.Helper()
	ws := filepath.Join(e.dir, name)
	if err := os.Mkdir(ws, 0o755); err != nil {
		e.t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		if err := os.Chown(ws, 65534, 65534); err != nil {
			e.t.Fatal(err)
		}
	}
	return ws
}

type result struct {
	stdout, stderr string
	code           int
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\n--- stdout\n%s--- stderr\n%s", r.code, r.stdout, r.stderr)
}

// moat runs the moat binary with args and returns what it printed.
func (e *env) moat(args ...string) result {
	e.t.Helper()
	cmd := e.command(args...)
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		e.t.Fatalf("running moat: %v", err)
	}
	return result{so.String(), se.String(), code}
}

// command prepares a moat command in the test's directory and state.
func (e *env) command(args ...string) *exec.Cmd {
	cmd := exec.Command(moatBin(e.t), args...)
	cmd.Dir = e.dir
	cmd.Env = append(os.Environ(), "MOAT_STATE_DIR="+e.stateDir)
	return cmd
}

// helper runs one helper action of the probe inside the sandbox.
func (e *env) helper(pol string, action string, args ...string) result {
	e.t.Helper()
	a := append([]string{"run", "--policy", pol, "--", e.probe, helperArg, action}, args...)
	return e.moat(a...)
}

// waitFor polls cond until it is true or the deadline passes.
func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if cond() {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("timed out after %v waiting for %s", d, what)
}

func mustContain(t *testing.T, r result, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(r.stdout, w) {
			t.Errorf("stdout lacks %q\n%s", w, r)
		}
	}
}
