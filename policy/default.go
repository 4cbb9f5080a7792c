package policy

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// Default values and limits. Every default is safe: it grants nothing that
// the workload needs a policy to get.
const (
	DefaultVersion              = 1
	DefaultBackend              = "native"
	DefaultABIFloor             = 6
	DefaultTmpSize         Size = 64 << 20
	DefaultID                   = 1000 // uid and gid inside the sandbox
	DefaultMemory          Size = 512 << 20
	DefaultPids                 = 256
	DefaultOpenFiles            = 1024
	DefaultMaxRequests          = 32
	DefaultMaxOutputTokens      = 8192
	DefaultMaxRefusals          = 64
	DefaultAuditDir             = ".moat/runs" // under the current directory
	DefaultAuditMaxBytes   Size = 64 << 20
	DefaultPATH                 = "/usr/local/bin:/usr/bin:/bin"
	DefaultHOME                 = "/tmp" // the private tmpfs: writable, empty, gone after the run

	// NobodyID is the host uid/gid a workload gets when moat runs as root
	// and the workspace is root's (or there is none).
	NobodyID = 65534

	MinABIFloor = 1
	MaxABIFloor = 64 // far above any released ABI; a floor above the host's is refused at run time

	MaxID                     = 1<<31 - 2
	MinTmpSize           Size = 1 << 20
	MinMemory            Size = 8 << 20
	MinPids                   = 4
	MaxPids                   = 1 << 22 // the kernel's pid_max ceiling
	MinOpenFiles              = 16
	MaxOpenFiles              = 1 << 20 // the kernel's default nr_open
	MaxRequestsLimit          = 1 << 20
	MaxOutputTokensLimit      = 1 << 20
	MaxRefusalsLimit          = 1 << 20
	MinAuditMaxBytes     Size = 1 << 20

	MaxGrants        = 128 // per list
	MaxVolumes       = 8
	MinVolumeSize    = Size(16 << 20) // ext4 with its journal needs a few MiB
	MaxProviders     = 32
	MaxModels        = 256 // per provider
	MaxEnv           = 256
	MaxEnvValueBytes = 32 << 10
)

// The supervisor heartbeat's timeout (process.supervisor_timeout): at
// least a second (the supervisor beats four times per timeout; shorter
// would end healthy sandboxes on a loaded host), at most an hour.
const (
	DefaultSupervisorTimeout = Duration(10 * time.Second)
	MinSupervisorTimeout     = Duration(time.Second)
	MaxSupervisorTimeout     = Duration(time.Hour)
)

// Backends and APIs that a policy may name.
var (
	Backends = []string{"native", "gvisor", "kubernetes"}
	APIs     = []string{"anthropic-messages", "openai-chat", "openai-responses"}
)

func isBackend(s string) bool { return slices.Contains(Backends, s) }
func isAPI(s string) bool     { return slices.Contains(APIs, s) }

// defaults is the policy every file starts from before its keys apply.
// Paths that depend on the file (workdir, audit dir) are filled in by
// validate.
func defaults() *Policy {
	return &Policy{
		Version:  DefaultVersion,
		Backend:  DefaultBackend,
		Landlock: Landlock{ABIFloor: DefaultABIFloor},
		Filesystem: Filesystem{
			ReadOnly:  []string{},
			ReadWrite: []string{},
			TmpSize:   DefaultTmpSize,
		},
		Process: Process{
			UID:               DefaultID,
			GID:               DefaultID,
			Env:               map[string]string{"PATH": DefaultPATH, "HOME": DefaultHOME},
			SupervisorTimeout: DefaultSupervisorTimeout,
			Limits: Limits{
				Memory:    DefaultMemory,
				Pids:      DefaultPids,
				OpenFiles: DefaultOpenFiles,
			},
		},
		Inference: Inference{
			MaxRequests:     DefaultMaxRequests,
			MaxOutputTokens: DefaultMaxOutputTokens,
			MaxRefusals:     DefaultMaxRefusals,
			Providers:       []Provider{},
		},
		Audit: Audit{MaxBytes: DefaultAuditMaxBytes},
	}
}

// DefaultReadOnly are the system directories the built-in default policy
// grants read-only (those that exist on this host).
var DefaultReadOnly = []string{"/usr", "/bin", "/lib", "/lib64"}

// Default returns the built-in policy that moat run and moat demo use
// without --policy. It grants:
//   - read-only: /usr, /bin, /lib and /lib64, those of them that exist here,
//     so that sh, id, grep and other system tools run;
//   - read-write: nothing of the host. The workspace is the private tmpfs
//     at /tmp (64Mi), which is also the working directory and HOME, and is
//     gone after the run;
//   - env: PATH=/usr/local/bin:/usr/bin:/bin and HOME=/tmp, nothing else;
//   - uid/gid 1000 inside; as root, host uid/gid 65534 (see ResolveHostIDs);
//   - no model providers, so every inference request is refused;
//   - limits: 512Mi memory, 256 pids, 1024 open files, Landlock ABI 6 or
//     newer required.
//
// Journals go to .moat/runs under the current directory.
func Default() *Policy {
	p := defaults()
	for _, d := range DefaultReadOnly {
		if _, err := os.Stat(d); err == nil {
			p.Filesystem.ReadOnly = append(p.Filesystem.ReadOnly, d)
		}
	}
	p.Process.Workdir = "/tmp"
	p.Audit.Dir = defaultAuditDir()
	return p
}

func defaultAuditDir() string {
	if abs, err := filepath.Abs(DefaultAuditDir); err == nil {
		return abs
	}
	return DefaultAuditDir
}

// ResolveHostIDs returns the host uid and gid the workload runs as, given
// moat's effective uid.
//
// Unprivileged (euid != 0) the workload is the caller: euid and the
// effective gid, and host_uid/host_gid are ignored. As root, the workload is
// never host uid 0: it is host_uid when set; otherwise the owner of the
// workspace (the first read_write grant) when that owner is not root;
// otherwise NobodyID (65534). host_gid follows the same rule with the
// workspace's group.
func (p *Policy) ResolveHostIDs(euid int) (uid, gid int, err error) {
	if euid != 0 {
		return euid, os.Getegid(), nil
	}
	uid, gid = p.Process.HostUID, p.Process.HostGID
	if uid < 0 || gid < 0 {
		return 0, 0, fmt.Errorf("policy: BUG: negative host id %d/%d", uid, gid)
	}
	wsUID, wsGID := NobodyID, NobodyID
	if (uid == 0 || gid == 0) && len(p.Filesystem.ReadWrite) > 0 {
		ws := p.Filesystem.ReadWrite[0]
		ou, og, err := owner(ws)
		if err != nil {
			return 0, 0, fmt.Errorf("policy: host ids from the workspace owner: %w", err)
		}
		if ou != 0 {
			wsUID = ou
		}
		if og != 0 {
			wsGID = og
		}
	}
	if uid == 0 {
		uid = wsUID
	}
	if gid == 0 {
		gid = wsGID
	}
	if uid == 0 || gid == 0 {
		return 0, 0, fmt.Errorf("policy: BUG: resolved host id is root")
	}
	return uid, gid, nil
}

// HostIDs are the host uid and gid a workload runs as when moat runs as
// root (see ResolveHostIDs), with how each was decided. Rootless, the
// workload runs as the caller instead, whatever the policy says.
type HostIDs struct {
	UID int `json:"host_uid"`
	GID int `json:"host_gid"`
	// UIDFrom and GIDFrom say where each came from: "set in the policy",
	// the workspace owner, or nobody and why.
	UIDFrom string `json:"host_uid_from"`
	GIDFrom string `json:"host_gid_from"`
	// Err is why they could not be decided (the workspace's owner could
	// not be read); UID and GID are then 0.
	Err string `json:"error,omitempty"`
}

// HostIDsAsRoot decides the host ids as ResolveHostIDs(0) does and says
// how, for printing the effective policy.
func (p *Policy) HostIDsAsRoot() HostIDs {
	var h HostIDs
	uid, gid, err := p.ResolveHostIDs(0)
	if err != nil {
		h.Err = err.Error()
		return h
	}
	h.UID, h.GID = uid, gid
	ou, og := -1, -1
	if len(p.Filesystem.ReadWrite) > 0 {
		ou, og, _ = owner(p.Filesystem.ReadWrite[0]) // ResolveHostIDs read it just now
	}
	from := func(set bool, wsOwner int) string {
		switch {
		case set:
			return "set in the policy"
		case len(p.Filesystem.ReadWrite) == 0:
			return "no read_write grant, so nobody"
		case wsOwner == 0:
			return "the workspace " + p.Filesystem.ReadWrite[0] + " is root's, so nobody"
		}
		return "the owner of the workspace " + p.Filesystem.ReadWrite[0]
	}
	h.UIDFrom = from(p.Process.HostUID != 0, ou)
	h.GIDFrom = from(p.Process.HostGID != 0, og)
	return h
}
