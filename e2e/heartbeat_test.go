//go:build linux

package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/fsutil"
	"github.com/moat-sandbox/moat/internal/testenv"
)

// procStart is the start time of a live process (fsutil.ProcStart: field
// 22 of /proc/pid/stat), 0 for a missing or zombie one: pid and start
// time together name one process, whatever reuses the pid.
func procStart(pid int) uint64 { return fsutil.ProcStart(pid) }

// supervisorTimeout is the policy's process.supervisor_timeout in these
// tests.
const supervisorTimeout = 2 * time.Second

// heartbeatSandbox creates a sandbox of backend whose policy has a 2s
// supervisor timeout, starts a marked workload in it, and returns the
// sandbox's state and the workload's host pid and start time. Under
// gVisor the workload is no host process: what is watched is the
// sandbox's init, the pid 1 of the PID namespace that holds runsc, its
// sandbox and every exec.
func heartbeatSandbox(t *testing.T, e *env, name, backend string) (sbState, int, uint64) {
	t.Helper()
	pol := e.policyAt(e.dir+"/hb-policy.yaml", e.workspace, "")
	b, err := os.ReadFile(pol)
	if err != nil {
		t.Fatal(err)
	}
	y := strings.Replace(string(b), "process:\n", fmt.Sprintf("process:\n  supervisor_timeout: %s\n", supervisorTimeout), 1)
	y = strings.Replace(y, "version: 1\n", "version: 1\nbackend: "+backend+"\n", 1)
	if err := os.WriteFile(pol, []byte(y), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := e.moat("sandbox", "create", "--name", name, "--policy", pol); r.code != 0 {
		t.Fatalf("create: %s", r)
	}
	marker := fmt.Sprintf("moat-e2e-hb-%d", time.Now().UnixNano())
	ex := e.command("sandbox", "exec", name, "--", "sh", "-c", "sleep 300 # "+marker)
	if err := ex.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ex.Process.Kill(); ex.Wait() })
	var pid int
	if backend == "gvisor" {
		// The exec is running once the sandbox lists it.
		waitFor(t, "the workload", 30*time.Second, func() bool {
			s, _ := e.get(name)
			pid = s.HostPID
			return len(s.Processes) > 0 && pid > 0
		})
	} else {
		pid = markedWorkload(t, marker, ex.Process.Pid)
	}
	start := procStart(pid)
	s, _ := e.get(name)
	if s.SupervisorPID == 0 || start == 0 {
		t.Fatalf("no supervisor pid (%d) or workload start time (%d)", s.SupervisorPID, start)
	}
	sv := s.SupervisorPID
	svStart := procStart(sv)
	t.Cleanup(func() {
		if procStart(sv) == svStart {
			syscall.Kill(sv, syscall.SIGKILL)
		}
		e.moat("sandbox", "delete", name)
	})
	return s, pid, start
}

// supervisorLoss: sig stops the supervisor of a sandbox (after a healthy
// supervisor kept the workload running past the timeout); the workload,
// observed from the host by pid and start time, dies; the journal is an
// intact prefix.
func supervisorLoss(t *testing.T, backend string, sig syscall.Signal) {
	e := newEnv(t)
	s, pid, start := heartbeatSandbox(t, e, "hb", backend)
	// Positive control: a live supervisor beats; the workload outlives
	// twice the timeout.
	time.Sleep(2 * supervisorTimeout)
	if procStart(pid) != start {
		t.Fatalf("the workload died under a healthy supervisor (timeout %s)", supervisorTimeout)
	}
	if err := syscall.Kill(s.SupervisorPID, sig); err != nil {
		t.Fatal(err)
	}
	lost := time.Now()
	waitFor(t, "the workload's death", supervisorTimeout+15*time.Second, func() bool {
		return procStart(pid) != start && !procAlive(s.HostPID)
	})
	t.Logf("workload dead %s after %s of the supervisor", time.Since(lost).Round(time.Millisecond), sig)
	if sig == syscall.SIGSTOP {
		// Still stopped: the death is the heartbeat's, not the
		// supervisor's doing. Then the supervisor dies as one would.
		if st := procState(s.SupervisorPID); st != "T" {
			t.Errorf("supervisor state %q, want T (stopped)", st)
		}
		syscall.Kill(s.SupervisorPID, syscall.SIGKILL)
	}
	waitFor(t, "the supervisor's death", 10*time.Second, func() bool { return !procAlive(s.SupervisorPID) })
	if v := e.moat("audit", "verify", s.Journal, "--pubkey", s.PublicKey); v.code != 2 {
		t.Errorf("journal after the supervisor's %s: got exit %d, want 2 (intact prefix)\n%s", sig, v.code, v)
	}
}

// procState is the state letter of pid ("" when gone).
func procState(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return ""
	}
	return s[i+2 : i+3]
}

// TestSupervisorStopKillsWorkload: a stopped supervisor no longer beats;
// the init kills the workload after process.supervisor_timeout.
func TestSupervisorStopKillsWorkload(t *testing.T) { supervisorLoss(t, "native", syscall.SIGSTOP) }

// TestSupervisorKillKillsWorkload: a killed supervisor takes the workload
// with it.
func TestSupervisorKillKillsWorkload(t *testing.T) { supervisorLoss(t, "native", syscall.SIGKILL) }

// markedWorkload is the host pid of the process in the sandbox whose argv
// carries marker (not execPID, the host's `moat sandbox exec`).
func markedWorkload(t *testing.T, marker string, execPID int) int {
	t.Helper()
	var pid int
	waitFor(t, "the workload", 20*time.Second, func() bool {
		for _, p := range findMarked(marker) {
			if p != execPID {
				pid = p
				return true
			}
		}
		return false
	})
	return pid
}

// TestRootSupervisorStopKillsWorkloadGVisor: the same under gVisor.
func TestRootSupervisorStopKillsWorkloadGVisor(t *testing.T) {
	testenv.NeedRoot(t)
	_, err := exec.LookPath("runsc")
	testenv.Need(t, err == nil, "runsc is not installed")
	supervisorLoss(t, "gvisor", syscall.SIGSTOP)
}

// TestSupervisorResumedAfterLoss: a supervisor stopped past the timeout
// and then continued finds its sandbox gone: the sandbox is in Error with
// the reason, a new exec is refused (125), the journal is closed as
// failed and verifies, and delete works.
func TestSupervisorResumedAfterLoss(t *testing.T) {
	e := newEnv(t)
	s, pid, start := heartbeatSandbox(t, e, "hb", "native")
	// Positive control in the same setup: exec works before the loss.
	if r := e.moat("sandbox", "exec", "hb", "--", "true"); r.code != 0 {
		t.Fatalf("exec before the loss: %s", r)
	}
	if err := syscall.Kill(s.SupervisorPID, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the workload's death", supervisorTimeout+15*time.Second, func() bool { return procStart(pid) != start })
	if err := syscall.Kill(s.SupervisorPID, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	var g sbState
	waitFor(t, "the sandbox in Error", 10*time.Second, func() bool {
		g, _ = e.get("hb")
		return g.Phase == "Error"
	})
	if !strings.Contains(g.Error, "supervisor_timeout") {
		t.Errorf("error %q does not say why the sandbox ended", g.Error)
	}
	if r := e.moat("sandbox", "exec", "hb", "--", "true"); r.code != 125 {
		t.Errorf("exec after the loss: got %s, want exit 125", r)
	}
	// The resumed supervisor closes the journal: complete, terminated as
	// failed, every record verified.
	if v := e.moat("audit", "verify", s.Journal, "--pubkey", s.PublicKey); v.code != 0 || !strings.Contains(v.stdout, "terminated: failed") {
		t.Errorf("journal after the loss: got exit %d, want 0 and terminated: failed\n%s", v.code, v)
	}
	if r := e.moat("sandbox", "delete", "hb"); r.code != 0 {
		t.Errorf("delete after the loss: %s", r)
	}
	if _, r := e.get("hb"); r.code == 0 {
		t.Errorf("still there after delete: %s", r)
	}
}
