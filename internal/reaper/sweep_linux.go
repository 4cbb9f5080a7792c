package reaper

import (
	"time"

	"github.com/moat-sandbox/moat/internal/cgroup"
)

// sweepWait bounds how long the helper, once moat is gone, waits for its
// sweep to finish (a host with many leftovers takes a few seconds once).
const sweepWait = 10 * time.Second

// startSweep removes, in the background, the moat-* cgroups that dead
// runs left when both moat and its reaper were SIGKILLed (internal/cgroup
// Sweep: old enough, unlocked by any live run, empty, and rmdir succeeds).
// The returned function waits for it, at most d.
func startSweep() (wait func(d time.Duration)) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		h, err := cgroup.ReadHost()
		if err != nil {
			return
		}
		cgroup.Sweep(cgroup.OS{}, cgroup.SweepDirs(h), time.Now(), cgroup.SweepGrace)
	}()
	return func(d time.Duration) {
		select {
		case <-done:
		case <-time.After(d):
		}
	}
}
