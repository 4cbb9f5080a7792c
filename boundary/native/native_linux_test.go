package native

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/internal/fsutil"
	"github.com/moat-sandbox/moat/internal/grants"
	"github.com/moat-sandbox/moat/internal/receiver"
	"github.com/moat-sandbox/moat/internal/testenv"
	"github.com/moat-sandbox/moat/policy"
)

func TestIdentityAndPrivilege(t *testing.T) {
	f := newFixture(t)
	sb := f.prepare(t)
	res := f.ops(t, sb, "id", "status", "rlimit", "clone-user", "read:/proc/sys/user/max_user_namespaces")
	wantPrefix(t, res, "id", "ok 1000:1000")
	for _, kv := range []string{"NoNewPrivs=1", "CapInh=0000000000000000", "CapPrm=0000000000000000",
		"CapEff=0000000000000000", "CapBnd=0000000000000000", "CapAmb=0000000000000000", "Seccomp=2"} {
		if !strings.Contains(res["status"], kv) {
			t.Errorf("status: got %q, want it to contain %s", res["status"], kv)
		}
	}
	wantPrefix(t, res, "rlimit", "ok core=0 nofile=256")
	wantPrefix(t, res, "clone-user", "err EPERM")
	wantPrefix(t, res, "read:/proc/sys/user/max_user_namespaces", "ok 0")

	// Privilege and kernel-surface syscalls fail; a plain socket works.
	sleeper, err := sb.Start(context.Background(), boundary.Process{Argv: append([]string{f.bin}, actionArgs("sleep")...)})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { sleeper.Signal(syscall.SIGKILL); sleeper.Wait() }()
	res = f.ops(t, sb, "socket:packet", "socket:vsock", "socket:mptcp", "keyctl", "io_uring", "ptrace:1", "ptrace:2", "socket:inet")
	for _, op := range []string{"socket:packet", "socket:vsock", "socket:mptcp", "keyctl", "io_uring", "ptrace:1", "ptrace:2"} {
		wantPrefix(t, res, op, "err E")
	}
	wantPrefix(t, res, "socket:inet", "ok")
}

func TestTwoSandboxes(t *testing.T) {
	f := newFixture(t)
	a, b := f.prepare(t), f.prepare(t)
	for _, sb := range []boundary.Sandbox{a, b} {
		res := f.ops(t, sb, "id")
		wantPrefix(t, res, "id", "ok 1000:1000")
	}
	if a.HostPID() == b.HostPID() || a.HostPID() <= 0 {
		t.Errorf("host pids: got %d and %d, want two distinct pids", a.HostPID(), b.HostPID())
	}
}

func TestFilesystemConfinement(t *testing.T) {
	f := newFixture(t)
	secret := filepath.Join(f.outer, "secret.txt")
	if err := os.WriteFile(secret, []byte("host secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	granted := filepath.Join(f.ws, "granted.txt")
	if err := os.WriteFile(granted, []byte("granted"), 0o644); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		os.Chown(granted, policy.NobodyID, policy.NobodyID)
	}
	cwd, _ := os.Getwd()
	sb := f.prepare(t)
	res := f.ops(t, sb,
		"read:"+secret, "read:"+granted, "stat:/etc/shadow", "stat:/root", "stat:/etc", "stat:"+cwd,
		"write:"+filepath.Join(f.ws, "new.txt"), "write:"+filepath.Join(f.binDir, "new.txt"),
		"write:/usr/moat-test", "write:/moat-test", "write:/tmp/ok.txt", "read:/dev/null", "write:/dev/null", "stat:/dev/urandom", "stat:/dev/sda",
		"write:/proc/sys/user/max_user_namespaces")
	wantPrefix(t, res, "read:"+secret, "err ENOENT")
	wantPrefix(t, res, "read:"+granted, "ok granted")
	wantPrefix(t, res, "stat:/etc/shadow", "err ENOENT")
	wantPrefix(t, res, "stat:/root", "err ENOENT")
	wantPrefix(t, res, "stat:/etc", "err ENOENT")
	if !fsutil.Within(cwd, f.binDir) && !fsutil.Within(cwd, "/usr") {
		wantPrefix(t, res, "stat:"+cwd, "err ENOENT")
	}
	wantPrefix(t, res, "write:"+filepath.Join(f.ws, "new.txt"), "ok")
	wantPrefix(t, res, "write:"+filepath.Join(f.binDir, "new.txt"), "err E")
	wantPrefix(t, res, "write:/usr/moat-test", "err E")
	wantPrefix(t, res, "write:/moat-test", "err E")
	wantPrefix(t, res, "write:/tmp/ok.txt", "ok")
	wantPrefix(t, res, "read:/dev/null", "ok")
	wantPrefix(t, res, "write:/dev/null", "ok")
	wantPrefix(t, res, "stat:/dev/urandom", "ok")
	wantPrefix(t, res, "stat:/dev/sda", "err ENOENT")
	wantPrefix(t, res, "write:/proc/sys/user/max_user_namespaces", "err E")
	// The workspace write landed on the host, as the workspace's owner.
	st, err := os.Stat(filepath.Join(f.ws, "new.txt"))
	if err != nil {
		t.Fatalf("write in the workspace did not reach the host: %v", err)
	}
	wantUID := uint32(os.Geteuid())
	if wantUID == 0 {
		wantUID = policy.NobodyID
	}
	if got := st.Sys().(*syscall.Stat_t).Uid; got != wantUID {
		t.Errorf("owner of the workload's file: got uid %d, want %d", got, wantUID)
	}
	if _, err := os.Stat(filepath.Join(f.binDir, "new.txt")); err == nil {
		t.Errorf("write to a read-only grant reached the host")
	}
}

// TestLandlockAlone grants a directory by mount but leaves it out of the
// Landlock ruleset: only Landlock stands between the workload and it.
func TestLandlockAlone(t *testing.T) {
	f := newFixture(t)
	// Not below /tmp: the sandbox's /tmp rule would cover it.
	extra := mkdirOutsideTmp(t)
	if err := os.WriteFile(filepath.Join(extra, "f.txt"), []byte("extra"), 0o644); err != nil {
		t.Fatal(err)
	}
	f.pol.Filesystem.ReadOnly = append(f.pol.Filesystem.ReadOnly, extra)
	testOmitLandlock = []string{extra}
	sb := f.prepare(t)
	testOmitLandlock = nil
	res := f.ops(t, sb, "stat:"+filepath.Join(extra, "f.txt"), "read:"+filepath.Join(extra, "f.txt"), "ls:"+extra,
		"listen:127.0.0.1:0")
	wantPrefix(t, res, "stat:"+filepath.Join(extra, "f.txt"), "ok") // mounted: it exists
	wantPrefix(t, res, "read:"+filepath.Join(extra, "f.txt"), "err EACCES")
	// Names can be listed: read_dir beneath / is granted so that `ls /`
	// works (it shows what is mounted, as the mount table does).
	wantPrefix(t, res, "ls:"+extra, "ok f.txt")
	// The network namespace would let a loopback bind succeed: Landlock
	// (ABI 4+) alone refuses it.
	if LandlockABI() >= 4 {
		wantPrefix(t, res, "listen:127.0.0.1:0", "err EACCES")
	}

	// Control: the same directory with its Landlock rule reads fine.
	sb2 := f.prepare(t)
	res = f.ops(t, sb2, "read:"+filepath.Join(extra, "f.txt"))
	wantPrefix(t, res, "read:"+filepath.Join(extra, "f.txt"), "ok extra")
}

func TestNetworkConfinement(t *testing.T) {
	f := newFixture(t)
	// Receivers on the host's loopback; the workload must reach none.
	recv, err := receiver.Start(receiver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer recv.Close()
	abstract := fmt.Sprintf("moat-native-test-%d", os.Getpid())
	ul, err := net.Listen("unix", "@"+abstract)
	if err != nil {
		t.Fatal(err)
	}
	defer ul.Close()
	var unixHits atomic.Int32
	go func() {
		for {
			c, err := ul.Accept()
			if err != nil {
				return
			}
			unixHits.Add(1)
			c.Close()
		}
	}()

	sb := f.prepare(t)
	li, err := sb.Listener()
	if err != nil {
		t.Fatal(err)
	}
	bl, err := net.FileListener(li.File)
	li.File.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer bl.Close()
	brokerHits := make(chan string, 4)
	go func() {
		for {
			c, err := bl.Accept()
			if err != nil {
				return
			}
			b := make([]byte, 5)
			io.ReadFull(c, b)
			brokerHits <- string(b)
			c.Close()
		}
	}()
	tcpAddr := recv.TCP.Addr().String()
	udpAddr := recv.UDP.LocalAddr().String()
	broker := fmt.Sprintf("127.0.0.1:%d", li.Port)
	// A host process puts a Unix socket into the writable workspace after
	// the sandbox is ready.
	sockPath := filepath.Join(f.ws, "host.sock")
	pl, err := net.Listen("unix", sockPath)
	if err != nil {
		t.Fatal(err)
	}
	defer pl.Close()
	os.Chmod(sockPath, 0o777)
	var pathHits atomic.Int32
	go func() {
		for {
			c, err := pl.Accept()
			if err != nil {
				return
			}
			pathHits.Add(1)
			c.Close()
		}
	}()
	res := f.ops(t, sb, "tcp:"+tcpAddr, "udp:"+udpAddr, "unixabs:"+abstract, "unix:"+sockPath, "stat:"+sockPath,
		"tcp:"+broker, "tcp:[::1]:"+strconv.Itoa(li.Port))
	wantPrefix(t, res, "unix:"+sockPath, "err")
	wantPrefix(t, res, "stat:"+sockPath, "ok") // it is there, and unreachable
	if n := pathHits.Load(); n != 0 {
		t.Errorf("host Unix socket in the workspace saw %d connections, want 0", n)
	}
	// Control: the host can connect to it.
	if c, err := net.Dial("unix", sockPath); err != nil {
		t.Errorf("control: host connect to %s: %v", sockPath, err)
	} else {
		c.Close()
	}
	wantPrefix(t, res, "tcp:"+broker, "ok")
	wantPrefix(t, res, "tcp:"+tcpAddr, "err")
	wantPrefix(t, res, "unixabs:"+abstract, "err")
	select {
	case got := <-brokerHits:
		if got != "probe" {
			t.Errorf("broker listener got %q, want %q", got, "probe")
		}
	case <-time.After(5 * time.Second):
		t.Error("the broker listener saw no connection")
	}
	// The workload has exited: anything it sent has arrived by now.
	if got := recv.Seen(); len(got) != 0 {
		t.Errorf("host TCP/UDP receivers saw %v, want nothing", got)
	}
	if n := unixHits.Load(); n != 0 {
		t.Errorf("host abstract Unix receiver saw %d connections, want 0", n)
	}
	// Control: the host receivers do work.
	c, err := net.Dial("udp", udpAddr)
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("x"))
	c.Close()
	for i := 0; i < 100 && recv.Count() == 0; i++ {
		time.Sleep(10 * time.Millisecond)
	}
	if recv.Count() != 1 {
		t.Errorf("control: host UDP receiver saw %d datagrams from the host, want 1", recv.Count())
	}
}

func TestProcessIsolation(t *testing.T) {
	f := newFixture(t)
	// An fd of the parent without close-on-exec, and a secret in its env.
	secret := filepath.Join(f.outer, "fd-secret")
	os.WriteFile(secret, []byte("s"), 0o644)
	fd, err := syscall.Open(secret, syscall.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	t.Setenv("MOAT_TEST_SECRET", "hunter2")
	sb := f.prepare(t)
	self := strconv.Itoa(os.Getpid())
	res := f.ops(t, sb, "ls:/proc", "kill:"+self, "kill:1", "fds", "env", "dumpable")
	var pids []string
	_, spare, _ := findSpare(sb.HostPID()) // forked once the workload started
	for _, n := range strings.Split(strings.TrimPrefix(res["ls:/proc"], "ok "), ",") {
		if pid, err := strconv.Atoi(n); err == nil && pid != spare {
			pids = append(pids, n)
		}
	}
	// The init (1) and the workload (and the spare stage, waiting for the
	// next start); nothing of the host.
	if len(pids) > 2 || len(pids) == 0 || pids[0] != "1" {
		t.Errorf("pids visible inside: got %v, want [1 <workload>]", pids)
	}
	wantPrefix(t, res, "kill:"+self, "err ESRCH")
	wantPrefix(t, res, "kill:1", "err EPERM")
	if strings.Contains(res["fds"], "fd-secret") {
		t.Errorf("the parent's fd is visible inside: %s", res["fds"])
	}
	if strings.Contains(res["env"], "hunter2") {
		t.Errorf("the parent's environment is visible inside: %s", res["env"])
	}
	if !strings.Contains(res["env"], "PATH=/usr/bin:/bin") {
		t.Errorf("env: got %s, want the given PATH", res["env"])
	}
	// Control: the host sees the workload's own fd namespace normally.
	if _, err := os.Stat(fmt.Sprintf("/proc/self/fd/%d", fd)); err != nil {
		t.Fatalf("control: the parent's fd is not open: %v", err)
	}
	// The init is not dumpable.
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", sb.HostPID()))
	if err == nil && !strings.Contains(string(st), "NSpid:") {
		t.Errorf("init status has no NSpid")
	}
}

func TestExitCodes(t *testing.T) {
	f := newFixture(t)
	sb := f.prepare(t)
	if code, _ := f.run(t, sb, "exit", "7"); code != 7 {
		t.Errorf("exit code: got %d, want 7", code)
	}
	if code, _ := f.run(t, sb, "exit", "0"); code != 0 {
		t.Errorf("exit code: got %d, want 0", code)
	}
	noexec := filepath.Join(f.ws, "noexec.sh")
	os.WriteFile(noexec, []byte("#!/bin/sh\n"), 0o644)
	for _, tc := range []struct {
		name string
		argv []string
		want int
	}{
		{"absent path", []string{"/nonexistent/moat-cmd"}, 127},
		{"absent in PATH", []string{"moat-no-such-command"}, 127},
		{"not executable", []string{noexec}, 126},
		{"a directory", []string{f.ws}, 126},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := sb.Start(context.Background(), boundary.Process{Argv: tc.argv, Env: []string{"PATH=/usr/bin:/bin"}})
			var se *boundary.StartError
			if !errors.As(err, &se) || se.Code != tc.want {
				t.Fatalf("Start(%v): got %v, want a StartError with code %d", tc.argv, err, tc.want)
			}
		})
	}
	// A relative command path resolves against the working directory, as
	// in a shell; the same path from another directory is not found.
	script := filepath.Join(f.ws, "bin", "agent")
	os.MkdirAll(filepath.Dir(script), 0o755)
	os.WriteFile(script, []byte("#!/bin/sh\nexit 9\n"), 0o755)
	if os.Geteuid() == 0 {
		os.Chown(filepath.Dir(script), policy.NobodyID, policy.NobodyID)
	}
	for _, tc := range []struct {
		dir  string
		want int
	}{{f.ws, 9}, {"/tmp", 127}} {
		p, err := sb.Start(context.Background(), boundary.Process{Argv: []string{"./bin/agent"}, Dir: tc.dir, Env: []string{"PATH=/usr/bin:/bin"}})
		code := -1
		var se *boundary.StartError
		switch {
		case errors.As(err, &se):
			code = se.Code
		case err == nil:
			code, _ = p.Wait()
		default:
			t.Fatal(err)
		}
		if code != tc.want {
			t.Errorf("./bin/agent from %s: got %d, want %d", tc.dir, code, tc.want)
		}
	}
	// A signal comes back as 128+signal.
	p, err := sb.Start(context.Background(), boundary.Process{Argv: append([]string{f.bin}, actionArgs("sleep")...)})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code, _ := p.Wait(); code != 128+int(syscall.SIGTERM) {
		t.Errorf("killed by SIGTERM: got %d, want %d", code, 128+int(syscall.SIGTERM))
	}
}

func TestABIFloorRefuses(t *testing.T) {
	abi := LandlockABI()
	testenv.Need(t, abi >= 1, "Landlock is not available")
	pol := &policy.Policy{Landlock: policy.Landlock{ABIFloor: abi + 1}, Process: policy.Process{UID: 1000}}
	be, _ := boundary.Lookup(Name)
	sb, err := be.Prepare(context.Background(), boundary.Spec{RunID: "abi", Policy: pol, StateDir: t.TempDir()})
	var ae *ABIError
	if !errors.As(err, &ae) || sb != nil {
		t.Fatalf("Prepare: got %v, %v; want an ABIError and no sandbox", sb, err)
	}
	if ae.Found != abi || ae.Floor != abi+1 {
		t.Errorf("ABIError: got found %d floor %d, want %d and %d", ae.Found, ae.Floor, abi, abi+1)
	}
	msg := err.Error()
	if !strings.Contains(msg, strconv.Itoa(abi)) || !strings.Contains(msg, strconv.Itoa(abi+1)) {
		t.Errorf("message %q does not name both ABIs", msg)
	}
	// Control: the host's own ABI is accepted.
	f := newFixture(t)
	f.pol.Landlock.ABIFloor = abi
	f.prepare(t)
}

func TestStartHelper(t *testing.T) {
	f := newFixture(t)
	sb := f.prepare(t)
	var out bytes.Buffer
	// The helper is this test binary run through the fd the init holds; it
	// is not in the sandbox root.
	p, err := sb.StartHelper(context.Background(), actionArgs("ops", "ignored"), boundary.Process{
		Stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	if code, _ := p.Wait(); code != 0 {
		t.Fatalf("helper exited %d", code)
	}
	p, err = sb.StartHelper(context.Background(), actionArgs("ops", "id", "status", "stat:"+f.binDir), boundary.Process{
		Stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	p.Wait()
	s := out.String()
	if !strings.Contains(s, "id ok 1000:1000") || !strings.Contains(s, "CapEff=0000000000000000") || !strings.Contains(s, "Seccomp=2") {
		t.Errorf("helper output: got %q, want uid 1000, no capabilities, seccomp", s)
	}
}

func TestMechanismsAndLimits(t *testing.T) {
	f := newFixture(t)
	sb := f.prepare(t)
	if d, err := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0); err != nil || d != 0 {
		t.Errorf("supervisor dumpable after Prepare: got %d, %v; want 0", d, err)
	}
	m := sb.Mechanisms()
	if !strings.HasPrefix(m.FilesystemConfinement, "mountns+landlock-v") || m.PrivilegeFloor == "" || m.EgressInterception == "" {
		t.Errorf("mechanisms: got %+v", m)
	}
	l := sb.Limits()
	if !l.OpenFiles {
		t.Errorf("limits: open files not enforced: %+v", l)
	}
	if os.Geteuid() != 0 && (l.Memory || l.Pids) {
		t.Errorf("limits: rootless run claims cgroup limits: %+v", l)
	}
	if (!l.Memory || !l.Pids) && l.Detail == "" {
		t.Errorf("limits: a limit not enforced without a reason: %+v", l)
	}
	if err := sb.Terminate(); err != nil {
		t.Fatal(err)
	}
	if err := sb.Terminate(); err != nil {
		t.Fatalf("second Terminate: %v", err)
	}
	if _, err := sb.Start(context.Background(), boundary.Process{Argv: []string{f.bin}}); err == nil {
		t.Error("Start after Terminate succeeded")
	}
}

// mkdirOutsideTmp makes a 0755 directory that is not below /tmp.
func mkdirOutsideTmp(t *testing.T) string {
	t.Helper()
	for _, base := range []string{"/var/tmp", "/dev/shm"} {
		d, err := os.MkdirTemp(base, "moat-native-extra-")
		if err != nil {
			continue
		}
		t.Cleanup(func() { os.RemoveAll(d) })
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	testenv.Need(t, false, "no writable directory outside /tmp (/var/tmp, /dev/shm)")
	return ""
}

// TestWallsWithoutSeccomp runs without the seccomp filter: the user
// namespace cap alone still stops a new user namespace (ENOSPC, not the
// filter's EPERM), and the syscalls that only the filter stops now succeed,
// which shows that the filter is what stops them in TestIdentityAndPrivilege.
func TestWallsWithoutSeccomp(t *testing.T) {
	f := newFixture(t)
	testNoSeccomp = true
	sb := f.prepare(t)
	testNoSeccomp = false
	res := f.ops(t, sb, "status", "clone-user", "keyctl", "socket:inet")
	if !strings.Contains(res["status"], "Seccomp=0") {
		t.Fatalf("status without the filter: got %q, want Seccomp=0", res["status"])
	}
	wantPrefix(t, res, "clone-user", "err ENOSPC")
	// add_key with NULL arguments reaches the kernel's argument checks
	// (EFAULT/EINVAL) instead of the filter's EPERM.
	if strings.Contains(res["keyctl"], "EPERM") {
		t.Errorf("keyctl without the filter: got %q, want an error other than EPERM", res["keyctl"])
	}
	wantPrefix(t, res, "socket:inet", "ok")
	if !strings.Contains(res["status"], "CapEff=0000000000000000") || !strings.Contains(res["status"], "NoNewPrivs=1") {
		t.Errorf("status without the filter: got %q, want no capabilities and no_new_privs", res["status"])
	}
}

// TestKernelCountersCapped: a sandbox holds at most 16 inotify instances
// at once (its user namespace's cap), so it cannot use up its owner's
// per-uid budget (128 by default; the attack exhausted host root's). The
// control: it can hold some, and the host, meanwhile, still can.
func TestKernelCountersCapped(t *testing.T) {
	f := newFixture(t)
	sb := f.prepare(t)
	res := f.ops(t, sb, "inotify-count")
	got, err := strconv.Atoi(strings.TrimPrefix(res["inotify-count"], "ok "))
	if err != nil || got < 1 || got > 16 {
		t.Fatalf("inotify instances held inside: %q, want 1..16", res["inotify-count"])
	}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		t.Fatalf("host inotify after the sandbox took its share: %v", err)
	}
	unix.Close(fd)
}

// TestPlantedNestedGrantAcrossRuns is issue 11's first attack end to end:
// with read_write [ws] and read_only [ws/sysroot/etc], run 1's workload
// renames ws/sysroot and plants a symlink to a host directory outside the
// grants; run 2 must refuse, naming the link, instead of mounting the host
// directory. Run 1 itself is the control: the nested grant reads fine.
func TestPlantedNestedGrantAcrossRuns(t *testing.T) {
	f := newFixture(t)
	etc := filepath.Join(f.ws, "sysroot", "etc")
	if err := os.MkdirAll(etc, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(etc, "conf"), []byte("granted"), 0o644); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		for _, p := range []string{filepath.Join(f.ws, "sysroot"), etc, filepath.Join(etc, "conf")} {
			os.Chown(p, policy.NobodyID, policy.NobodyID)
		}
	}
	secret := filepath.Join(f.outer, "etc")
	if err := os.MkdirAll(secret, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(secret, "conf"), []byte("host secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	f.pol.Filesystem.ReadOnly = append(f.pol.Filesystem.ReadOnly, etc)
	sb := f.prepare(t)
	res := f.ops(t, sb, "read:"+filepath.Join(etc, "conf"), "plant:"+filepath.Join(f.ws, "sysroot")+"="+f.outer)
	wantPrefix(t, res, "read:"+filepath.Join(etc, "conf"), "ok granted")
	wantPrefix(t, res, "plant:"+filepath.Join(f.ws, "sysroot")+"="+f.outer, "ok")
	sb.Terminate()

	be, _ := boundary.Lookup(Name)
	sb2, err := be.Prepare(context.Background(), boundary.Spec{RunID: "run2", Policy: f.pol, StateDir: t.TempDir()})
	if err == nil {
		defer sb2.Terminate()
		res := f.ops(t, sb2, "read:"+filepath.Join(etc, "conf"))
		t.Fatalf("run 2 started with a planted symlink; the workload reads %q", res["read:"+filepath.Join(etc, "conf")])
	}
	if !strings.Contains(err.Error(), "symlink") || !strings.Contains(err.Error(), filepath.Join(f.ws, "sysroot")) {
		t.Errorf("refusal %q does not name the planted symlink", err)
	}
}

// TestProcMasked: the host-wide /proc entries read empty inside (the
// host's command line, boot id, load and memory, pid 1's identity); the
// control: the workload's own /proc/self/status has content.
func TestProcMasked(t *testing.T) {
	f := newFixture(t)
	sb := f.prepare(t)
	var specs []string
	for _, p := range procMasked {
		if p != "pressure" {
			specs = append(specs, "read:/proc/"+p)
		}
	}
	specs = append(specs, "ls:/proc/pressure", "read:/proc/self/status")
	res := f.ops(t, sb, specs...)
	for _, s := range specs[:len(specs)-2] {
		if got := res[s]; got != "ok" && !strings.HasSuffix(got, "ENOENT") {
			t.Errorf("%s: got %q, want empty", s, got)
		}
	}
	if got := res["ls:/proc/pressure"]; got != "ok empty" && !strings.HasSuffix(got, "ENOENT") {
		t.Errorf("ls /proc/pressure: got %q, want empty", got)
	}
	if got := res["read:/proc/self/status"]; !strings.Contains(got, "Name:") {
		t.Errorf("control: /proc/self/status: got %q", got)
	}
	// Without the mask these would not read empty: the host's do not.
	for _, p := range []string{"/proc/meminfo", "/proc/cmdline", "/proc/loadavg"} {
		if b, err := os.ReadFile(p); err != nil || len(b) == 0 {
			t.Errorf("control: the host's %s reads %d bytes, %v", p, len(b), err)
		}
	}
}

// nsGetOwnerUID is NS_GET_OWNER_UID, _IO(0xb7, 0x4).
const nsGetOwnerUID = 0xb704

// TestUserNSOwner: as root, the sandbox's user namespace is owned by a
// fresh uid from moat's range, neither root (whose kernel object budget it
// would draw on) nor host_uid (every host process running as host_uid
// would hold every capability inside the sandbox); rootless, by the
// caller. And a host process running as host_uid cannot enter it (it
// could when the namespace was host_uid's: found by attack); root can
// (the control: the target is real).
func TestUserNSOwner(t *testing.T) {
	f := newFixture(t)
	sb := f.prepare(t)
	path := fmt.Sprintf("/proc/%d/ns/user", sb.HostPID())
	ns, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	var uid uint32
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, ns.Fd(), nsGetOwnerUID, uintptr(unsafe.Pointer(&uid))); e != 0 {
		t.Fatalf("NS_GET_OWNER_UID: %v", e)
	}
	if os.Geteuid() != 0 {
		if uid != uint32(os.Geteuid()) {
			t.Errorf("rootless owner: got uid %d, want the caller %d", uid, os.Geteuid())
		}
		return
	}
	if uid < ownerUIDBase || uid >= ownerUIDBase+ownerUIDRange {
		t.Errorf("owner uid %d is outside moat's range [%#x, %#x)", uid, ownerUIDBase, ownerUIDBase+ownerUIDRange)
	}
	if _, eu, _ := unix.Getresuid(); eu != 0 {
		t.Errorf("after Prepare this thread's euid is %d", eu)
	}
	_, err = exec.LookPath("nsenter")
	testenv.Need(t, err == nil, "nsenter (util-linux) is not installed")
	enter := func(cred *syscall.Credential) error {
		// nsenter: setns of a user namespace needs a single-threaded caller.
		cmd := exec.Command("nsenter", "--preserve-credentials", "-U", "-t", strconv.Itoa(sb.HostPID()), "--", "/bin/true")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	}
	if err := enter(nil); err != nil {
		t.Fatalf("control: root enters the sandbox's user namespace: %v", err)
	}
	if err := enter(&syscall.Credential{Uid: policy.NobodyID, Gid: policy.NobodyID}); err == nil {
		t.Error("a host process running as host_uid entered the sandbox's user namespace")
	}
}

// TestRuntimeFilesForHelpersOnly: a dynamically linked moat (this test
// binary, built with cgo) starts its own helpers in a sandbox whose policy
// grants no /lib or /usr, because its loader and libraries are mounted for
// them; the workload gets no Landlock rule for those files, so the same
// dynamically linked binary, started as the workload, cannot execute.
func TestRuntimeFilesForHelpersOnly(t *testing.T) {
	rt, err := grants.Runtime()
	testenv.Need(t, err == nil && len(rt) > 0, "the test binary is statically linked (no cgo): there are no runtime files to check")
	f := newFixture(t)
	f.pol.Filesystem.ReadOnly = []string{f.binDir}
	sb := f.prepare(t)
	var out bytes.Buffer
	p, err := sb.StartHelper(context.Background(), actionArgs("ops", "id"), boundary.Process{Stdout: &out})
	if err != nil {
		t.Fatalf("control: moat's helper: %v", err)
	}
	if code, _ := p.Wait(); code != 0 || !strings.Contains(out.String(), "id ok 1000:1000") {
		t.Fatalf("control: moat's helper exited %d: %q", code, out.String())
	}
	_, err = sb.Start(context.Background(), boundary.Process{Argv: append([]string{f.bin}, actionArgs("exit")...)})
	var se *boundary.StartError
	if !errors.As(err, &se) || se.Code != 126 {
		t.Errorf("the workload through moat's runtime files: got %v, want a StartError 126 (Landlock keeps it from the loader)", err)
	}
}

// TestListRoot: `ls /` works inside (agents do it first) and shows the
// root's own entries; reading a file that no grant covers still fails.
func TestListRoot(t *testing.T) {
	f := newFixture(t)
	sb := f.prepare(t)
	res := f.ops(t, sb, "ls:/", "read:/etc/hostname")
	if got := res["ls:/"]; !strings.HasPrefix(got, "ok ") || !strings.Contains(got, "tmp") || !strings.Contains(got, "proc") {
		t.Errorf("ls /: got %q, want the root's entries", got)
	}
	if got := res["read:/etc/hostname"]; strings.HasPrefix(got, "ok") {
		t.Errorf("read of an ungranted file: got %q", got)
	}
}
