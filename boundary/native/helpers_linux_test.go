package native

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/internal/reaper"
	"github.com/moat-sandbox/moat/internal/reexec"
	"github.com/moat-sandbox/moat/internal/reexec/reexectest"
	"github.com/moat-sandbox/moat/internal/testenv"
	"github.com/moat-sandbox/moat/policy"
)

// actionHelper is the test binary as a workload inside a sandbox (or as a
// supervisor subprocess): its first argument is the action (runAction).
const actionHelper = reexec.Prefix + "test-native-action"

func actionMain(args []string) int {
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "want an action")
		return 3
	}
	return runAction(args[0], args[1:])
}

// actionArgs are the arguments after the binary that run action.
func actionArgs(action string, args ...string) []string {
	return append([]string{actionHelper, action}, args...)
}

// TestMain: the test binary is the moat binary of the sandboxes the tests
// make, so it serves the helpers they start (as internal/cli/hidden.go
// lists them) and the tests' own.
func TestMain(m *testing.M) {
	boundary.Register(New())
	reexectest.Main(m,
		reexec.Helper{Name: InitHelper, Main: InitMain},
		reexec.Helper{Name: StageHelper, Main: StageMain},
		reexec.Helper{Name: reaper.Helper, Main: reaper.Main},
		reexec.Helper{Name: actionHelper, Main: actionMain})
}

// runAction is the test binary acting as a workload or helper process.
func runAction(action string, args []string) int {
	switch action {
	case "ops":
		for _, a := range args {
			fmt.Println(doOp(a))
		}
		return 0
	case "exit":
		if len(args) == 0 {
			return 0
		}
		n, _ := strconv.Atoi(args[0])
		return n
	case "doublefork":
		// A setsid'd child that starts a setsid'd grandchild and exits.
		c := exec.Command("/proc/self/exe", actionArgs("fork1", args...)...)
		c.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := c.Run(); err != nil {
			fmt.Println("doublefork:", err)
			return 1
		}
		fmt.Println("forked")
		time.Sleep(time.Hour)
		return 0
	case "fork1":
		c := exec.Command("/proc/self/exe", actionArgs("sleep", args...)...)
		c.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := c.Start(); err != nil {
			return 1
		}
		return 0
	case "alloc":
		// Touch n MiB; under a memory cgroup limit below that, the kernel
		// kills the process.
		n, _ := strconv.Atoi(args[0])
		var keep [][]byte
		for i := 0; i < n; i++ {
			b := make([]byte, 1<<20)
			for j := 0; j < len(b); j += 4096 {
				b[j] = 1
			}
			keep = append(keep, b)
		}
		fmt.Println("allocated", len(keep))
		return 0
	case "forkmany":
		n, _ := strconv.Atoi(args[0])
		var started, failed int
		var procs []*os.Process
		for i := 0; i < n; i++ {
			c := exec.Command("/proc/self/exe", actionArgs("sleep")...)
			c.Env = []string{}
			if err := c.Start(); err != nil {
				failed++
				continue
			}
			started++
			procs = append(procs, c.Process)
		}
		for _, p := range procs {
			p.Kill()
			p.Wait()
		}
		fmt.Printf("started %d failed %d\n", started, failed)
		return 0
	case "supervise":
		return superviseAction(args)
	case "sleep":
		time.Sleep(time.Hour)
		return 0
	}
	fmt.Fprintln(os.Stderr, "unknown action", action)
	return 3
}

// doOp performs one "op:arg" and describes the outcome as "op:arg ok [detail]"
// or "op:arg err <errno name>".
func doOp(spec string) string {
	op, arg, _ := strings.Cut(spec, ":")
	res := func(detail string, err error) string {
		if err != nil {
			var en syscall.Errno
			if errors.As(err, &en) {
				return spec + " err " + unix.ErrnoName(en)
			}
			return spec + " err " + err.Error()
		}
		return strings.TrimSpace(spec + " ok " + detail)
	}
	switch op {
	case "plant":
		// plant:DIR=TARGET renames DIR to DIR.old and puts a symlink to
		// TARGET in its place (the attack on a nested grant's parent).
		dir, target, _ := strings.Cut(arg, "=")
		if err := os.Rename(dir, dir+".old"); err != nil {
			return res("", err)
		}
		return res("", os.Symlink(target, dir))
	case "fill":
		// Write 1 MiB blocks until the file system says no (or 1 GiB).
		f, err := os.Create(arg)
		if err != nil {
			return res("", err)
		}
		defer f.Close()
		block := make([]byte, 1<<20)
		for range 1024 {
			if _, err := f.Write(block); err != nil {
				return res("", err)
			}
		}
		return res("wrote 1 GiB", f.Sync())
	case "inotify-count":
		// How many inotify instances this process can hold at once.
		n := 0
		for ; n < 1000; n++ {
			if _, err := unix.InotifyInit1(unix.IN_CLOEXEC); err != nil {
				return res(strconv.Itoa(n), nil)
			}
		}
		return res(strconv.Itoa(n), nil)
	case "read":
		b, err := os.ReadFile(arg)
		return res(strings.TrimSpace(string(b)), err)
	case "write":
		return res("", os.WriteFile(arg, []byte("x"), 0o644))
	case "stat":
		_, err := os.Stat(arg)
		return res("", err)
	case "ls":
		ents, err := os.ReadDir(arg)
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		return res(strings.Join(names, ","), err)
	case "tcp":
		c, err := net.DialTimeout("tcp", arg, 2*time.Second)
		if err == nil {
			c.Write([]byte("probe"))
			c.Close()
		}
		return res("", err)
	case "listen":
		l, err := net.Listen("tcp", arg)
		if err == nil {
			l.Close()
		}
		return res("", err)
	case "udp":
		c, err := net.Dial("udp", arg)
		if err == nil {
			_, err = c.Write([]byte("probe"))
			c.Close()
		}
		return res("", err)
	case "unixabs":
		c, err := net.Dial("unix", "@"+arg)
		if err == nil {
			c.Close()
		}
		return res("", err)
	case "owner":
		var st unix.Stat_t
		err := unix.Stat(arg, &st)
		return res(strconv.Itoa(int(st.Uid)), err)
	case "unix":
		c, err := net.Dial("unix", arg)
		if err == nil {
			c.Close()
		}
		return res("", err)
	case "socket":
		spec3, known := map[string][3]int{
			"packet": {unix.AF_PACKET, unix.SOCK_RAW, 0},
			"vsock":  {unix.AF_VSOCK, unix.SOCK_STREAM, 0},
			"mptcp":  {unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_MPTCP},
			"inet":   {unix.AF_INET, unix.SOCK_STREAM, 0},
		}[arg]
		if !known {
			return spec + " err unknown-socket"
		}
		dom, typ, proto := spec3[0], spec3[1], spec3[2]
		fd, err := unix.Socket(dom, typ, proto)
		if err == nil {
			unix.Close(fd)
		}
		return res("", err)
	case "keyctl":
		_, _, e := unix.Syscall(unix.SYS_ADD_KEY, 0, 0, 0)
		return res("", errnoErr(e))
	case "io_uring":
		var params [120]byte
		fd, _, e := unix.Syscall(unix.SYS_IO_URING_SETUP, 1, uintptr(unsafe.Pointer(&params[0])), 0)
		if e == 0 {
			unix.Close(int(fd))
		}
		return res("", errnoErr(e))
	case "ptrace":
		pid, _ := strconv.Atoi(arg)
		err := unix.PtraceAttach(pid)
		if err == nil {
			unix.PtraceDetach(pid)
		}
		return res("", err)
	case "tty":
		_, err0 := unix.IoctlGetTermios(0, unix.TCGETS)
		_, err1 := unix.IoctlGetTermios(1, unix.TCGETS)
		sid, _ := unix.Getsid(0)
		pgrp, err := unix.IoctlGetInt(0, unix.TIOCGPGRP)
		if err0 == nil && err1 == nil && err == nil && pgrp == sid {
			return res("controlling", nil)
		}
		return res("", fmt.Errorf("termios %v %v pgrp %d sid %d %v", err0, err1, pgrp, sid, err))
	case "kill":
		pid, _ := strconv.Atoi(arg)
		return res("", syscall.Kill(pid, 0))
	case "spare":
		// What this workload can do to the init's waiting spare stage.
		return res(spareAttack())
	case "env":
		return res(strings.Join(os.Environ(), ","), nil)
	case "fds":
		ents, err := os.ReadDir("/proc/self/fd")
		var out []string
		for _, e := range ents {
			t, _ := os.Readlink("/proc/self/fd/" + e.Name())
			out = append(out, e.Name()+"="+t)
		}
		return res(strings.Join(out, ","), err)
	case "clone-user":
		// A child in a new user namespace (unshare would fail with EINVAL
		// in a multi-threaded Go process whatever the walls).
		c := exec.Command("/proc/self/exe", actionArgs("exit")...)
		c.Env = []string{}
		c.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWUSER}
		return res("", c.Run())
	case "unshare-user":
		return res("", unix.Unshare(unix.CLONE_NEWUSER))
	case "id":
		return res(fmt.Sprintf("%d:%d", os.Getuid(), os.Getgid()), nil)
	case "status":
		b, err := os.ReadFile("/proc/self/status")
		var keep []string
		for _, l := range strings.Split(string(b), "\n") {
			k, v, _ := strings.Cut(l, ":")
			switch k {
			case "NoNewPrivs", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "Seccomp":
				keep = append(keep, k+"="+strings.TrimSpace(v))
			}
		}
		return res(strings.Join(keep, ","), err)
	case "dumpable":
		v, err := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0)
		return res(strconv.Itoa(v), err)
	case "rlimit":
		var core, nofile unix.Rlimit
		unix.Getrlimit(unix.RLIMIT_CORE, &core)
		err := unix.Getrlimit(unix.RLIMIT_NOFILE, &nofile)
		return res(fmt.Sprintf("core=%d nofile=%d", core.Max, nofile.Max), err)
	}
	return spec + " err unknown-op"
}

func errnoErr(e syscall.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

// fixture is a sandbox setup that works as root and as an unprivileged
// user from a copied test binary: every directory is 0755 and created
// here, and the workspace is owned by the uid the sandbox maps to.
type fixture struct {
	bin    string // a copy of this test binary, in a read-only grant
	binDir string
	ws     string // the read_write grant
	outer  string // a directory outside every grant
	pol    *policy.Policy
}

func needSandbox(t testing.TB) {
	t.Helper()
	testenv.Need(t, LandlockABI() >= 1, "Landlock is not available")
	testenv.Need(t, usernsWorks(), "unprivileged user namespaces are not available")
}

// usernsWorks is decided once, before any Prepare: a supervisor is not
// dumpable afterwards, and a rootless non-dumpable process cannot write a
// child's id maps (Prepare handles that for its own children).
var usernsWorks = sync.OnceValue(func() bool {
	c := exec.Command("/proc/self/exe")
	c.Env = []string{}
	c.Args = append([]string{"x"}, actionArgs("exit", "0")...)
	c.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWUSER | unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWNET,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Geteuid(), Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getegid(), Size: 1}}}
	return c.Run() == nil
})

func mkdir755(t testing.TB, pattern string) string {
	t.Helper()
	d, err := os.MkdirTemp("", pattern)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(d, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	needSandbox(t)
	f := &fixture{binDir: mkdir755(t, "moat-native-bin-"), ws: mkdir755(t, "moat-native-ws-"), outer: mkdir755(t, "moat-native-outer-")}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	f.bin = filepath.Join(f.binDir, "native.test")
	if err := os.WriteFile(f.bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		if err := os.Chown(f.ws, policy.NobodyID, policy.NobodyID); err != nil {
			t.Fatal(err)
		}
	}
	ro := []string{f.binDir}
	for _, p := range []string{"/usr", "/lib", "/lib64", "/bin"} {
		if _, err := os.Stat(p); err == nil {
			ro = append(ro, p)
		}
	}
	f.pol = &policy.Policy{
		Version:  1,
		Backend:  Name,
		Landlock: policy.Landlock{ABIFloor: 1},
		Filesystem: policy.Filesystem{
			ReadOnly:  ro,
			ReadWrite: []string{f.ws},
			TmpSize:   16 << 20,
		},
		Process: policy.Process{UID: 1000, GID: 1000, HostUID: policy.NobodyID, HostGID: policy.NobodyID,
			Env:    map[string]string{"PATH": "/usr/bin:/bin"},
			Limits: policy.Limits{OpenFiles: 256, Pids: 128, Memory: 512 << 20}},
	}
	return f
}

func (f *fixture) prepare(t *testing.T) boundary.Sandbox {
	t.Helper()
	be, err := boundary.Lookup(Name)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sb, err := be.Prepare(ctx, boundary.Spec{RunID: "test-" + strconv.Itoa(os.Getpid()), Policy: f.pol, StateDir: t.TempDir()})
	if err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	t.Cleanup(func() {
		if err := sb.Terminate(); err != nil {
			t.Errorf("Terminate: %v", err)
		}
	})
	return sb
}

// run starts the test binary in sb with the action and args, and returns
// its exit code and output.
func (f *fixture) run(t *testing.T, sb boundary.Sandbox, action string, args ...string) (int, string) {
	t.Helper()
	var out, errb bytes.Buffer
	p, err := sb.Start(context.Background(), boundary.Process{
		Argv:   append([]string{f.bin}, actionArgs(action, args...)...),
		Env:    []string{"PATH=/usr/bin:/bin"},
		Stdout: &out, Stderr: &errb,
	})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	code, err := p.Wait()
	if err != nil {
		t.Fatalf("Wait: %v", err)
	}
	if errb.Len() > 0 {
		t.Logf("workload stderr: %s", errb.String())
	}
	return code, out.String()
}

// ops runs the "ops" action and returns its result lines by op spec.
func (f *fixture) ops(t *testing.T, sb boundary.Sandbox, specs ...string) map[string]string {
	t.Helper()
	code, out := f.run(t, sb, "ops", specs...)
	t.Logf("ops output:\n%s", out)
	if code != 0 {
		t.Fatalf("ops exited %d: %s", code, out)
	}
	res := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		for _, s := range specs {
			if strings.HasPrefix(l, s+" ") {
				res[s] = strings.TrimPrefix(l, s+" ")
			}
		}
	}
	for _, s := range specs {
		if _, ok := res[s]; !ok {
			t.Fatalf("no result for %q in output:\n%s", s, out)
		}
	}
	return res
}

func wantPrefix(t *testing.T, res map[string]string, spec, want string) {
	t.Helper()
	if !strings.HasPrefix(res[spec], want) {
		t.Errorf("%s: got %q, want %q…", spec, res[spec], want)
	}
}
