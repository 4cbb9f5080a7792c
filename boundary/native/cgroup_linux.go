package native

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/internal/cgroup"
	"github.com/moat-sandbox/moat/internal/reaper"
	"github.com/moat-sandbox/moat/policy"
)

// cgroupRoot is where the cgroup file systems are mounted.
const cgroupRoot = cgroup.DefaultRoot

// cgroups is the sandbox's cgroups (one per cgroup v1 hierarchy used, one
// in cgroup v2), made by internal/cgroup.
type cgroups struct {
	g      *cgroup.Group
	reaper *reaper.Reaper
}

// newCgroups creates the sandbox's memory and pids cgroups where this host
// lets moat do so (root on cgroup v1 and v2, rootless in a delegated
// cgroup v2 subtree), and says which limits hold. It never pretends: a
// limit that is not applied is reported with the reason.
func newCgroups(runID string, lim policy.Limits, rp *reaper.Reaper) (*cgroups, boundary.LimitsStatus) {
	var st boundary.LimitsStatus
	if lim.Memory <= 0 && lim.Pids <= 0 {
		st.Detail = "the policy sets no memory or pids limit"
		return nil, st
	}
	h, err := cgroup.ReadHost()
	if err != nil {
		st.Detail = "memory and pids limits are not enforced: " + err.Error()
		return nil, st
	}
	// The reaper owns each directory before it exists, so that no kill
	// leaves it.
	g, cs := cgroup.Create(cgroup.OS{}, h, "moat-"+sanitize(runID), cgroup.Limits{Memory: int64(lim.Memory), Pids: int64(lim.Pids)},
		func(dir string) { rp.Own(dir, false) })
	st.Memory, st.Pids, st.Detail = cs.Memory, cs.Pids, cs.Detail
	if g == nil {
		return nil, st
	}
	return &cgroups{g: g, reaper: rp}, st
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
func (cg *cgroups) add(pid int) error { return cg.g.Add(pid) }

// threadEntry reports whether the init can be born in its cgroups: every
// one of them is a cgroup v1 cgroup, whose tasks file moves one thread.
func (cg *cgroups) threadEntry() bool {
	dirs := cg.g.Dirs()
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "tasks")); err != nil {
			return false
		}
	}
	return len(dirs) > 0
}

// enterThread moves the calling OS thread, which must be locked, into
// every cgroup of the sandbox, so that the process it forks next is born
// in them; leave moves the thread back where it was and checks that it
// is (/proc/thread-self/cgroup as before), and fails otherwise.
//
// Why: moving a process (a write of its pid to cgroup.procs, or of any
// pid to tasks) takes the kernel's global threadgroup lock for writing,
// which waits for an RCU grace period: 10 to 30 ms on cgroup v1 on the
// bench machine, the largest part of a cold start. A thread that moves
// itself (it writes "0" to tasks) moves alone and takes no such lock:
// 0.05 ms. The init is then in its cgroups before it runs at all, not
// moved there while it builds the root.
func (cg *cgroups) enterThread() (leave func() error, err error) {
	before, err := os.ReadFile("/proc/thread-self/cgroup")
	if err != nil {
		return nil, err
	}
	var entered []string
	leave = func() error {
		var errs []error
		for i := len(entered) - 1; i >= 0; i-- {
			if err := moveThread(filepath.Dir(entered[i])); err != nil {
				errs = append(errs, err)
			}
		}
		if err := errors.Join(errs...); err != nil {
			return err
		}
		after, err := os.ReadFile("/proc/thread-self/cgroup")
		if err != nil {
			return err
		}
		if !bytes.Equal(after, before) {
			return fmt.Errorf("moat's thread did not return to its cgroups: %q, was %q", after, before)
		}
		return nil
	}
	for _, d := range cg.g.Dirs() {
		if err := moveThread(d); err != nil {
			if lerr := leave(); lerr != nil {
				err = errors.Join(err, lerr)
			}
			return nil, err
		}
		entered = append(entered, d)
	}
	return leave, nil
}

// moveThread moves the calling thread alone into the cgroup v1 cgroup dir.
func moveThread(dir string) error {
	f, err := os.OpenFile(filepath.Join(dir, "tasks"), os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString("0")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("moving moat's thread to %s: %w", dir, err)
	}
	return nil
}

// remove deletes the cgroups once their tasks are gone; the reaper is told
// of each one removed (one that is not stays the reaper's).
func (cg *cgroups) remove() error {
	return cg.g.Remove(func(d string) { cg.reaper.Done(d) })
}

// oomKills reads the memory cgroup's count of OOM kills (memory.events
// on cgroup v2, memory.oom_control on v1).
func (cg *cgroups) oomKills() (uint64, bool) {
	if cg == nil {
		return 0, false
	}
	return cg.g.OOMKills()
}
