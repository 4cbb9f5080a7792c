//go:build linux

package e2e

import (
	"errors"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// TestRunSignalAtStartOffsets: SIGTERM to moat run at many offsets from
// its start (before the journal, during the measurement, around the
// workload's start, while it runs). Every time: moat ends with the
// signal's code (143), or, before it installed its handler, by the signal
// itself; a journal that exists is complete (its terminal record was
// written); nothing of the run is left in the temporary directory. 200
// tries in CI (20 elsewhere), seeded; the seed is logged.
func TestRunSignalAtStartOffsets(t *testing.T) {
	e := newEnv(t)
	pol := e.policy("")
	tries := 20
	if os.Getenv("CI") == "true" {
		tries = 200
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("MOAT_SIGNAL_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d (MOAT_SIGNAL_SEED replays it)", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	for i := range tries {
		audit := filepath.Join(e.dir, "audit-"+strconv.Itoa(i))
		cmd := e.command("run", "--policy", pol, "--audit-dir", audit, "--", "/bin/sleep", "10")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		delay := time.Duration(rng.IntN(400)) * time.Millisecond
		time.Sleep(delay)
		cmd.Process.Signal(syscall.SIGTERM)
		err := cmd.Wait()
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Fatalf("try %d (after %v): moat exited 0 or could not be waited for: %v", i, delay, err)
		}
		ws := ee.Sys().(syscall.WaitStatus)
		if !(ws.Exited() && ws.ExitStatus() == 143) && !(ws.Signaled() && ws.Signal() == syscall.SIGTERM) {
			t.Fatalf("try %d (after %v): moat ended with %v, want exit 143 or the signal", i, delay, ws)
		}
		runs, _ := filepath.Glob(filepath.Join(audit, "*"))
		for _, run := range runs {
			r := e.moat("audit", "verify", run)
			if r.code != 0 {
				t.Fatalf("try %d (after %v): the journal of %s is not complete: %s", i, delay, run, r)
			}
			id := filepath.Base(run)
			waitFor(t, "no staging directory of "+id, 30*e2eSecond, func() bool {
				m, _ := filepath.Glob(filepath.Join(os.TempDir(), "moat-"+id+"-*"))
				return len(m) == 0
			})
		}
		if ws.Signaled() && len(runs) > 0 {
			t.Fatalf("try %d (after %v): moat died of the signal after it had made a run", i, delay)
		}
	}
}
