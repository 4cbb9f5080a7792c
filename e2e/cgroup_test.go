//go:build linux

package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/testenv"
)

// TestRootSweepsStaleCgroups: cgroups left when moat and its reaper were
// both SIGKILLed (red-team finding F4) are removed by the next moat's
// reaper: an old, empty moat-* cgroup is gone after one moat run. Kept:
// one with a live process in it, one held by a live run's lock (flock, as
// every run holds its own), and one younger than the sweep's grace (the
// moment between a run's mkdir and its lock).
func TestRootSweepsStaleCgroups(t *testing.T) {
	testenv.NeedRoot(t)
	e := newEnv(t)
	root := "/sys/fs/cgroup/pids" // a v1 hierarchy's root, where runsc makes its cgroups
	if _, err := os.Stat(filepath.Join(root, "cgroup.procs")); err != nil {
		root = "/sys/fs/cgroup" // cgroup v2
	}
	_, err := os.Stat(filepath.Join(root, "cgroup.procs"))
	testenv.Need(t, err == nil, "no cgroup hierarchy at "+root)
	old := time.Now().Add(-10 * time.Minute)
	mk := func(kind string, aged bool) string {
		d := filepath.Join(root, fmt.Sprintf("moat-e2e-%s-%d", kind, os.Getpid()))
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Rmdir(d) })
		if aged {
			if err := os.Chtimes(d, old, old); err != nil {
				t.Fatal(err)
			}
		}
		return d
	}
	stale, live, locked, fresh := mk("stale", true), mk("live", true), mk("locked", true), mk("fresh", false)
	sleep := exec.Command("sleep", "120")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sleep.Process.Kill(); sleep.Wait() })
	if err := os.WriteFile(filepath.Join(live, "cgroup.procs"), []byte(strconv.Itoa(sleep.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}
	lk, err := os.Open(locked)
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Close()
	if err := unix.Flock(int(lk.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	if r := e.moat("run", "--policy", e.policy(""), "--", "/bin/true"); r.code != 0 {
		t.Fatalf("moat run: %s", r)
	}
	waitFor(t, "the stale cgroup "+stale+" to be swept", 30*e2eSecond, func() bool {
		_, err := os.Stat(stale)
		return os.IsNotExist(err)
	})
	for _, d := range []string{live, locked, fresh} {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("%s: %v, want it kept", d, err)
		}
	}
}
