package native

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/internal/testenv"
)

// spareOf waits for the spare stage of the sandbox whose init is initPID
// and returns its host pid and its pid inside the sandbox.
func spareOf(t *testing.T, initPID int) (host, inside int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if host, inside, ok := findSpare(initPID); ok {
			return host, inside
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("no spare stage appeared")
	return 0, 0
}

// findSpare looks once for the spare stage of the init initPID.
func findSpare(initPID int) (host, inside int, ok bool) {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := os.ReadFile("/proc/" + e.Name() + "/status")
		if err != nil || !strings.Contains(string(st), "\nPPid:\t"+strconv.Itoa(initPID)+"\n") {
			continue
		}
		cmd, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if !strings.HasSuffix(string(cmd), "\x00"+spareArg+"\x00") {
			continue
		}
		for _, l := range strings.Split(string(st), "\n") {
			if v, ok := strings.CutPrefix(l, "NSpid:"); ok {
				f := strings.Fields(v)
				inside, _ = strconv.Atoi(f[len(f)-1])
			}
		}
		return pid, inside, true
	}
	return 0, 0, false
}

// TestSpareStage: the stage the init forks ahead of a start (spare_linux.go)
// is what the next start runs on, fully confined; a workload cannot
// signal, trace or open the fds of a waiting spare, while it can do each
// to its own process (the control in the same sandbox); a spare killed
// from outside costs only a fresh start; and no spare outlives the
// sandbox.
func TestSpareStage(t *testing.T) {
	f := newFixture(t)
	testenv.Need(t, LandlockABI() >= minSpareABI, "Landlock ABI below 6 scopes no signals: the init forks no spare")
	sb := f.prepare(t)
	if code, out := f.run(t, sb, "exit", "0"); code != 0 {
		t.Fatalf("first start: exit %d: %s", code, out)
	}
	self := "/proc/self"
	res := f.ops(t, sb, "spare", "read:"+self+"/environ", "read:"+self+"/fd/0", "kill:0", "status")
	for _, want := range []string{"kill=EPERM", "stop=EPERM", "ptrace=EPERM", "fd=EACCES", "environ=EACCES", "mem=EACCES"} {
		if !strings.Contains(res["spare"], want) {
			t.Errorf("the workload on the spare: got %q, want %s", res["spare"], want)
		}
	}
	// Controls in the same process: its own /proc files open, and it
	// may signal its own process group.
	wantPrefix(t, res, "read:"+self+"/environ", "ok")
	wantPrefix(t, res, "read:"+self+"/fd/0", "ok")
	wantPrefix(t, res, "kill:0", "ok")
	// That process ran on a spare, confined.
	if !strings.Contains(res["status"], "Seccomp=2") || !strings.Contains(res["status"], "NoNewPrivs=1") || !strings.Contains(res["status"], "CapEff=0000000000000000") {
		t.Errorf("status of a process started on a spare: got %q, want seccomp, no_new_privs, no capabilities", res["status"])
	}

	// The next spare is taken by the next start: the process has its pid.
	host, _ := spareOf(t, sb.HostPID())
	p, err := sb.Start(context.Background(), boundary.Process{Argv: []string{f.bin, actionHelper, "exit", "3"}, Env: []string{}})
	if err != nil {
		t.Fatal(err)
	}
	if p.HostPID() != host {
		t.Errorf("started as host pid %d, want the spare's %d", p.HostPID(), host)
	}
	if code, _ := p.Wait(); code != 3 {
		t.Errorf("exit code on a spare: got %d, want 3", code)
	}

	// Killed from outside, a spare costs only a fresh start.
	host, _ = spareOf(t, sb.HostPID())
	if err := unix.Kill(host, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, err := os.Stat("/proc/" + strconv.Itoa(host)); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the killed spare was not reaped")
		}
		time.Sleep(5 * time.Millisecond)
	}
	res = f.ops(t, sb, "status")
	if !strings.Contains(res["status"], "Seccomp=2") || !strings.Contains(res["status"], "NoNewPrivs=1") {
		t.Errorf("status after the spare was killed: got %q, want a confined process", res["status"])
	}

	// No spare outlives the sandbox.
	host, _ = spareOf(t, sb.HostPID())
	if err := sb.Terminate(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		st, err := os.ReadFile("/proc/" + strconv.Itoa(host) + "/stat")
		if err != nil || strings.Contains(string(st), ") Z ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the spare (host pid %d) outlived the sandbox", host)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// spareAttack runs in a workload: it waits for the init's next spare
// stage and tries to signal, stop, trace and open it.
func spareAttack() (string, error) {
	pid := 0
	for deadline := time.Now().Add(30 * time.Second); pid == 0 && time.Now().Before(deadline); {
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			n, err := strconv.Atoi(e.Name())
			if err != nil || n == os.Getpid() {
				continue
			}
			cmd, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
			if strings.HasSuffix(string(cmd), "\x00"+spareArg+"\x00") {
				pid = n
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	if pid == 0 {
		return "", errors.New("no spare stage visible")
	}
	name := func(err error) string {
		var en syscall.Errno
		if errors.As(err, &en) {
			return unix.ErrnoName(en)
		}
		if err != nil {
			return err.Error()
		}
		return "ok"
	}
	p := "/proc/" + strconv.Itoa(pid)
	out := []string{"kill=" + name(unix.Kill(pid, unix.SIGKILL)), "stop=" + name(unix.Kill(pid, unix.SIGSTOP))}
	err := unix.PtraceAttach(pid)
	if err == nil {
		unix.PtraceDetach(pid)
	}
	out = append(out, "ptrace="+name(err))
	for _, f := range []struct{ label, path string }{{"fd", "fd/0"}, {"environ", "environ"}, {"mem", "mem"}} {
		fd, err := unix.Open(p+"/"+f.path, unix.O_RDONLY, 0)
		if err == nil {
			unix.Close(fd)
		}
		out = append(out, f.label+"="+name(err))
	}
	return strings.Join(out, " "), nil
}

// TestSpareStageWithoutSeccomp: without the workload's seccomp filter the
// other walls still keep it from the spare (ptrace: the sibling user
// namespace and Landlock; signals: Landlock's scope). The control: the
// filter is really off (Seccomp 0 in the workload's status).
func TestSpareStageWithoutSeccomp(t *testing.T) {
	f := newFixture(t)
	testenv.Need(t, LandlockABI() >= minSpareABI, "Landlock ABI below 6 scopes no signals: the init forks no spare")
	testNoSeccomp = true
	sb := f.prepare(t)
	testNoSeccomp = false
	if code, out := f.run(t, sb, "exit", "0"); code != 0 {
		t.Fatalf("first start: exit %d: %s", code, out)
	}
	res := f.ops(t, sb, "spare", "status")
	if !strings.Contains(res["status"], "Seccomp=0") {
		t.Fatalf("status without the filter: got %q, want Seccomp=0", res["status"])
	}
	for _, want := range []string{"kill=EPERM", "stop=EPERM", "ptrace=EPERM", "fd=EACCES", "environ=EACCES", "mem=EACCES"} {
		if !strings.Contains(res["spare"], want) {
			t.Errorf("the workload on the spare, without seccomp: got %q, want %s", res["spare"], want)
		}
	}
}

// TestLastStartForksNoSpare: a start marked Last (moat run's workload, a
// tool server) takes the spare and has none forked after it; an ordinary
// start in the same sandbox is followed by one (the control), and a start
// after a Last one still works, on a fresh stage.
func TestLastStartForksNoSpare(t *testing.T) {
	f := newFixture(t)
	testenv.Need(t, LandlockABI() >= minSpareABI, "Landlock ABI below 6 scopes no signals: the init forks no spare")
	sb := f.prepare(t)
	if code, out := f.run(t, sb, "exit", "0"); code != 0 {
		t.Fatalf("first start: exit %d: %s", code, out)
	}
	host, _ := spareOf(t, sb.HostPID()) // the control: one after an ordinary start
	p, err := sb.Start(context.Background(), boundary.Process{Argv: []string{f.bin, actionHelper, "exit", "4"}, Env: []string{}, Last: true})
	if err != nil {
		t.Fatal(err)
	}
	if p.HostPID() != host {
		t.Errorf("the last start ran as host pid %d, want the spare's %d", p.HostPID(), host)
	}
	if code, _ := p.Wait(); code != 4 {
		t.Errorf("exit code of the last start: got %d, want 4", code)
	}
	// A spare is forked at once after an ordinary start (spareOf above
	// found it); after the last start, none comes.
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if h, _, ok := findSpare(sb.HostPID()); ok {
			t.Fatalf("a spare stage (host pid %d) was forked after the last start", h)
		}
	}
	if code, out := f.run(t, sb, "exit", "5"); code != 5 {
		t.Fatalf("a start after the last one: exit %d: %s", code, out)
	}
	spareOf(t, sb.HostPID())
}

// The spare's warm-up decodes a config that the real decoder accepts
// (every field of every type it holds), so that what it sets up is what
// the start's decode uses; a field added to stageConfig that the sample
// gets wrong fails here.
func TestWarmConfigDecode(t *testing.T) {
	if err := warmConfigDecode(); err != nil {
		t.Fatal(err)
	}
}
