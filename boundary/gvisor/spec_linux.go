package gvisor

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/moat-sandbox/moat/internal/grants"
	"github.com/moat-sandbox/moat/policy"
)

// The subset of the OCI runtime spec that moat writes. Field names follow
// the spec (opencontainers/runtime-spec, config.md).
type ociSpec struct {
	OCIVersion string     `json:"ociVersion"`
	Process    ociProcess `json:"process"`
	Root       ociRoot    `json:"root"`
	Hostname   string     `json:"hostname"`
	Mounts     []ociMount `json:"mounts"`
	Linux      ociLinux   `json:"linux"`
}

type ociProcess struct {
	Terminal        bool        `json:"terminal"`
	User            ociUser     `json:"user"`
	Args            []string    `json:"args"`
	Env             []string    `json:"env"`
	Cwd             string      `json:"cwd"`
	Capabilities    ociCaps     `json:"capabilities"`
	Rlimits         []ociRlimit `json:"rlimits,omitempty"`
	NoNewPrivileges bool        `json:"noNewPrivileges"`
}

type ociUser struct {
	UID int `json:"uid"`
	GID int `json:"gid"`
}

// ociCaps: every set empty. Non-nil slices, so that the JSON says [] and
// runsc does not apply its defaults.
type ociCaps struct {
	Bounding    []string `json:"bounding"`
	Effective   []string `json:"effective"`
	Inheritable []string `json:"inheritable"`
	Permitted   []string `json:"permitted"`
	Ambient     []string `json:"ambient"`
}

func noCaps() ociCaps {
	e := []string{}
	return ociCaps{e, e, e, e, e}
}

type ociRlimit struct {
	Type string `json:"type"`
	Hard uint64 `json:"hard"`
	Soft uint64 `json:"soft"`
}

type ociRoot struct {
	Path     string `json:"path"`
	Readonly bool   `json:"readonly"`
}

type ociMount struct {
	Destination string   `json:"destination"`
	Type        string   `json:"type"`
	Source      string   `json:"source"`
	Options     []string `json:"options,omitempty"`
}

type ociLinux struct {
	CgroupsPath string         `json:"cgroupsPath,omitempty"`
	Namespaces  []ociNamespace `json:"namespaces"`
	// No "seccomp": runsc applies a spec's filter to the container's
	// init only (the pause process, moat's own code), never to what
	// `runsc exec` starts. The stage (StageMain) installs package
	// seccomp's filter, the one filter both backends use, on the
	// container's init, which runs the pause on that thread and forks
	// every process from it, and in front of every `runsc exec`.
}

type ociNamespace struct {
	Type string `json:"type"`
}

// moatInside is where the moat binary is bound, read-only, inside the
// sandbox: the container's pause process and moat's measurement run from it.
const moatInside = "/.moat/moat"

// process is an OCI process as uid:gid (see hostIDs), with no capability.
func process(pol *policy.Policy, uid, gid int, args, env []string, cwd string) ociProcess {
	p := ociProcess{
		User:            ociUser{UID: uid, GID: gid},
		Args:            args,
		Env:             env,
		Cwd:             cwd,
		Capabilities:    noCaps(),
		NoNewPrivileges: true,
	}
	if n := pol.Process.Limits.OpenFiles; n > 0 {
		p.Rlimits = append(p.Rlimits, ociRlimit{Type: "RLIMIT_NOFILE", Hard: uint64(n), Soft: uint64(n)})
	}
	p.Rlimits = append(p.Rlimits, ociRlimit{Type: "RLIMIT_CORE", Hard: 0, Soft: 0})
	if p.Cwd == "" {
		p.Cwd = "/"
	}
	if p.Env == nil {
		p.Env = []string{}
	}
	return p
}

// pauseArgs is the container's own process after the stage's prefix:
// the pause (PauseMain), which the stage runs in its own process.
var pauseArgs = []string{moatInside, PauseHelper}

// stagedGrant is where the init attaches the i-th grant's tree.
func stagedGrant(dir string, i int) string { return filepath.Join(dir, strconv.Itoa(i)) }

// buildSpec writes the bundle's config.json contents.
// cgroupsPath is where runsc makes the container's cgroup in each
// hierarchy (see cgroupDirs).
func buildSpec(pol *policy.Policy, uid, gid int, plan *grants.Plan, rootfs, grantsDir, moatExe, cgroupsPath string) (*ociSpec, error) {
	s := &ociSpec{
		OCIVersion: "1.0.2",
		// The stage installs the filter and runs the pause on that thread.
		Process:  process(pol, uid, gid, append(slices.Clone(stagePrefix), pauseArgs...), nil, "/"),
		Root:     ociRoot{Path: rootfs, Readonly: true},
		Hostname: "moat",
		Linux: ociLinux{
			CgroupsPath: cgroupsPath,
			// No "network" entry: runsc --network=host uses the network
			// namespace it runs in, which moat made with loopback only.
			Namespaces: []ociNamespace{{"pid"}, {"ipc"}, {"uts"}, {"mount"}},
		},
	}
	tmpOpts := []string{"nosuid", "nodev", "mode=1777"}
	if sz := int64(pol.Filesystem.TmpSize); sz > 0 {
		tmpOpts = append(tmpOpts, fmt.Sprintf("size=%d", sz))
	}
	s.Mounts = []ociMount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: tmpOpts},
		{Destination: moatInside, Type: "bind", Source: moatExe, Options: []string{"bind", "ro", "nosuid", "nodev"}},
	}
	// Each grant is bound from the staging point where the init attached
	// the tree it opened and checked (package grants): runsc never looks
	// a grant path up on the host.
	for i, m := range plan.Mounts {
		opts := []string{"rbind", "nosuid", "nodev"}
		if m.Write {
			opts = append(opts, "rw")
		} else {
			opts = append(opts, "ro")
		}
		s.Mounts = append(s.Mounts, ociMount{Destination: m.Real, Type: "bind", Source: stagedGrant(grantsDir, i), Options: opts})
	}
	return s, nil
}
