// Package policy defines moat's policy file: its types, strict YAML
// loading, validation with key paths in every error, and safe defaults.
//
// # Loading
//
// Load and Parse decode YAML by walking the go.yaml.in/yaml/v3 node tree
// against the schema below, so that every problem is reported with its key
// path and line (e.g. `line 7: filesystem.read_write[1]: path "../x"
// escapes the policy's directory /srv/agent`). All problems are collected and
// returned together in an *Error. Refused: unknown keys, duplicate keys,
// wrong types (a string where a number is wanted, and the reverse), null
// values, anchors and aliases, more than one YAML document, an empty file
// (or one of comments only), a missing version or one other than 1, impossible values (uid 0, negative limits, bad sizes), relative
// paths that leave the policy's directory, grants that do not exist or hold
// a Unix socket, an audit directory inside (or containing) a grant, and
// provider mistakes (unknown api, duplicate names, no models, a base_url that
// is not https or loopback http, a bad credential_env), and tool server
// mistakes (tools.go: names outside [a-z0-9-] or whose MOAT_MCP_<NAME>_URL
// collide, command and url together, a non-loopback url, an implicit
// allowlist, grants that do not exist or overlap the audit directory), and
// egress mistakes (egress.go: hosts that are not IDNA ASCII names, "*."
// wildcards over fewer than two labels, numeric names in odd forms,
// duplicate grants, services that are not https, bad auth, path globs
// with dot segments, escapes or a '*' not at the end).
//
// # Defaults
//
// Every field that is absent takes a safe default (see Default and the
// field comments): no grants, no providers, no model requests, uid/gid 1000
// inside, Landlock ABI floor 6, a 64Mi /tmp, 512Mi memory, 256 pids, 1024
// open files. Relative paths resolve against the directory of the policy
// file; the audit directory defaults to .moat/runs under the current
// directory.
//
// # Identity
//
// SHA256 is the hex sha256 of the RFC 8785 canonical JSON of the effective
// policy (as JSON prints it, less its "derived" member); it is what run
// records cite.
//
// # Derived values
//
// What moat decides from the host when the run starts is printed with the
// effective policy but is not part of it: the host uid and gid of the
// workload as root when process.host_uid/host_gid are not set (HostIDsAsRoot),
// as comments in YAML and as "derived" in JSON.
package policy

import "time"

// Policy is a loaded, validated policy. After Load every path is absolute
// and cleaned, and every field holds its effective value.
type Policy struct {
	Version    int        `yaml:"version" json:"version"`
	Backend    string     `yaml:"backend" json:"backend"`
	Landlock   Landlock   `yaml:"landlock" json:"landlock"`
	Filesystem Filesystem `yaml:"filesystem" json:"filesystem"`
	Process    Process    `yaml:"process" json:"process"`
	Inference  Inference  `yaml:"inference" json:"inference"`
	Audit      Audit      `yaml:"audit" json:"audit"`
	// Tools are the tool servers the workload may reach through the
	// broker (tools.go). Absent: none.
	Tools Tools `yaml:"tools,omitempty" json:"tools,omitzero"`
	// Egress are the hosts and services the workload may reach through
	// the broker (egress.go). Absent: none.
	Egress Egress `yaml:"egress,omitempty" json:"egress,omitzero"`
	// Approvals hold matching requests for an operator's decision
	// (approvals.go). Absent: none are held.
	Approvals Approvals `yaml:"approvals,omitempty" json:"approvals,omitzero"`
	// Kubernetes configures the kubernetes backend (kubernetes.go).
	// Absent: the zero value, which only that backend refuses.
	Kubernetes Kubernetes `yaml:"kubernetes,omitempty" json:"kubernetes,omitzero"`

	// Source is the absolute path of the file the policy was loaded from
	// ("" for the built-in default). Not part of the YAML.
	Source string `yaml:"-" json:"-"`
}

// Landlock configures the native backend's Landlock ruleset.
type Landlock struct {
	// ABIFloor is the lowest Landlock ABI moat accepts; below it moat
	// refuses to start. Default 6.
	ABIFloor int `yaml:"abi_floor" json:"abi_floor"`
}

// Filesystem lists the host paths the sandbox may see.
type Filesystem struct {
	// ReadOnly and ReadWrite are host paths, mounted at the same path
	// inside. Each must exist, must not be /, /proc, /sys or /dev (or lie
	// under them), and must not be or hold a Unix socket.
	ReadOnly  []string `yaml:"read_only" json:"read_only"`
	ReadWrite []string `yaml:"read_write" json:"read_write"`
	// TmpSize is the size of the private tmpfs at /tmp, in bytes.
	TmpSize Size `yaml:"tmp_size" json:"tmp_size"`
	// Volumes are size-capped read-write file systems: each is an ext4
	// image file on the host that moat creates if missing and mounts at
	// Path inside the sandbox. The workload's disk use there cannot exceed
	// Size. Native backend as root only (they need a loop device).
	Volumes []Volume `yaml:"volumes,omitempty" json:"volumes,omitempty"`
}

// Volume is one image-backed, size-capped read-write mount.
type Volume struct {
	Image string `yaml:"image" json:"image"` // host path of the image file (absolute after loading)
	Path  string `yaml:"path" json:"path"`   // where it is mounted inside the sandbox
	Size  Size   `yaml:"size" json:"size"`
}

// Process configures the workload's identity, environment and limits.
type Process struct {
	UID int `yaml:"uid" json:"uid"`
	GID int `yaml:"gid" json:"gid"`
	// HostUID and HostGID are the host ids the workload runs as when moat
	// runs as root. 0 means "decide at run time" (see ResolveHostIDs);
	// an explicit 0 in a file is refused.
	HostUID int `yaml:"host_uid,omitempty" json:"host_uid"`
	HostGID int `yaml:"host_gid,omitempty" json:"host_gid"`
	// Env is the workload's whole environment (plus moat's own broker
	// variables). Absent: PATH=/usr/local/bin:/usr/bin:/bin and HOME=/tmp.
	// Present: exactly what is written ({} for none).
	Env map[string]string `yaml:"env" json:"env"`
	// Workdir is the working directory: /tmp or a directory inside a
	// grant. Default: the first read_write grant, else /tmp.
	Workdir string `yaml:"workdir" json:"workdir"`
	Limits  Limits `yaml:"limits" json:"limits"`
	// SupervisorTimeout is how long the sandbox's init waits for a
	// heartbeat of its supervisor (moat) before it kills the workload: a
	// supervisor that is stopped (SIGSTOP) or hung no longer watches the
	// workload, so the workload does not outlive it by more than this.
	// Default 10s.
	SupervisorTimeout Duration `yaml:"supervisor_timeout" json:"supervisor_timeout"`
}

// ExplainSupervisorTimeout says what process.supervisor_timeout does, in
// one line (moat policy check prints it).
func (p Process) ExplainSupervisorTimeout() string {
	return "process.supervisor_timeout " + Duration(p.SupervisorWait()).String() +
		": the sandbox's init kills the workload when moat, its supervisor, sends no heartbeat for this long (moat stopped or hung); moat's death ends it at once"
}

// SupervisorWait is SupervisorTimeout, or the default when unset.
func (p Process) SupervisorWait() time.Duration {
	if p.SupervisorTimeout <= 0 {
		return time.Duration(DefaultSupervisorTimeout)
	}
	return time.Duration(p.SupervisorTimeout)
}

// Limits are resource limits for the whole sandbox.
type Limits struct {
	Memory    Size `yaml:"memory" json:"memory"`
	Pids      int  `yaml:"pids" json:"pids"`
	OpenFiles int  `yaml:"open_files" json:"open_files"`
	// Required makes every limit strict, the defaults too: a run whose
	// memory or pids limit cannot be enforced on this host is refused. A
	// limit set to anything but its default is strict whatever Required
	// says (the policy asked for it); a default one that cannot be
	// enforced is reported (a warning at start, run info, the journal).
	// (Strictness follows the value, not whether the file spelled it out,
	// so that the printed effective policy means the same when read back.)
	Required bool `yaml:"required" json:"required"`
}

// StrictMemory and StrictPids report whether the limit must be enforced
// or the run refused.
func (l Limits) StrictMemory() bool { return l.Required || (l.Memory > 0 && l.Memory != DefaultMemory) }

// StrictPids: see StrictMemory.
func (l Limits) StrictPids() bool { return l.Required || (l.Pids > 0 && l.Pids != DefaultPids) }

// Inference configures the broker.
type Inference struct {
	MaxRequests        int  `yaml:"max_requests" json:"max_requests"`
	RequireAttribution bool `yaml:"require_attribution" json:"require_attribution"`
	MaxOutputTokens    int  `yaml:"max_output_tokens" json:"max_output_tokens"`
	// MaxRefusals is how many requests the broker may refuse in one run;
	// the refusal past it ends the run (reason refusal_limit), so that a
	// workload cannot fill the journal with refusals. Default 64.
	MaxRefusals int        `yaml:"max_refusals" json:"max_refusals"`
	Providers   []Provider `yaml:"providers" json:"providers"`
}

// Provider is one upstream model API.
type Provider struct {
	Name          string   `yaml:"name" json:"name"`
	API           string   `yaml:"api" json:"api"` // anthropic-messages | openai-chat | openai-responses
	BaseURL       string   `yaml:"base_url" json:"base_url"`
	CredentialEnv string   `yaml:"credential_env" json:"credential_env"`
	Models        []string `yaml:"models" json:"models"`
	CAFile        string   `yaml:"ca_file,omitempty" json:"ca_file,omitempty"`
}

// Audit configures where journals go.
type Audit struct {
	// Dir holds one directory per run. It must not be, lie inside or
	// contain any grant. Default: .moat/runs under the current directory.
	Dir string `yaml:"dir" json:"dir"`
	// MaxBytes caps the journal bytes the broker writes in one run; the
	// record that reaches it ends the run (reason journal_limit).
	// Default 64Mi, at least 1Mi.
	MaxBytes Size `yaml:"max_bytes" json:"max_bytes"`
}

// Size is a byte count written as an integer or with a binary suffix
// (Ki, Mi, Gi).
type Size int64
