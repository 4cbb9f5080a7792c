package native

import (
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A stage's exit is reported while another stage is being forked (mu held
// through its fork and exec): it used to wait for that fork, so a short
// command's exit came as late as the spare stage forked after its start.
// The control: a child that is not registered (a stage in mid-fork looks
// like one) is not reaped while mu is held, and is once the fork is done.
func TestReapNotHeldByFork(t *testing.T) {
	if os.Getenv("MOAT_TEST_REAP") == "" {
		// The reaper collects any child of its process: it runs alone, in
		// a process of its own.
		cmd := exec.Command(os.Args[0], "-test.run=^TestReapNotHeldByFork$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), "MOAT_TEST_REAP=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestReapNotHeldByFork") {
			t.Fatalf("the test's own process: %v\n%s", err, out)
		}
		return
	}
	in := &initState{procs: map[int]*initProc{}, forked: make(chan struct{}, 1)}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, unix.SIGCHLD)
	go in.reap(sigs)
	// Each child exits when its stdin closes.
	child := func(code string) (*os.Process, *os.File) {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		p, err := os.StartProcess("/bin/sh", []string{"sh", "-c", "read x; exit " + code}, &os.ProcAttr{Files: []*os.File{r, nil, os.Stderr}})
		if err != nil {
			t.Fatal(err)
		}
		return p, w
	}
	in.mu.Lock() // a stage is being forked
	stage, endStage := child("7")
	ip := &initProc{exit: make(chan int, 1)}
	in.procsMu.Lock()
	in.procs[stage.Pid] = ip
	in.procsMu.Unlock()
	orphan, endOrphan := child("0")

	endOrphan.Close()
	waitZombie(t, orphan.Pid)
	endStage.Close()
	select {
	case code := <-ip.exit:
		if code != 7 {
			t.Errorf("the stage's exit code is %d, want 7", code)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the stage's exit was not reported while another stage was being forked")
	}
	if !zombie(t, orphan.Pid) {
		t.Fatal("a child that is not registered was reaped while a stage was being forked")
	}
	in.forkDone()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := os.Stat("/proc/" + strconv.Itoa(orphan.Pid)); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the child that is not registered was not reaped once the fork was done")
		}
		time.Sleep(5 * time.Millisecond)
	}
	in.procsMu.Lock()
	defer in.procsMu.Unlock()
	if len(in.procs) != 0 {
		t.Errorf("procs still holds %v", in.procs)
	}
}

func waitZombie(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !zombie(t, pid) {
		if time.Now().After(deadline) {
			t.Fatalf("pid %d did not end", pid)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
