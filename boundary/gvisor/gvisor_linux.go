package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/boundary/internal/initkit"
	"github.com/moat-sandbox/moat/internal/grants"
	"github.com/moat-sandbox/moat/internal/hostinfo"
	"github.com/moat-sandbox/moat/internal/reaper"
	"github.com/moat-sandbox/moat/policy"
)

// New returns the gvisor backend; internal/cli/hidden.go registers it.
func New() boundary.Backend { return backend{} }

type backend struct{}

func (backend) Name() string { return "gvisor" }

// Mechanisms, as they really are.
var mechanisms = boundary.Mechanisms{
	FilesystemConfinement:  "gvisor-gofer",
	EgressInterception:     "netns-loopback+runsc-hostinet",
	RequestAttribution:     "endpoint-only",
	PrivilegeFloor:         "gvisor-sentry+seccomp+nnp+capdrop",
	AttributionUnavailable: "gVisor with the host network stack: every broker connection belongs to the runsc sandbox process, so the binary inside cannot be identified",
}

const startTimeout = 60 * time.Second

// Prepare writes the OCI bundle, starts the init in fresh namespaces and
// runsc inside it, and returns once the container runs.
func (backend) Prepare(ctx context.Context, spec boundary.Spec) (boundary.Sandbox, error) {
	pol := spec.Policy
	runsc, err := exec.LookPath("runsc")
	if err != nil {
		return nil, fmt.Errorf("runsc not found in PATH: build gVisor's runsc (%s); Debian's 20221219 is too old", hostinfo.RunscBuild)
	}
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("the gvisor backend needs root here: this runsc, run rootless, fails writes to bind mounts (EINVAL); run moat as root or use --backend native")
	}
	if pol.Process.UID == 0 {
		return nil, fmt.Errorf("BUG: policy uid 0 reached the gvisor backend")
	}
	uid, gid, err := hostIDs(pol)
	if err != nil {
		return nil, err
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	if exe, err = filepath.EvalSymlinks(exe); err != nil {
		return nil, err
	}
	dir := filepath.Join(spec.StateDir, "gvisor")
	bundle := filepath.Join(dir, "bundle")
	rootfs := filepath.Join(bundle, "rootfs")
	root := filepath.Join(dir, "runsc")
	for _, d := range []string{rootfs, root} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	os.Chmod(rootfs, 0o755)
	os.Chmod(bundle, 0o755)
	if len(pol.Filesystem.Volumes) > 0 {
		return nil, errors.New("filesystem.volumes are not available on the gvisor backend yet (the native backend mounts them); use --backend native or read_write grants")
	}
	plan, err := pol.ResolveGrants()
	if err != nil {
		return nil, err
	}
	// A dynamically linked moat runs its stage inside the sentry: its
	// interpreter and libraries are bound read-only too (gVisor has no
	// Landlock to keep them from the workload; they are the host's
	// libc and loader, which grant nothing).
	if err := plan.AddRuntime(); err != nil {
		return nil, err
	}
	grants.AfterPlan()
	grantsDir := filepath.Join(dir, "grants")
	if err := os.MkdirAll(grantsDir, 0o700); err != nil {
		return nil, err
	}
	// Trusted symlinks (e.g. /bin -> usr/bin) are recreated in the
	// read-only rootfs, never mounted through.
	for _, l := range plan.Links {
		p := filepath.Join(rootfs, l.Path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return nil, err
		}
		if err := os.Symlink(l.Target, p); err != nil && !os.IsExist(err) {
			return nil, err
		}
	}
	cgroupsPath := "/moat-" + sanitize(spec.RunID)
	oci, err := buildSpec(pol, uid, gid, plan, rootfs, grantsDir, exe, cgroupsPath)
	if err != nil {
		return nil, err
	}
	b, err := json.MarshalIndent(oci, "", " ")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o600); err != nil {
		return nil, err
	}
	s := &sandbox{pol: pol, uid: uid, gid: gid, dir: dir, pending: map[int]*proc{}, stop: make(chan struct{}), exited: make(chan struct{}),
		reaper: spec.Reaper}
	// runsc makes the container's cgroups itself (one per hierarchy) and
	// leaves them behind when its sandbox is killed: they are the reaper's
	// before they exist, and removed on Terminate.
	s.cgroups = cgroupDirs(cgroupsPath)
	for _, d := range s.cgroups {
		s.reaper.Own(d, false)
	}
	if err := s.startInit(exe, initConfig{Runsc: runsc, Root: root, Bundle: bundle, ID: "moat-" + sanitize(spec.RunID), Plan: *plan, GrantsDir: grantsDir, WriteOwner: uid, Egress: len(pol.Egress.Hosts) > 0, SupervisorTimeoutMS: pol.Process.SupervisorWait().Milliseconds()}); err != nil {
		s.Terminate()
		return nil, err
	}
	return s, nil
}

func sanitize(id string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' {
			return r
		}
		return '-'
	}, id)
}

type sandbox struct {
	pol      *policy.Policy
	uid, gid int // the workload's, inside and on the host (see hostIDs)
	dir      string
	reaper   *reaper.Reaper
	cgroups  []string // runsc's cgroup directories, removed on Terminate

	conn       *initkit.Conn
	initPID    int // host pid of the init
	sandboxPID int // host pid of the runsc sandbox process
	listener   *os.File
	port       int
	egress     *os.File // the egress port's listener, when the policy has egress hosts
	egressPort int

	mu      sync.Mutex
	nextID  int
	pending map[int]*proc
	readErr error

	stop     chan struct{} // closed by Terminate: the locked thread may exit
	exited   chan struct{} // closed when the init has exited
	termOnce sync.Once
}

// startInit starts the init from an OS thread that stays locked for the
// sandbox's lifetime: Pdeathsig fires when that thread exits, which is
// when moat dies.
func (s *sandbox) startInit(exe string, cfg initConfig) error {
	conn, child, err := initkit.Pair()
	if err != nil {
		return err
	}
	s.conn = conn
	defer child.Close()
	cmd := exec.Command(exe, InitHelper)
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	if d := os.Getenv("MOAT_RUNSC_DEBUG"); d != "" {
		cmd.Env = append(cmd.Env, "MOAT_RUNSC_DEBUG="+d)
	}
	cmd.Stderr = os.Stderr
	cmd.ExtraFiles = []*os.File{child} // initCtlFD
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNET | syscall.CLONE_NEWNS | syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS,
		Pdeathsig:  syscall.SIGKILL,
	}
	if err := initkit.StartLocked(cmd.Start, s.stop); err != nil {
		close(s.exited)
		return fmt.Errorf("starting the gvisor init: %w", err)
	}
	child.Close()
	s.initPID = cmd.Process.Pid
	s.reaper.WaitFor(cmd.Process.Pid) // nothing removed before its PID namespace is empty
	go func() { cmd.Wait(); close(s.exited) }()
	if err := s.conn.Send(msg{Op: "config", Config: &cfg}); err != nil {
		return err
	}
	s.conn.SetReadDeadline(time.Now().Add(startTimeout))
	for s.port == 0 || s.sandboxPID == 0 {
		m, files, err := recvMsg(s.conn)
		if err != nil {
			return fmt.Errorf("gvisor init: %w", err)
		}
		switch m.Op {
		case "listener":
			if want := 1 + min(max(m.EgressPort, 0), 1); len(files) != want {
				initkit.CloseFiles(files)
				return fmt.Errorf("gvisor init sent no listener")
			}
			s.listener, s.port = files[0], m.Port
			if m.EgressPort > 0 {
				s.egress, s.egressPort = files[1], m.EgressPort
			}
		case "ready":
			s.sandboxPID = s.hostPID(m.PID)
			if s.sandboxPID == 0 {
				return fmt.Errorf("runsc sandbox process (pid %d in the sandbox's PID namespace) not found on the host", m.PID)
			}
		case "error":
			return fmt.Errorf("gvisor init: %s", m.Error)
		default:
			initkit.CloseFiles(files)
		}
	}
	s.conn.SetReadDeadline(time.Time{})
	// Beat for as long as this process runs and the channel is open: the
	// init ends the sandbox when the beats stop.
	go s.conn.Heartbeats(msg{Op: initkit.HeartbeatOp}, s.pol.Process.SupervisorWait())
	go s.readLoop()
	return nil
}

// hostPID maps a pid of the init's PID namespace to a host pid. The
// process may sit in a PID namespace nested below the init's (a newer
// runsc puts its sandbox process in one of its own), so the match is on
// the NSpid entry at the init's depth, and the process must descend from
// the init (a pid of the same depth in another namespace does not).
func (s *sandbox) hostPID(inner int) int {
	if inner == 1 {
		return s.initPID
	}
	initNS, _, ok := procStatus(s.initPID)
	if !ok || len(initNS) == 0 {
		return 0
	}
	depth := len(initNS) - 1
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ns, _, ok := procStatus(pid)
		if !ok || len(ns) <= depth || ns[depth] != inner {
			continue
		}
		if s.descends(pid) {
			return pid
		}
	}
	return 0
}

// descends reports whether pid is a descendant of the init.
func (s *sandbox) descends(pid int) bool {
	for i := 0; i < 64 && pid > 1; i++ {
		_, ppid, ok := procStatus(pid)
		if !ok {
			return false
		}
		if ppid == s.initPID {
			return true
		}
		pid = ppid
	}
	return false
}

// procStatus reads the NSpid list (outermost first) and PPid of a process.
func procStatus(pid int) (nspid []int, ppid int, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, 0, false
	}
	for _, ln := range strings.Split(string(b), "\n") {
		if v, found := strings.CutPrefix(ln, "NSpid:"); found {
			for _, f := range strings.Fields(v) {
				n, err := strconv.Atoi(f)
				if err != nil {
					return nil, 0, false
				}
				nspid = append(nspid, n)
			}
		} else if v, found := strings.CutPrefix(ln, "PPid:"); found {
			ppid, _ = strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return nspid, ppid, len(nspid) > 0
}

type proc struct {
	s       *sandbox
	id      int
	started chan error
	done    chan struct{}
	code    int
	stdio   *initkit.Stdio
}

func (s *sandbox) readLoop() {
	for {
		m, files, err := recvMsg(s.conn)
		initkit.CloseFiles(files)
		if err != nil {
			s.mu.Lock()
			s.readErr = err
			for id, p := range s.pending {
				select {
				case p.started <- fmt.Errorf("sandbox gone: %v", err):
				default:
				}
				select {
				case <-p.done:
				default:
					p.code = boundary.ExitRefused
					close(p.done)
				}
				delete(s.pending, id)
			}
			s.mu.Unlock()
			return
		}
		s.mu.Lock()
		p := s.pending[m.ID]
		s.mu.Unlock()
		if p == nil {
			continue
		}
		switch m.Op {
		case "started":
			p.started <- nil
		case "error":
			p.started <- errors.New(m.Error)
		case "exited":
			p.code = m.Code
			s.mu.Lock()
			delete(s.pending, m.ID)
			s.mu.Unlock()
			close(p.done)
		}
	}
}

func (s *sandbox) Start(ctx context.Context, p boundary.Process) (boundary.Running, error) {
	if len(p.Argv) == 0 {
		return nil, fmt.Errorf("empty command")
	}
	argv := append([]string{moatInside, StageHelper, "--"}, p.Argv...)
	return s.start(ctx, process(s.pol, s.uid, s.gid, argv, p.Env, p.Dir), p)
}

func (s *sandbox) StartHelper(ctx context.Context, args []string, p boundary.Process) (boundary.Running, error) {
	// The measurement runs behind the same stage as every workload.
	argv := append([]string{moatInside, StageHelper, "--", moatInside}, args...)
	return s.start(ctx, process(s.pol, s.uid, s.gid, argv, p.Env, "/"), p)
}

func (s *sandbox) start(ctx context.Context, op ociProcess, p boundary.Process) (boundary.Running, error) {
	pr := &proc{s: s, started: make(chan error, 1), done: make(chan struct{})}
	stdio, err := initkit.OpenStdio(p)
	if err != nil {
		return nil, err
	}
	pr.stdio = stdio
	defer stdio.CloseChild()
	s.mu.Lock()
	if s.readErr != nil {
		s.mu.Unlock()
		stdio.Close()
		return nil, fmt.Errorf("sandbox gone: %v", s.readErr)
	}
	s.nextID++
	pr.id = s.nextID
	s.pending[pr.id] = pr
	s.mu.Unlock()
	if err := s.conn.Send(msg{Op: "exec", ID: pr.id, Process: &op}, stdio.FDs()...); err != nil {
		stdio.Close()
		return nil, err
	}
	select {
	case err := <-pr.started:
		if err != nil {
			stdio.Close()
			return nil, err
		}
	case <-ctx.Done():
		// Its output still drains if it started after all.
		return nil, ctx.Err()
	}
	return pr, nil
}

// HostPID is the runsc sandbox process: the workload runs inside that
// sentry, not as a host process of its own.
func (p *proc) HostPID() int { return p.s.sandboxPID }

func (p *proc) Wait() (int, error) {
	<-p.done
	p.stdio.Wait(0)
	return p.code, nil
}

func (p *proc) Signal(sig os.Signal) error {
	n, ok := sig.(syscall.Signal)
	if !ok {
		return fmt.Errorf("unsupported signal %v", sig)
	}
	return p.s.conn.Send(msg{Op: "signal", ID: p.id, Signal: int(n)})
}

func (s *sandbox) Listener() (boundary.ListenerInfo, error) {
	if s.listener == nil {
		return boundary.ListenerInfo{}, fmt.Errorf("no listener")
	}
	// Each caller gets its own dup; the sandbox keeps the original.
	fd, err := unix.FcntlInt(s.listener.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return boundary.ListenerInfo{}, err
	}
	return boundary.ListenerInfo{File: os.NewFile(uintptr(fd), "broker-listener"), Port: s.port}, nil
}

// EgressListener returns a dup of the egress port's listener; ok is false
// when the policy has no egress hosts.
func (s *sandbox) EgressListener() (boundary.ListenerInfo, bool, error) {
	if s.egress == nil {
		return boundary.ListenerInfo{}, false, nil
	}
	fd, err := unix.FcntlInt(s.egress.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return boundary.ListenerInfo{}, false, err
	}
	return boundary.ListenerInfo{File: os.NewFile(uintptr(fd), "egress-listener"), Port: s.egressPort}, true, nil
}

func (s *sandbox) Attributor() boundary.Attributor { return endpointOnly{} }

type endpointOnly struct{}

func (endpointOnly) Attribute(net.Conn) boundary.Attribution {
	return boundary.Attribution{Status: boundary.AttributionUnavailable, Reason: mechanisms.AttributionUnavailable}
}

func (s *sandbox) Mechanisms() boundary.Mechanisms { return mechanisms }

func (s *sandbox) HostPID() int { return s.sandboxPID }

func (s *sandbox) Limits() boundary.LimitsStatus {
	return boundary.LimitsStatus{OpenFiles: s.pol.Process.Limits.OpenFiles > 0, DiskDetail: boundary.DiskUnlimited,
		Detail: "memory and pids limits are not configured for runsc on this host"}
}

// Terminate stops the container and the init (whose PID namespace takes
// every remaining process with it) and removes the bundle. Idempotent.
func (s *sandbox) Terminate() error {
	s.termOnce.Do(func() {
		if s.conn != nil {
			s.conn.Send(msg{Op: "terminate"})
			select {
			case <-s.exited:
			case <-time.After(10 * time.Second):
			}
			if s.initPID > 0 {
				syscall.Kill(s.initPID, syscall.SIGKILL)
			}
			<-s.exited
			s.conn.Close()
		}
		close(s.stop)
		if s.listener != nil {
			s.listener.Close()
		}
		if s.egress != nil {
			s.egress.Close()
		}
		os.RemoveAll(s.dir)
		// Every runsc process is gone with the init's PID namespace; the
		// cgroups empty within moments.
		removeCgroups(s.cgroups, s.reaper)
	})
	return nil
}

// hostIDs is the uid/gid the workload runs as, inside gVisor and on the
// host alike: gVisor maps no ids, so what the workload writes to a grant
// lands on the host with the uid it has inside. The rule is native's
// (policy.ResolveHostIDs as root): process.host_uid/host_gid when set,
// else the owner of the first read_write grant when not root, else 65534;
// never 0. Every read_write grant must be owned by that uid: a root-owned
// workspace is refused with the chown fix, never written as root. The
// init checks the owner again on the descriptor it mounts.
func hostIDs(pol *policy.Policy) (int, int, error) {
	uid, gid, err := pol.ResolveHostIDs(0)
	if err != nil {
		return 0, 0, err
	}
	if uid <= 0 || gid <= 0 {
		return 0, 0, fmt.Errorf("BUG: host ids %d:%d", uid, gid)
	}
	if err := pol.CheckWriteOwners(uid, gid, "process.host_uid, else the first read_write grant's owner, else 65534"); err != nil {
		return 0, 0, err
	}
	return uid, gid, nil
}
