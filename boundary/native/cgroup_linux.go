package native

import (
	"bufio"
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
