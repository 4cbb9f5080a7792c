package native

import (
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/testenv"
)

// The init is moved into its cgroups while it builds the root (the move
// waits for an RCU grace period on cgroup v1), but Prepare returns only
// once the move is done: held back here by 300 ms, the move must still be
// complete when Prepare returns, before any process is started.
func TestRootInitInCgroupsWhenPrepared(t *testing.T) {
	testenv.NeedRoot(t)
	f := newFixture(t)
	var held atomic.Bool
	testBeforeCgroupAdd = func() { time.Sleep(300 * time.Millisecond); held.Store(true) }
	t.Cleanup(func() { testBeforeCgroupAdd = nil })
	sb := f.prepare(t)
	l := sb.Limits()
	testenv.Need(t, l.Memory || l.Pids, "no memory or pids cgroup here: "+l.Detail)
	if !held.Load() {
		t.Fatal("Prepare returned before the held-back cgroup move ran")
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", sb.HostPID()))
	if err != nil {
		t.Fatal(err)
	}
	name := "moat-" + sanitize("test-"+fmt.Sprint(os.Getpid()))
	var in []string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if strings.Contains(line, "/"+name) {
			in = append(in, line)
		}
	}
	if len(in) == 0 {
		t.Fatalf("the init (pid %d) is in none of the run's cgroups (%s) once Prepare returned:\n%s", sb.HostPID(), name, b)
	}
	// And the first process started is in them too (it inherits them).
	code, out := f.run(t, sb, "forkmany", "1")
	if code != 0 {
		t.Fatalf("a process after Prepare exited %d: %s", code, out)
	}
}

// On cgroup v1 the init is born in its cgroups: the thread that forks it
// moves itself into them for the fork and back after it. Every thread of
// this process must be out of the run's cgroups once Prepare returns,
// while the init (control: the same check finds the name) is in them.
func TestRootInitBornInCgroupsThreadsBack(t *testing.T) {
	testenv.NeedRoot(t)
	f := newFixture(t)
	sb := f.prepare(t)
	l := sb.Limits()
	testenv.Need(t, l.Memory || l.Pids, "no memory or pids cgroup here: "+l.Detail)
	name := "/moat-" + sanitize("test-"+fmt.Sprint(os.Getpid()))
	initCg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", sb.HostPID()))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(initCg), name) {
		t.Fatalf("control: the init's cgroups do not name %s:\n%s", name, initCg)
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		b, err := os.ReadFile("/proc/self/task/" + task.Name() + "/cgroup")
		if err != nil {
			continue // the thread ended
		}
		if strings.Contains(string(b), name) {
			t.Errorf("thread %s of moat is still in the run's cgroups:\n%s", task.Name(), b)
		}
	}
	// The thread that forked the init lives as long as the sandbox
	// (Pdeathsig): the cgroups are removed after it is released.
	if err := sb.Terminate(); err != nil {
		t.Fatalf("Terminate: %v", err)
	}
}
