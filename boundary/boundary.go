// Package boundary is the contract between moat and a sandbox backend.
//
// A backend (native namespaces+Landlock+seccomp, gVisor, …) prepares a
// sandbox, lets moat run the shared measurement inside it, then starts the
// workload. Readiness is decided here, from measured properties only: a
// backend's Mechanism strings are recorded for audit and never authorize.
package boundary

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/moat-sandbox/moat/confirmation"
	"github.com/moat-sandbox/moat/internal/reaper"
	"github.com/moat-sandbox/moat/policy"
)

// The measured values of a confirmation live in the leaf package
// confirmation, which the journal format shares without linking this
// contract; these aliases keep their names here.
type (
	EnforcedProperty = confirmation.EnforcedProperty
	Properties       = confirmation.Properties
	NamedProperty    = confirmation.NamedProperty
	LimitsStatus     = confirmation.LimitsStatus
	Attribution      = confirmation.Attribution
	// AttributionStatus is Attribution's Status; its zero value is invalid.
	AttributionStatus = confirmation.AttributionStatus
)

// Attribution statuses.
const (
	AttributionResolved    = confirmation.AttributionResolved
	AttributionUnavailable = confirmation.AttributionUnavailable
)

// Requirements say which properties a run needs. Filesystem, egress and
// privilege are always required; attribution is required only when the
// policy says so (otherwise an unavailable attribution is recorded).
type Requirements struct {
	RequireAttribution bool
}

// NotReadyError names the property that kept a sandbox from Ready.
type NotReadyError struct {
	Property string
	Detail   string
}

func (e *NotReadyError) Error() string {
	if e.Detail == "" {
		return fmt.Sprintf("boundary not ready: property %s is not enforced", e.Property)
	}
	return fmt.Sprintf("boundary not ready: property %s is not enforced: %s", e.Property, e.Detail)
}

// Ready decides readiness from measured properties only. It returns nil when
// every required property is enforced, or a *NotReadyError naming the first
// one that is not. Mechanism strings play no part.
func Ready(p Properties, req Requirements) error {
	for _, np := range p.Named() {
		if np.Enforced && !np.Unavailable {
			continue
		}
		if np.Name == "request_attribution" && np.Unavailable && !req.RequireAttribution {
			continue
		}
		d := np.Detail
		if np.Unavailable {
			d = "declared unavailable by the backend (endpoint-only)"
			if np.Detail != "" {
				d += ": " + np.Detail
			}
		}
		return &NotReadyError{Property: np.Name, Detail: d}
	}
	return nil
}

// Phase is a sandbox's lifecycle phase. The zero value is invalid.
type Phase string

const (
	PhaseInvalid      Phase = ""
	PhaseProvisioning Phase = "Provisioning"
	PhaseConfirming   Phase = "Confirming"
	PhaseReady        Phase = "Ready"
	PhaseRunning      Phase = "Running"
	PhaseCompleted    Phase = "Completed"
	PhaseError        Phase = "Error"
	PhaseDeleting     Phase = "Deleting"
)

// Exit codes of moat and of what backends start, as docker run uses them:
// the only place they are defined (sandbox and the CLI name these).
const (
	ExitRefused    = 125 // moat refused or failed; StartError.Code otherwise
	ExitCannotExec = 126 // the command exists but cannot be executed
	ExitNotFound   = 127 // the command was not found
)

// ErrUnsupported is what a backend's error on a platform it cannot run on
// matches with errors.Is. It is errors.ErrUnsupported itself, moat's one
// "unsupported" sentinel (internal/hostinfo's and seccomp's errors match
// it too).
var ErrUnsupported = errors.ErrUnsupported

// Process describes one command to start inside a prepared sandbox.
type Process struct {
	Argv   []string
	Env    []string // full environment; nothing is inherited
	Dir    string   // working directory inside the sandbox
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	// TTY, when non-nil, is the terminal given to the process as stdio.
	TTY *os.File
	// Last says that nothing will be started in the sandbox after this
	// process (moat run's workload, a tool server): the backend need not
	// prepare for another start. Another Start still works, only slower.
	Last bool
}

// Sandbox is a prepared sandbox, owned by its supervisor. A backend never
// confirms itself: moat runs the shared measurement (boundary/measure)
// through StartHelper and decides readiness from what it observes.
type Sandbox interface {
	// Start starts a process under the sandbox's full confinement. It may
	// be called more than once (sandbox exec).
	Start(ctx context.Context, p Process) (Running, error)
	// StartHelper runs moat's own binary with args inside the sandbox,
	// under exactly the confinement that Start applies (used for the
	// measurement). Its stdout goes to p.Stdout.
	StartHelper(ctx context.Context, args []string, p Process) (Running, error)
	// Listener returns the broker's listener, created inside the sandbox's
	// network namespace, and its port there.
	Listener() (ListenerInfo, error)
	// Attributor resolves a broker connection to the process that made it.
	Attributor() Attributor
	// Mechanisms names what the backend says enforces each property. Free
	// text for audit; it never authorizes anything.
	Mechanisms() Mechanisms
	// HostPID is the host pid that an outside observer should watch (the
	// sandbox init; under gVisor the runsc sandbox process).
	HostPID() int
	// Limits reports which resource limits are really enforced.
	Limits() LimitsStatus
	// Terminate kills every process of the sandbox and releases mounts,
	// temporary directories and namespaces. It is idempotent.
	Terminate() error
}

// Mechanisms are a backend's declared mechanisms, per property.
type Mechanisms struct {
	FilesystemConfinement string
	EgressInterception    string
	RequestAttribution    string
	PrivilegeFloor        string
	// AttributionUnavailable, when non-empty, declares that the backend can
	// only attribute requests by endpoint, and why.
	AttributionUnavailable string
}

// OOMCounter is implemented by a sandbox that can count the kernel's
// out-of-memory kills inside it (the native backend's memory cgroup); ok
// is false when it cannot.
type OOMCounter interface {
	OOMKills() (n uint64, ok bool)
}

// Ending is implemented by a sandbox that can end from outside moat (the
// kubernetes backend's Pod, deleted, evicted or failed): Ended is closed
// when it has, and EndReason says how. The run then ends with
// audit.ReasonSandboxLost.
type Ending interface {
	Ended() <-chan struct{}
	EndReason() string
}

// ImageFiles is implemented by a sandbox whose files are not the host's
// files at the same paths (the kubernetes backend: the image's root and
// emptyDir volumes). When FilesFromImage is true the journal names a
// started process by its argv alone, never by a host file's digest.
type ImageFiles interface {
	FilesFromImage() bool
}

// DiskUnlimited is the DiskDetail of every backend today: a quota would
// need a workspace on a size-capped file system that moat mounts, which
// none does.
const DiskUnlimited = "workspace disk use is not limited: the workload can fill the file system that holds its read_write grants"

// Attributor resolves accepted broker connections to processes.
type Attributor interface {
	// Attribute looks up the process that owns the peer end of conn (a
	// connection accepted on the sandbox's broker listener).
	Attribute(conn net.Conn) Attribution
}

// EgressListening is implemented by a sandbox that can give the broker
// a second listener on its loopback, the egress port (CONNECT tunnels to
// the policy's egress.hosts). A backend makes it only when the policy
// has egress hosts (Spec.Policy); ok is false when there is none.
type EgressListening interface {
	EgressListener() (li ListenerInfo, ok bool, err error)
}

// ListenerInfo is the broker's listening socket inside the sandbox.
type ListenerInfo struct {
	File *os.File // a listening TCP socket, already bound and listening
	Port int
	// Host is the address at which the workload reaches the listener: ""
	// is 127.0.0.1, the sandbox's own loopback (native, gVisor). A backend
	// whose listener is outside the sandbox's network (Kubernetes: the
	// broker off the Pod, on a host address) names that address here.
	Host string
	// Admit, when not nil, is asked about each accepted connection's
	// remote address before anything is read from it: an error refuses
	// the connection (the caller closes it and journals the refusal). A
	// listener reachable only from inside the sandbox (a loopback in the
	// sandbox's own network namespace) needs none; one on a host address
	// must admit only the sandbox's own address.
	Admit func(remote net.Addr) error
}

// Running is a started process.
type Running interface {
	HostPID() int
	// Wait returns the process's exit code (128+signal when killed).
	Wait() (int, error)
	Signal(sig os.Signal) error
}

// Backend creates sandboxes.
type Backend interface {
	Name() string
	// Prepare builds a sandbox from a spec; nothing untrusted runs yet.
	Prepare(ctx context.Context, spec Spec) (Sandbox, error)
}

var (
	regMu    sync.Mutex
	registry = map[string]Backend{}
)

// Register adds a backend. Registering a name twice panics (a BUG).
func Register(b Backend) {
	regMu.Lock()
	defer regMu.Unlock()
	if _, dup := registry[b.Name()]; dup {
		panic("BUG: backend registered twice: " + b.Name())
	}
	registry[b.Name()] = b
}

// UnknownBackendError is returned by Lookup for a name that is not registered.
type UnknownBackendError struct {
	Name  string
	Known []string
}

func (e *UnknownBackendError) Error() string {
	return fmt.Sprintf("unknown backend %q (known: %s)", e.Name, strings.Join(e.Known, ", "))
}

// Lookup resolves a backend by name. It never falls back to another backend.
func Lookup(name string) (Backend, error) {
	regMu.Lock()
	defer regMu.Unlock()
	if b, ok := registry[name]; ok {
		return b, nil
	}
	return nil, &UnknownBackendError{Name: name, Known: namesLocked()}
}

// Names lists registered backends, sorted.
func Names() []string {
	regMu.Lock()
	defer regMu.Unlock()
	return namesLocked()
}

// namesLocked lists the registered backends in the policy's order
// (policy.Backends: the default first), then any others sorted, so that
// the list reads the same wherever moat prints it.
func namesLocked() []string {
	var n, rest []string
	for _, b := range policy.Backends {
		if _, ok := registry[b]; ok {
			n = append(n, b)
		}
	}
	for k := range registry {
		if !slices.Contains(policy.Backends, k) {
			rest = append(rest, k)
		}
	}
	sort.Strings(rest)
	return append(n, rest...)
}

// Spec is what a backend needs to prepare a sandbox. The policy has been
// loaded and validated; its paths are absolute.
//
// It carries the whole *policy.Policy, not a compiled spec of what the
// backends read (the grants, volumes, /tmp size, uid/gid and host ids,
// limits, Landlock floor), and so boundary links policy (deps_test.go
// allows it). Not yet compiled, because three of those are decided per
// backend from the policy at Prepare: the host ids
// (policy.ResolveHostIDs with the caller's euid on native, as root on
// gVisor, each with its own owner check), the grant plan (resolved by
// the backend at the moment the check-then-mount tests stop it, between
// planning and mounting) and the volumes (native only). A compiled spec
// must carry those decisions as values first; until then the backends
// read the policy, and nothing else of it than the fields named above.
type Spec struct {
	RunID  string
	Policy *policy.Policy
	// StateDir is a private 0700 directory outside every grant that the
	// backend may use for staging (bundles, mount points); the backend
	// removes what it creates there on Terminate.
	StateDir string
	// Reaper, when not nil, is told of everything else the backend makes
	// on the host (cgroups), and of its removal, so that it is removed
	// even when moat is killed. nil is valid and does nothing.
	Reaper *reaper.Reaper
}

// StartError is a process that could not be started. Code is 127 when the
// command was not found, 126 when it cannot be executed, 125 when moat
// could not confine it (it never ran unconfined).
type StartError struct {
	Code int
	Msg  string
}

func (e *StartError) Error() string { return e.Msg }
