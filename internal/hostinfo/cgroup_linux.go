package hostinfo

import (
	"strings"

	"github.com/moat-sandbox/moat/internal/cgroup"
)

// CgroupRoot is where the cgroup file systems are mounted.
const CgroupRoot = cgroup.DefaultRoot

// Cgroups measures cgroup support for this process the way the native
// backend uses it (internal/cgroup): it creates (and removes at once) a
// child cgroup where the memory and pids controllers apply, and reports
// what happened.
func Cgroups() CgroupInfo {
	var info CgroupInfo
	h, err := cgroup.ReadHost()
	if err != nil {
		info.Reason = err.Error()
		return info
	}
	if len(h.Mounts) == 0 {
		info.Reason = "no cgroup file system is mounted"
		return info
	}
	info.Version = 1
	if h.Unified() {
		info.Version = 2
	} else {
		info.Hybrid = h.Hybrid()
	}
	info.Root = h.Euid == 0
	places, why := cgroup.Probe(cgroup.OS{}, h)
	for _, c := range []struct {
		name string
		dst  *CgroupController
	}{{cgroup.Memory, &info.Memory}, {cgroup.Pids, &info.Pids}} {
		p := places[c.name]
		*c.dst = CgroupController{
			Available: cgroup.Available(cgroup.OS{}, h, c.name),
			Dir:       p.Parent,
			V2:        p.V2,
			Writable:  why[c.name] == "",
			Reason:    why[c.name],
		}
	}
	info.Delegated = info.Memory.Writable && info.Pids.Writable
	if !info.Delegated {
		var reasons []string
		if !info.Memory.Writable {
			reasons = append(reasons, "memory: "+info.Memory.Reason)
		}
		if !info.Pids.Writable {
			reasons = append(reasons, "pids: "+info.Pids.Reason)
		}
		info.Reason = strings.Join(reasons, "; ")
	}
	return info
}
