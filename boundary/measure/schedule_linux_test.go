package measure

import (
	"fmt"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestScheduleKeepsForksOffTheBrokerConnection runs the helper's
// scheduler on a plan of every kind of probe, with a broker probe that
// takes a while (the host attributing it), and checks what must hold: no
// probe that forks starts before the broker probe has ended, at most probeWorkers other probes run at once, and each
// probe runs exactly once. The control, in the same run: probes that do
// not fork do run while the broker probe is still under way (the point of
// the scheduler; a scheduler that ran everything in turn would pass the
// rest).
func TestScheduleKeepsForksOffTheBrokerConnection(t *testing.T) {
	ops := []string{opInheritedFDs, opRead, opWrite, opUnshare, opTCP, opTCPBroker, opExec, opCloneUser,
		opDNSUDP, opSetuid, opSetuid, opInterfaces, opRoutes, opCaps, opStatList, opUnix, opFIFO, opNoNewPrivs}
	var probes []probe
	for i, op := range ops {
		probes = append(probes, probe{ID: fmt.Sprintf("%d/%s", i, op), Op: op})
	}
	waiting := func(i int) bool { return probes[i].Op == opExec }

	var mu sync.Mutex
	type span struct{ start, end time.Time }
	spans := make([]span, len(probes))
	runs := make([]int, len(probes))
	running, maxPool := 0, 0
	run := func(i int) {
		op := probes[i].Op
		mu.Lock()
		runs[i]++
		spans[i].start = time.Now()
		pool := op != opTCPBroker && !forks(op) && !waiting(i)
		if pool {
			running++
			maxPool = max(maxPool, running)
		}
		mu.Unlock()
		switch {
		case op == opTCPBroker:
			time.Sleep(200 * time.Millisecond)
		default:
			time.Sleep(5 * time.Millisecond)
		}
		mu.Lock()
		spans[i].end = time.Now()
		if pool {
			running--
		}
		mu.Unlock()
	}
	schedule(probes, waiting, run)

	var broker span
	for i, p := range probes {
		if p.Op == opTCPBroker {
			broker = spans[i]
		}
	}
	beside := 0
	for i, p := range probes {
		if runs[i] != 1 {
			t.Errorf("%s ran %d times", p.ID, runs[i])
		}
		if forks(p.Op) && spans[i].start.Before(broker.end) {
			t.Errorf("%s (it forks) started %v before the broker probe ended", p.ID, broker.end.Sub(spans[i].start))
		}
		if !forks(p.Op) && p.Op != opTCPBroker && spans[i].start.Before(broker.end) {
			beside++
		}
	}
	if maxPool > probeWorkers {
		t.Errorf("%d probes ran at once in the pool, want at most %d", maxPool, probeWorkers)
	}
	if beside == 0 {
		t.Errorf("control: no probe ran beside the broker probe")
	}
}

// TestForkFailureIsNoEvidence: a child that could not be made for want of
// a process or memory says nothing about what the child was to try; a
// refusal of the namespace or the exec does.
func TestForkFailureIsNoEvidence(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&os.PathError{Op: "fork/exec", Path: "/proc/self/exe", Err: syscall.EAGAIN}, true},
		{fmt.Errorf("wrapped: %w", syscall.ENOMEM), true},
		{&os.PathError{Op: "fork/exec", Path: "/proc/self/exe", Err: syscall.EPERM}, false},
		{&os.PathError{Op: "fork/exec", Path: "/proc/self/exe", Err: syscall.ENOSPC}, false},
		{&os.PathError{Op: "fork/exec", Path: "/x", Err: syscall.EACCES}, false},
	} {
		if got := outOfProcesses(tc.err); got != tc.want {
			t.Errorf("outOfProcesses(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
