// Package reexectest is the one way moat's tests re-run their own test
// binary: as a hidden helper (a sandbox init, a workload, a client that
// must be another process) or to run one test alone in a fresh process
// (after it installs a seccomp filter or Landlock ruleset that cannot be
// undone), in the way go-landlock's lltest.RunInSubprocess does.
//
// A package's TestMain is
//
//	func TestMain(m *testing.M) { reexectest.Main(m, helpers...) }
//
// where helpers are the package's own test helpers (named
// reexec.Prefix+"test-…") and any production helpers its tests start
// (internal/cli/hidden.go lists those for the moat binary). The helper's name
// is always the first argument; arguments, not environment variables, say
// what it does, since a sandbox gives its workload an environment of its
// own.
package reexectest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/internal/reexec"
)

// subprocessEnv names the test that RunInSubprocess runs in the child.
const subprocessEnv = "MOAT_TEST_SUBPROCESS"

// Main runs the helper named by os.Args[1] when it is one of helpers, and
// the package's tests otherwise; it does not return. A helper list that
// reexec.Check refuses ends the binary with exit 3 before any test runs.
func Main(m *testing.M, helpers ...reexec.Helper) { os.Exit(Run(m, helpers...)) }

// Run is Main for a TestMain with work to do after the tests: it runs
// (and exits with) the helper named by os.Args[1] when it is one of
// helpers, and otherwise returns m.Run()'s code.
func Run(m *testing.M, helpers ...reexec.Helper) int {
	if err := reexec.Check(helpers); err != nil {
		fmt.Fprintf(os.Stderr, "BUG: reexectest: %v\n", err)
		os.Exit(3)
	}
	if code, ok := reexec.Dispatch(os.Args[1:], helpers); ok {
		os.Exit(code)
	}
	return m.Run()
}

// Helper returns a test helper named reexec.Prefix+"test-"+name.
func Helper(name string, main func(args []string) int) reexec.Helper {
	return reexec.Helper{Name: reexec.Prefix + "test-" + name, Main: main}
}

// Command runs this test binary as the helper name with args. Its
// environment is the test's, as exec.Command's is.
func Command(name string, args ...string) *exec.Cmd {
	return exec.Command(Self(), append([]string{name}, args...)...)
}

// Self is the path of this test binary.
func Self() string {
	exe, err := os.Executable()
	if err != nil {
		return os.Args[0]
	}
	return exe
}

// InSubprocess is true in the child that RunInSubprocess started.
func InSubprocess() bool { return os.Getenv(subprocessEnv) != "" }

// RunInSubprocess runs f in a fresh process of this test binary that runs
// only t (the parent does not run f), and reports the child's result as
// t's: a failure fails t with the child's output, a skip skips it. Use it
// for a test that changes its process for good (seccomp, Landlock, a
// changed uid).
func RunInSubprocess(t *testing.T, f func()) {
	t.Helper()
	if os.Getenv(subprocessEnv) == t.Name() {
		f()
		return
	}
	cmd := exec.Command(Self(), "-test.run="+runPattern(t.Name()), "-test.count=1", "-test.v")
	// The child's t.TempDir lands in the parent's, which the parent removes.
	cmd.Env = append(os.Environ(), subprocessEnv+"="+t.Name(), "TMPDIR="+t.TempDir())
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("running %s in a subprocess: %v", t.Name(), err)
	}
	text := string(out)
	switch {
	case err != nil:
		t.Fatalf("%s failed in a subprocess (%v):\n%s", t.Name(), err, text)
	case strings.Contains(text, "--- SKIP: "+t.Name()+" "):
		t.Skipf("skipped in a subprocess:\n%s", text)
	case !strings.Contains(text, "--- PASS: "+t.Name()+" "):
		t.Fatalf("%s did not run in the subprocess:\n%s", t.Name(), text)
	}
}

// runPattern is a -test.run pattern that matches the test (or subtest)
// name exactly: one anchored pattern per level.
func runPattern(name string) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	return strings.Join(parts, "/")
}
