package measure

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/boundary/attrib"
	"github.com/moat-sandbox/moat/boundary/native"
	"github.com/moat-sandbox/moat/internal/reaper"
	"github.com/moat-sandbox/moat/internal/reexec"
	"github.com/moat-sandbox/moat/internal/reexec/reexectest"
)

// TestMain: the test binary is the moat binary of the native sandboxes
// the tests make and the measurement's helper, so it serves those helpers
// (as internal/cli/hidden.go lists them) and the tests' own.
func TestMain(m *testing.M) {
	boundary.Register(native.New())
	helpers := []reexec.Helper{
		{Name: Helper, Main: Main},
		{Name: native.InitHelper, Main: native.InitMain},
		{Name: native.StageHelper, Main: native.StageMain},
		{Name: reaper.Helper, Main: reaper.Main},
		confineHelper, statxEINVALHelper, receiversHelper,
	}
	reexectest.Main(m, append(helpers, synthHelpers()...)...)
}

// lyingMechanisms claim every property, as a backend that enforces
// nothing might.
var lyingMechanisms = boundary.Mechanisms{
	FilesystemConfinement: "mountns+landlock-v7",
	EgressInterception:    "netns-loopback+seccomp",
	RequestAttribution:    "socket-inode",
	PrivilegeFloor:        "userns+seccomp+no_new_privs",
}

// fakeSandbox is a backend that confines nothing: StartHelper and Start
// run the test binary directly on the host, and the "sandbox's" broker
// listener is on the host's loopback. Its Mechanisms claim whatever the
// test says (by default, everything). It is the lying backend of issue 6
// in miniature; reuse it for any test of Confirm.
type fakeSandbox struct {
	ln   *net.TCPListener
	file *os.File
	mech boundary.Mechanisms
	attr boundary.Attributor
	// helper, when set, replaces the helper name in StartHelper's args,
	// so that a test can substitute its own (mis)behaving helper.
	helper string
	// leak, when set, is passed to the helper as fd 3: an inherited host
	// file that reaches past every wall.
	leak *os.File
	// lastPID is the host pid of the last process started.
	lastPID atomic.Int64
}

func newFakeSandbox(t testing.TB) *fakeSandbox {
	t.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	f, err := ln.File()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close(); f.Close() })
	return &fakeSandbox{ln: ln, file: f, mech: lyingMechanisms, attr: attrib.New(os.Getpid())}
}

func (f *fakeSandbox) start(ctx context.Context, argv []string, p boundary.Process) (boundary.Running, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, exe, argv...)
	// Race-enabled binaries sleep 1s at exit unless told otherwise.
	cmd.Env, cmd.Dir = append(p.Env[:len(p.Env):len(p.Env)], "GORACE=atexit_sleep_ms=0"), p.Dir
	cmd.Stdin, cmd.Stdout, cmd.Stderr = p.Stdin, p.Stdout, p.Stderr
	if f.leak != nil {
		cmd.ExtraFiles = []*os.File{f.leak}
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	f.lastPID.Store(int64(cmd.Process.Pid))
	return fakeRunning{cmd}, nil
}

func (f *fakeSandbox) Start(ctx context.Context, p boundary.Process) (boundary.Running, error) {
	return nil, errors.New("fakeSandbox: Start is not used by these tests")
}

func (f *fakeSandbox) StartHelper(ctx context.Context, args []string, p boundary.Process) (boundary.Running, error) {
	if f.helper != "" && len(args) > 0 {
		args = append([]string{f.helper}, args[1:]...)
	}
	return f.start(ctx, args, p)
}

func (f *fakeSandbox) Listener() (boundary.ListenerInfo, error) {
	return boundary.ListenerInfo{File: f.file, Port: f.ln.Addr().(*net.TCPAddr).Port}, nil
}

func (f *fakeSandbox) Attributor() boundary.Attributor { return f.attr }
func (f *fakeSandbox) Mechanisms() boundary.Mechanisms { return f.mech }
func (f *fakeSandbox) HostPID() int                    { return os.Getpid() }
func (f *fakeSandbox) Limits() boundary.LimitsStatus   { return boundary.LimitsStatus{} }
func (f *fakeSandbox) Terminate() error                { return nil }

type fakeRunning struct{ cmd *exec.Cmd }

func (r fakeRunning) HostPID() int { return r.cmd.Process.Pid }

func (r fakeRunning) Wait() (int, error) {
	err := r.cmd.Wait()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal()), nil
		}
		return ee.ExitCode(), nil
	}
	if err != nil {
		return -1, err
	}
	return 0, nil
}

func (r fakeRunning) Signal(sig os.Signal) error { return r.cmd.Process.Signal(sig) }

// fixedAttributor always says the same thing, true or not.
type fixedAttributor boundary.Attribution

func (a fixedAttributor) Attribute(net.Conn) boundary.Attribution { return boundary.Attribution(a) }
