//go:build amd64 || arm64

package seccomp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/reexec"
	"github.com/moat-sandbox/moat/internal/reexec/reexectest"
	"github.com/moat-sandbox/moat/internal/testenv"
)

// The kernel tests re-run this test binary, one child per case: TestMain
// sees caseHelper and runs the case named after it instead of the tests. The child locks its
// OS thread, runs every probe once without the filter (to show that the
// action works here, so that a later denial is seccomp's doing), installs
// the filter with Build and Install, runs the probes again and prints a
// JSON report. The parent asserts on it.
const (
	caseHelper = reexec.Prefix + "test-seccomp-case" // argument: the case's name
	envDir     = "MOAT_SECCOMP_TEST_DIR"
	envSibling = "MOAT_SECCOMP_TEST_SIBLING"

	caseInherit = "inherit" // run by a filtered child: checks what a new program inherits

	childTimeout = 2 * time.Minute
)

// Expected results: "ok", an errno name ("EPERM"), or one of these.
const (
	resOK   = "ok"
	notRun  = "-" // the probe does not run at this stage
	anyRes  = "*" // depends on the host; logged, not asserted
	samePre = "=" // after the filter: the same as before it
)

type probe struct {
	name      string
	pre, post string
	run       func(*childState) error
}

type childCase struct {
	name    string
	opts    Options
	userns  bool // run the child as root of a new user namespace with its own mount and network namespaces
	setsid  bool
	sibling bool // the parent starts a sleeping sibling process at the same uid
	root    bool // needs real root: run by TestRootKernelFilter only
	need    func() (bool, string)
	setup   func(*childState) error // before the first probe
	probes  []probe
}

// extraChildMains are child entry points that do not fit the probe
// pattern, registered by architecture-specific test files.
var extraChildMains = map[string]func() int{}

type childState struct {
	dir     string // a directory the parent created
	sibling int    // pid of the sibling, when the case has one
	tty     int    // a pty's terminal end, when setup opened one
}

type childReport struct {
	Pre   map[string]string `json:"pre"`
	Post  map[string]string `json:"post"`
	Fatal string            `json:"fatal,omitempty"`
}

func TestMain(m *testing.M) {
	reexectest.Main(m, reexec.Helper{Name: caseHelper, Main: func(args []string) int {
		if len(args) != 1 {
			fmt.Fprintln(os.Stderr, "want the case's name")
			return 3
		}
		return childMain(args[0])
	}})
}

func result(err error) string {
	if err == nil {
		return resOK
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		if n := unix.ErrnoName(errno); n != "" {
			return n
		}
		return fmt.Sprintf("errno %d", int(errno))
	}
	return "error: " + err.Error()
}

func errnoErr(e syscall.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

func childMain(name string) int {
	// Install affects only this thread; everything below runs on it.
	runtime.LockOSThread()
	if name == caseInherit {
		return inheritMain()
	}
	if fn := extraChildMains[name]; fn != nil {
		return fn()
	}
	rep := childReport{Pre: map[string]string{}, Post: map[string]string{}}
	defer func() { json.NewEncoder(os.Stdout).Encode(&rep) }()
	var c *childCase
	for i := range childCases {
		if childCases[i].name == name {
			c = &childCases[i]
		}
	}
	if c == nil {
		rep.Fatal = "unknown case " + name
		return 0
	}
	st := &childState{dir: os.Getenv(envDir), tty: -1}
	if s := os.Getenv(envSibling); s != "" {
		st.sibling, _ = strconv.Atoi(s)
	}
	if c.setup != nil {
		if err := c.setup(st); err != nil {
			rep.Fatal = "setup: " + err.Error()
			return 0
		}
	}
	for _, p := range c.probes {
		if p.pre != notRun {
			rep.Pre[p.name] = result(p.run(st))
		}
	}
	prog, err := Build(c.opts)
	if err == nil {
		err = Install(prog)
	}
	if err != nil {
		rep.Fatal = err.Error()
		return 0
	}
	for _, p := range c.probes {
		if p.post != notRun {
			rep.Post[p.name] = result(p.run(st))
		}
	}
	return 0
}

func seccompAvailable() (bool, string) {
	action := uint32(unix.SECCOMP_RET_KILL_PROCESS)
	_, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_GET_ACTION_AVAIL, 0, uintptr(unsafe.Pointer(&action)))
	if e != 0 {
		return false, fmt.Sprintf("seccomp filters with SECCOMP_RET_KILL_PROCESS: %v", e)
	}
	return true, ""
}

func TestKernelFilter(t *testing.T) {
	ok, why := seccompAvailable()
	testenv.Need(t, ok, why)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range childCases {
		if c.root {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			checkChild(t, exe, c)
		})
	}
}

// TestRootKernelFilter runs the cases that only real root can check: what
// the kernel refuses an unprivileged process anyway (device nodes) is
// refused by the filter even where the kernel would allow it.
func TestRootKernelFilter(t *testing.T) {
	testenv.NeedRoot(t)
	ok, why := seccompAvailable()
	testenv.Need(t, ok, why)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range childCases {
		if !c.root {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			checkChild(t, exe, c)
		})
	}
}

// checkChild runs case c in a child and compares its report with the
// probes' expectations.
func checkChild(t *testing.T, exe string, c childCase) {
	t.Helper()
	if c.need != nil {
		ok, why := c.need()
		testenv.Need(t, ok, why)
	}
	rep := runChild(t, exe, c)
	if rep.Fatal != "" {
		t.Fatalf("child: %s", rep.Fatal)
	}
	for _, p := range c.probes {
		pre, post := rep.Pre[p.name], rep.Post[p.name]
		switch p.pre {
		case notRun:
		case anyRes:
			t.Logf("%s before the filter: %s (host-dependent)", p.name, pre)
		default:
			if pre != p.pre {
				t.Errorf("%s before the filter: got %s, want %s (without it, a denial after the filter does not show that seccomp stopped it)", p.name, pre, p.pre)
			}
		}
		want := p.post
		if want == samePre {
			want = pre
		}
		if want != notRun && post != want {
			t.Errorf("%s with the filter: got %s, want %s", p.name, post, want)
		}
	}
}

func runChild(t *testing.T, exe string, c childCase) childReport {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), childTimeout)
	defer cancel()
	env := append(os.Environ(), envDir+"="+t.TempDir())
	if c.sibling {
		sleep := exec.Command("sleep", "600")
		if err := sleep.Start(); err != nil {
			t.Fatalf("starting the sibling: %v", err)
		}
		t.Cleanup(func() { sleep.Process.Kill(); sleep.Wait() })
		env = append(env, envSibling+"="+strconv.Itoa(sleep.Process.Pid))
	}
	cmd := exec.CommandContext(ctx, exe, caseHelper, c.name)
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: c.setsid}
	if c.userns {
		cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWNET
		cmd.SysProcAttr.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}}
		cmd.SysProcAttr.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}}
	}
	err := cmd.Run()
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) && c.userns {
		var errno syscall.Errno
		if errors.As(err, &errno) && (errno == syscall.EPERM || errno == syscall.EACCES || errno == syscall.ENOSPC || errno == syscall.EINVAL) {
			testenv.Need(t, false, fmt.Sprintf("unprivileged user namespaces (starting the child: %v)", err))
		}
	}
	if err != nil {
		t.Fatalf("child %s: %v\nstderr:\n%s\nstdout:\n%s", c.name, err, stderr.Bytes(), stdout.Bytes())
	}
	var rep childReport
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("child %s: bad report %q: %v\nstderr:\n%s", c.name, stdout.Bytes(), err, stderr.Bytes())
	}
	return rep
}
