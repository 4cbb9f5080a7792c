package native

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/internal/reaper"
	"github.com/moat-sandbox/moat/policy"
)

// cgroupRoot is where cgroup v1 controllers are mounted.
const cgroupRoot = "/sys/fs/cgroup"

// cgroupRemoveTries bounds the retries of removing a cgroup whose last
// task is still exiting.
const cgroupRemoveTries = 50

// cgroups is a per-sandbox child cgroup in each v1 controller moat uses.
type cgroups struct {
	dirs   []string
	reaper *reaper.Reaper
}

// newCgroups creates the sandbox's memory and pids cgroups where this host
// lets moat do so (root, cgroup v1), and says which limits hold. It never
// pretends: a limit that is not applied is reported with the reason.
func newCgroups(runID string, lim policy.Limits, rp *reaper.Reaper) (*cgroups, boundary.LimitsStatus) {
	var st boundary.LimitsStatus
	if lim.Memory <= 0 && lim.Pids <= 0 {
		st.Detail = "the policy sets no memory or pids limit"
		return nil, st
	}
	if os.Geteuid() != 0 {
		st.Detail = "memory and pids limits are not enforced: moat is not root and cgroup delegation to unprivileged users is not implemented (RLIMIT_NPROC is per-uid and is not a substitute)"
		return nil, st
	}
	if _, err := os.Stat(filepath.Join(cgroupRoot, "cgroup.controllers")); err == nil {
		st.Detail = "memory and pids limits are not enforced: this host uses cgroup v2, which moat does not manage yet"
		return nil, st
	}
	cg := &cgroups{reaper: rp}
	var why []string
	name := "moat-" + sanitize(runID)
	setup := func(ctrl, file string, val int64) bool {
		base := filepath.Join(cgroupRoot, ctrl)
		if _, err := os.Stat(filepath.Join(base, "cgroup.procs")); err != nil {
			why = append(why, fmt.Sprintf("%s: no cgroup v1 controller at %s", ctrl, base))
			return false
		}
		dir := filepath.Join(base, ownCgroup(ctrl), name)
		// The reaper owns it before it exists, so that no kill leaves it.
		cg.reaper.Own(dir, false)
		if err := os.Mkdir(dir, 0o755); err != nil {
			cg.reaper.Done(dir) // not ours
			why = append(why, fmt.Sprintf("%s: %v", ctrl, err))
			return false
		}
		cg.dirs = append(cg.dirs, dir)
		if err := os.WriteFile(filepath.Join(dir, file), []byte(strconv.FormatInt(val, 10)), 0); err != nil {
			why = append(why, fmt.Sprintf("%s: %v", ctrl, err))
			return false
		}
		return true
	}
	if lim.Memory > 0 {
		st.Memory = setup("memory", "memory.limit_in_bytes", int64(lim.Memory))
	}
	if lim.Pids > 0 {
		st.Pids = setup("pids", "pids.max", int64(lim.Pids))
	}
	if len(why) > 0 {
		st.Detail = "not enforced: " + strings.Join(why, "; ")
	}
	if len(cg.dirs) == 0 {
		return nil, st
	}
	return cg, st
}

// ownCgroup is this process's cgroup path in a v1 controller.
func ownCgroup(ctrl string) string {
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return "/"
	}
	defer f.Close()
	return parseCgroupPath(f, ctrl)
}

// maxProcCgroupBytes bounds what is read of /proc/self/cgroup.
const maxProcCgroupBytes = 64 << 10

// parseCgroupPath finds ctrl's path in /proc/<pid>/cgroup content
// ("id:controllers:path" lines). Only clean absolute paths are accepted;
// anything else is "/".
func parseCgroupPath(r io.Reader, ctrl string) string {
	sc := bufio.NewScanner(io.LimitReader(r, maxProcCgroupBytes))
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == ctrl && ctrl != "" {
				if p := parts[2]; filepath.IsAbs(p) && filepath.Clean(p) == p {
					return p
				}
				return "/"
			}
		}
	}
	return "/"
}

func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' {
			return r
		}
		return '_'
	}, s)
}

// add moves pid (the init, before it starts anything) into every cgroup.
func (cg *cgroups) add(pid int) error {
	for _, d := range cg.dirs {
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
			return fmt.Errorf("adding the init to %s: %w", d, err)
		}
	}
	return nil
}

// remove deletes the cgroups once their tasks are gone.
func (cg *cgroups) remove() error {
	var errs []error
	for _, d := range cg.dirs {
		var err error
		for i := 0; i < cgroupRemoveTries; i++ {
			if err = os.Remove(d); err == nil || errors.Is(err, os.ErrNotExist) {
				err = nil
				cg.reaper.Done(d)
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	cg.dirs = nil
	return errors.Join(errs...)
}

// oomKills reads the memory cgroup's count of OOM kills (memory.oom_control
// "oom_kill N", cgroup v1).
func (cg *cgroups) oomKills() (uint64, bool) {
	if cg == nil {
		return 0, false
	}
	for _, d := range cg.dirs {
		if !strings.Contains(d, "/memory/") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(d, "memory.oom_control"))
		if err != nil {
			return 0, false
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
				n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
				return n, err == nil
			}
		}
	}
	return 0, false
}
