package hostinfo

// CgroupInfo says which cgroup version the host runs and whether this
// process can create a child cgroup with the memory and pids controllers,
// which is what enforcing process.limits needs.
type CgroupInfo struct {
	Version   int              `json:"version"`          // 1 or 2; 0 when unknown
	Hybrid    bool             `json:"hybrid,omitempty"` // v1 controllers beside a v2 hierarchy
	Memory    CgroupController `json:"memory"`
	Pids      CgroupController `json:"pids"`
	Delegated bool             `json:"delegated"`        // memory and pids limits can be enforced by this process
	Reason    string           `json:"reason,omitempty"` // when not delegated: why, and what to change
}

// CgroupController is one controller as seen from this process.
type CgroupController struct {
	Available bool   `json:"available"`        // the host has the controller mounted/enabled for our cgroup
	Dir       string `json:"dir,omitempty"`    // this process's cgroup directory for it
	Writable  bool   `json:"writable"`         // a child cgroup with this controller could be created
	Reason    string `json:"reason,omitempty"` // when not writable or not available
}
