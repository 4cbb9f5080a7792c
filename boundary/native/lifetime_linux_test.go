package native

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/internal/testenv"
	"github.com/moat-sandbox/moat/policy"
)

const policyEnv = "MOAT_NATIVE_TEST_POLICY"

// superviseAction is a supervisor in its own process: it prepares a
// sandbox, starts a workload that leaves a detached setsid grandchild, says
// "ready", and waits to be killed.
func superviseAction(args []string) int {
	var pol policy.Policy
	if err := json.Unmarshal([]byte(os.Getenv(policyEnv)), &pol); err != nil {
		fmt.Println("policy:", err)
		return 1
	}
	be, _ := boundary.Lookup(Name)
	sb, err := be.Prepare(context.Background(), boundary.Spec{RunID: "kill", Policy: &pol, StateDir: os.TempDir()})
	if err != nil {
		fmt.Println("prepare:", err)
		return 1
	}
	r, w, _ := os.Pipe()
	_, err = sb.Start(context.Background(), boundary.Process{Argv: append(args[:1:1], actionArgs("doublefork", args[1:]...)...), Stdout: w})
	w.Close()
	if err != nil {
		fmt.Println("start:", err)
		return 1
	}
	line, _ := bufio.NewReader(r).ReadString('\n')
	fmt.Printf("ready %d %s", sb.HostPID(), line)
	time.Sleep(time.Hour)
	return 0
}

// markedPIDs lists host processes whose argv contains marker.
func markedPIDs(marker string) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && bytes.Contains(b, []byte(marker)) {
			out = append(out, pid)
		}
	}
	return out
}

func TestSupervisorKillTakesSandboxDown(t *testing.T) {
	f := newFixture(t)
	marker := fmt.Sprintf("moat-marker-%d-%d", os.Getpid(), time.Now().UnixNano())
	pj, err := json.Marshal(f.pol)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(f.bin, actionArgs("supervise", f.bin, marker)...)
	cmd.Env = append(os.Environ(), policyEnv+"="+string(pj))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(out).ReadString('\n')
	if !strings.HasPrefix(line, "ready ") || !strings.Contains(line, "forked") {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("supervisor: got %q, want ready … forked", line)
	}
	// Control: the workload and its detached grandchild are there, with
	// the marker in argv, and the grandchild is in a session of its own.
	before := markedPIDs(marker)
	if len(before) < 2 {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("before the kill: got %d marked processes, want the workload and its grandchild", len(before))
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	// Poll until the kernel has torn the PID namespace down (a condition,
	// not a timing measurement); fail if it never happens.
	deadline := time.Now().Add(20 * time.Second)
	for {
		left := markedPIDs(marker)
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after SIGKILL of the supervisor, sandbox processes remain: %v", left)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestTTY(t *testing.T) {
	f := newFixture(t)
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	testenv.Need(t, err == nil, "no /dev/ptmx")
	defer master.Close()
	if err := unix.IoctlSetPointerInt(int(master.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(master.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	slave, err := os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer slave.Close()
	sb := f.prepare(t)
	// The first start forks a fresh stage; the second runs on the spare
	// (where the init forks one), which sets the terminal up itself.
	for i, stage := range []string{"fresh", "spare"} {
		spare := 0
		if stage == "spare" {
			if LandlockABI() < minSpareABI {
				continue
			}
			spare, _ = spareOf(t, sb.HostPID())
		}
		p, err := sb.Start(context.Background(), boundary.Process{Argv: append([]string{f.bin}, actionArgs("ops", "tty")...), TTY: slave})
		if err != nil {
			t.Fatal(err)
		}
		if spare != 0 && p.HostPID() != spare {
			t.Errorf("start %d: host pid %d, want the spare's %d", i, p.HostPID(), spare)
		}
		got := make(chan string, 1)
		go func() {
			b := make([]byte, 4096)
			var acc []byte
			for !bytes.Contains(acc, []byte("\n")) {
				n, err := master.Read(b)
				if err != nil {
					break
				}
				acc = append(acc, b[:n]...)
			}
			got <- string(acc)
		}()
		if code, _ := p.Wait(); code != 0 {
			t.Fatalf("tty workload (%s stage) exited %d", stage, code)
		}
		select {
		case s := <-got:
			if !strings.Contains(s, "tty ok controlling") {
				t.Errorf("tty workload (%s stage): got %q, want the terminal as its controlling tty", stage, s)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("no output on the terminal (%s stage)", stage)
		}
	}
}

// TestExecLeavesNothingRunning: a process is reported exited only when
// everything it started is gone. The workload leaves a detached setsid
// grandchild and is then killed; Wait returns, and the grandchild is gone
// too. The control: before the kill, both run.
func TestExecLeavesNothingRunning(t *testing.T) {
	f := newFixture(t)
	sb := f.prepare(t)
	marker := fmt.Sprintf("moat-linger-%d-%d", os.Getpid(), time.Now().UnixNano())
	r, w, _ := os.Pipe()
	defer r.Close()
	p, err := sb.Start(context.Background(), boundary.Process{Argv: append([]string{f.bin}, actionArgs("doublefork", marker)...), Stdout: w})
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	if line, _ := bufio.NewReader(r).ReadString('\n'); line != "forked\n" {
		t.Fatalf("workload said %q", line)
	}
	if n := len(markedPIDs(marker)); n < 2 {
		t.Fatalf("control: %d marked processes before the kill, want the workload and its grandchild", n)
	}
	if err := p.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Wait(); err != nil {
		t.Fatal(err)
	}
	if left := markedPIDs(marker); len(left) != 0 {
		t.Errorf("after Wait returned, still running: %v", left)
	}
}

// TestExecParentExitsAtOnce: the workload starts a detached setsid child
// and exits at once (sh -c "sleep 700 &"); when Wait returns, the child is
// gone too, every time, in 100 rounds (the namespace that names the process's
// descendants is taken before the workload exists, not after it exited).
func TestExecParentExitsAtOnce(t *testing.T) {
	f := newFixture(t)
	sb := f.prepare(t)
	for i := range 100 {
		// A unique sleep length is the marker in the child's argv.
		marker := fmt.Sprintf("9%d%03d", time.Now().UnixNano()%1e9, i)
		p, err := sb.Start(context.Background(), boundary.Process{Argv: []string{"/bin/sh", "-c", "sleep " + marker + " &"}, Env: []string{"PATH=/usr/bin:/bin"}})
		if err != nil {
			t.Fatal(err)
		}
		if code, err := p.Wait(); err != nil || code != 0 {
			t.Fatalf("round %d: exit %d, %v", i, code, err)
		}
		if left := markedPIDs(marker); len(left) != 0 {
			t.Fatalf("round %d: after Wait returned, still running: %v", i, left)
		}
	}
}
