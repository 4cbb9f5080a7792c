package hostinfo

// CgroupInfo says which cgroup version the host runs and whether this
// process can create a child cgroup with the memory and pids controllers,
// which is what enforcing process.limits needs.
type CgroupInfo struct {
	Version   int              `json:"version"`          // 1 or 2 (the file system at /sys/fs/cgroup); 0 when unknown
	Hybrid    bool             `json:"hybrid,omitempty"` // v1 controllers beside a v2 hierarchy
	Root      bool             `json:"root"`             // measured as root
	Memory    CgroupController `json:"memory"`
	Pids      CgroupController `json:"pids"`
	Delegated bool             `json:"delegated"`        // memory and pids limits can be enforced by this process
	Reason    string           `json:"reason,omitempty"` // when not delegated: why
}

// CgroupController is one controller as seen from this process.
type CgroupController struct {
	Available bool   `json:"available"`        // the host has the controller (a v1 hierarchy, or the v2 root lists it)
	Dir       string `json:"dir,omitempty"`    // where moat makes the sandbox's cgroup for it
	V2        bool   `json:"v2,omitempty"`     // it is used through cgroup v2
	Writable  bool   `json:"writable"`         // a child cgroup with this controller could be created
	Reason    string `json:"reason,omitempty"` // when not writable
}

// Fix is what to change so that moat can enforce memory and pids limits
// here; it names only what moat implements: root on cgroup v1 and v2, and
// a delegated cgroup v2 subtree unprivileged (advised only where the
// controllers are on cgroup v2).
func (c CgroupInfo) Fix() string {
	if c.Delegated {
		return ""
	}
	var v1, v2, missing bool
	for _, ctl := range []CgroupController{c.Memory, c.Pids} {
		switch {
		case ctl.Writable:
		case !ctl.Available:
			missing = true
		case ctl.V2:
			v2 = true
		default:
			v1 = true
		}
	}
	switch {
	case missing:
		return "enable the memory and pids controllers in the kernel and the init system (a cgroup v1 hierarchy each, or listed in the cgroup v2 root's cgroup.controllers); until then a limit written in the policy is refused, and the default limits are reported as not enforced"
	case !c.Root && v2 && !v1:
		return "run moat in a cgroup v2 subtree delegated to you, e.g. systemd-run --user --scope -p Delegate=yes moat run ... (or run moat as root); until then a limit written in the policy is refused, and the default limits are reported as not enforced"
	case !c.Root:
		return "run moat as root: on cgroup v1 moat enforces memory and pids limits as root only; until then a limit written in the policy is refused, and the default limits are reported as not enforced"
	}
	return "see the reason above; a limit written in the policy is refused, and the default limits are reported as not enforced"
}
