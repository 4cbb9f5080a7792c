package gvisor

import (
	"fmt"
	"path/filepath"
	"runtime"
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
	Seccomp     *ociSeccomp    `json:"seccomp,omitempty"`
}

type ociNamespace struct {
	Type string `json:"type"`
}

type ociSeccomp struct {
	DefaultAction string           `json:"defaultAction"`
	Architectures []string         `json:"architectures"`
	Syscalls      []ociSeccompRule `json:"syscalls"`
}

type ociSeccompRule struct {
	Names    []string        `json:"names"`
	Action   string          `json:"action"`
	ErrnoRet *uint           `json:"errnoRet,omitempty"`
	Args     []ociSeccompArg `json:"args,omitempty"`
}

type ociSeccompArg struct {
	Index    uint   `json:"index"`
	Value    uint64 `json:"value"`
	ValueTwo uint64 `json:"valueTwo,omitempty"`
	Op       string `json:"op"`
}

// moatInside is where the moat binary is bound, read-only, inside the
// sandbox: the container's pause process and moat's measurement run from it.
const moatInside = "/.moat/moat"

// seccompDenied are refused with EPERM inside the sentry. runsc implements
// seccomp itself (SECCOMP_SET_MODE_FILTER only); this filter is the
// in-sentry second wall next to the sentry's own syscall surface.
var seccompDenied = []string{
	"unshare", "setns", "mount", "umount2", "pivot_root", "chroot",
	"ptrace", "process_vm_readv", "process_vm_writev",
	"keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd",
	"io_uring_setup", "io_uring_enter", "io_uring_register",
	"open_by_handle_at", "name_to_handle_at", "kexec_load", "kexec_file_load",
	"init_module", "finit_module", "delete_module",
}

// seccompRules: EPERM for seccompDenied; EPERM for clone with any
// namespace flag (one rule per flag: rules on one syscall are alternatives);
// EPERM for socket
// families moat does not allow (packet, vsock, alg, bluetooth, key) and for
// MPTCP. AF_UNIX stays allowed: gVisor does not connect to host-backed
// Unix sockets in bind mounts unless started with --host-uds.
func seccompRules() []ociSeccompRule {
	// clone3 needs no rule: this runsc's sentry does not implement it
	// (ENOSYS), and runsc ignores errnoRet (a clone3 rule would return
	// EPERM, and glibc falls back to clone only on ENOSYS).
	eperm := uint(1)
	rules := []ociSeccompRule{
		{Names: seccompDenied, Action: "SCMP_ACT_ERRNO", ErrnoRet: &eperm},
	}
	for _, f := range []uint64{
		0x10000000, // CLONE_NEWUSER
		0x00020000, // CLONE_NEWNS
		0x20000000, // CLONE_NEWPID
		0x40000000, // CLONE_NEWNET
		0x08000000, // CLONE_NEWIPC
		0x04000000, // CLONE_NEWUTS
		0x02000000, // CLONE_NEWCGROUP
	} {
		rules = append(rules, ociSeccompRule{Names: []string{"clone"}, Action: "SCMP_ACT_ERRNO", ErrnoRet: &eperm,
			Args: []ociSeccompArg{{Index: 0, Value: f, ValueTwo: f, Op: "SCMP_CMP_MASKED_EQ"}}})
	}
	// No set-id bit in any mode the workload sets: the file would keep it
	// on the host (gVisor's gofer creates and chmods host files), where a
	// host user could run it as the workspace's owner. One rule per bit
	// and syscall (rules on one syscall are alternatives).
	for _, sc := range modeSyscalls() {
		for _, bit := range []uint64{0o4000, 0o2000} {
			rules = append(rules, ociSeccompRule{Names: []string{sc.name}, Action: "SCMP_ACT_ERRNO", ErrnoRet: &eperm,
				Args: []ociSeccompArg{{Index: sc.arg, Value: bit, ValueTwo: bit, Op: "SCMP_CMP_MASKED_EQ"}}})
		}
	}
	// mknod makes regular files only: a FIFO is a channel through a
	// shared directory, devices are never needed. (No rule for datagram
	// socketpairs: this runsc ignores a rule on two arguments, checked by
	// attack, and the sentry reaches no host Unix socket anyway, which the
	// measurement checks with a host datagram socket in each grant.)
	for _, sc := range modeSyscalls() {
		if sc.name != "mknod" && sc.name != "mknodat" {
			continue
		}
		for _, typ := range []uint64{0o010000 /* FIFO */, 0o140000 /* SOCK */, 0o020000 /* CHR */, 0o060000 /* BLK */} {
			rules = append(rules, ociSeccompRule{Names: []string{sc.name}, Action: "SCMP_ACT_ERRNO", ErrnoRet: &eperm,
				Args: []ociSeccompArg{{Index: sc.arg, Value: 0o170000, ValueTwo: typ, Op: "SCMP_CMP_MASKED_EQ"}}})
		}
	}
	for _, fam := range []uint64{
		15, // AF_KEY
		17, // AF_PACKET
		31, // AF_BLUETOOTH
		38, // AF_ALG
		40, // AF_VSOCK
	} {
		rules = append(rules, ociSeccompRule{Names: []string{"socket"}, Action: "SCMP_ACT_ERRNO", ErrnoRet: &eperm,
			Args: []ociSeccompArg{{Index: 0, Value: fam, Op: "SCMP_CMP_EQ"}}})
	}
	rules = append(rules, ociSeccompRule{Names: []string{"socket"}, Action: "SCMP_ACT_ERRNO", ErrnoRet: &eperm,
		Args: []ociSeccompArg{{Index: 2, Value: 262 /* IPPROTO_MPTCP */, Op: "SCMP_CMP_EQ"}}})
	return rules
}

type modeArg struct {
	name string
	arg  uint
}

// modeSyscalls are the syscalls that take a file mode, with its argument
// index. fchmodat2 and openat2 are left out: this runsc's sentry does not
// implement them (ENOSYS) and would not know their names.
func modeSyscalls() []modeArg {
	out := []modeArg{{"fchmod", 1}, {"fchmodat", 2}, {"openat", 3}, {"mkdirat", 2}, {"mknodat", 2}}
	if runtime.GOARCH == "amd64" {
		out = append(out, modeArg{"chmod", 1}, modeArg{"open", 2}, modeArg{"creat", 1}, modeArg{"mkdir", 1}, modeArg{"mknod", 1})
	}
	return out
}

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

// stagedGrant is where the init attaches the i-th grant's tree.
func stagedGrant(dir string, i int) string { return filepath.Join(dir, strconv.Itoa(i)) }

// buildSpec writes the bundle's config.json contents.
// cgroupsPath is where runsc makes the container's cgroup in each
// hierarchy (see cgroupDirs).
func buildSpec(pol *policy.Policy, uid, gid int, plan *grants.Plan, rootfs, grantsDir, moatExe, cgroupsPath string) (*ociSpec, error) {
	s := &ociSpec{
		OCIVersion: "1.0.2",
		Process:    process(pol, uid, gid, []string{moatInside, PauseHelper}, nil, "/"),
		Root:       ociRoot{Path: rootfs, Readonly: true},
		Hostname:   "moat",
		Linux: ociLinux{
			CgroupsPath: cgroupsPath,
			// No "network" entry: runsc --network=host uses the network
			// namespace it runs in, which moat made with loopback only.
			Namespaces: []ociNamespace{{"pid"}, {"ipc"}, {"uts"}, {"mount"}},
			Seccomp: &ociSeccomp{
				DefaultAction: "SCMP_ACT_ALLOW",
				Architectures: []string{"SCMP_ARCH_X86_64", "SCMP_ARCH_AARCH64"},
				Syscalls:      seccompRules(),
			},
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
