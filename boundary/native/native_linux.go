package native

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/boundary/internal/initkit"
	"github.com/moat-sandbox/moat/boundary/seccomp"
	"github.com/moat-sandbox/moat/internal/grants"
	"github.com/moat-sandbox/moat/policy"
)

// minABIFloor: Landlock must exist at all, whatever the policy says
// (policy.MinABIFloor is the same floor, for what a policy may write).
const minABIFloor = policy.MinABIFloor

// testOmitLandlock, set only by this package's tests, leaves these grants
// out of the Landlock ruleset while they stay bind-mounted, to show that
// Landlock holds on its own.
var testOmitLandlock []string

// testNoSeccomp, set only by this package's tests, leaves the seccomp
// filter out, to show what the other walls do without it.
var testNoSeccomp bool

// testBeforeCgroupAdd, set only by this package's tests, runs just before
// the init is moved into its cgroups.
var testBeforeCgroupAdd func()

// testNotBorn, set only by this package's tests, has the init moved into
// its cgroups after its start (cgroup v2's way) on a cgroup v1 host too.
var testNotBorn bool

// testAfterInitStart, set only by this package's tests, runs with the
// init's host pid once it is started.
var testAfterInitStart func(pid int)

type backend struct{}

func (backend) Name() string { return Name }

// Prepare builds the sandbox: it checks the Landlock ABI against the
// policy's floor before anything runs, starts the init in fresh
// namespaces, and waits until the root is built and the broker listener
// exists. Nothing of the workload runs yet.
func (backend) Prepare(ctx context.Context, spec boundary.Spec) (boundary.Sandbox, error) {
	pol := spec.Policy
	if pol == nil {
		return nil, errors.New("native: BUG: no policy in spec")
	}
	abi := LandlockABI()
	floor := max(pol.Landlock.ABIFloor, minABIFloor)
	if abi < floor {
		return nil, &ABIError{Found: abi, Floor: floor}
	}
	if pol.Process.UID <= 0 {
		return nil, fmt.Errorf("process.uid is %d; the workload must run as a non-root uid (e.g. 1000)", pol.Process.UID)
	}
	gid := pol.Process.GID
	if gid <= 0 {
		gid = pol.Process.UID
	}
	hostUID, hostGID, err := hostIDs(pol)
	if err != nil {
		return nil, err
	}
	cfg, err := initConfigFor(pol, abi, gid)
	if err != nil {
		return nil, err
	}
	grants.AfterPlan()
	if _, err := seccomp.Build(filterOptions(abi)); err != nil {
		return nil, fmt.Errorf("the seccomp filter cannot be built here: %w", err)
	}
	cfg.Seccomp = !testNoSeccomp
	// The supervisor holds the listener and the journal key: keep it out
	// of reach of ptrace and core dumps.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return nil, fmt.Errorf("native: PR_SET_DUMPABLE: %w", err)
	}
	sb := &sandbox{runID: spec.RunID, abi: abi, policy: pol, reaper: spec.Reaper,
		pending: map[int]*proc{}, procs: map[int]*proc{},
		initDone: make(chan struct{}), release: make(chan struct{}), ready: make(chan error, 1)}
	if err := sb.startInit(ctx, cfg, hostUID, hostGID); err != nil {
		sb.Terminate()
		return nil, err
	}
	return sb, nil
}

// filterOptions are the Options of the seccomp filter the stage installs
// on a host of Landlock ABI abi: from ABI 9, Landlock's Unix-socket rules
// confine pathname sockets, so the filter lets AF_UNIX sockets through.
func filterOptions(abi int) seccomp.Options { return seccomp.Options{AllowUnixSockets: abi >= 9} }

// SeccompOptions are the Options of the filter that every process of a
// sandbox made on this host runs behind (seccomp.Filtered).
func (backend) SeccompOptions() seccomp.Options { return filterOptions(LandlockABI()) }

// hostIDs is the host uid/gid the sandbox's root maps to. Rootless, it is
// the caller's own; as root, process.host_uid/host_gid, never 0.
func hostIDs(pol *policy.Policy) (int, int, error) {
	uid, gid, err := pol.ResolveHostIDs(os.Geteuid())
	if err != nil {
		return 0, 0, err
	}
	if os.Geteuid() != 0 {
		return uid, gid, nil
	}
	if uid <= 0 || gid <= 0 {
		return 0, 0, fmt.Errorf("BUG: host ids %d:%d", uid, gid)
	}
	if err := pol.CheckWriteOwners(uid, gid, "process.host_uid"); err != nil {
		return 0, 0, err
	}
	return uid, gid, nil
}

// initConfigFor turns the policy into the init's configuration and the
// Landlock ruleset (the port is filled in by the init).
func initConfigFor(pol *policy.Policy, abi, gid int) (*initConfig, error) {
	cfg := &initConfig{UID: pol.Process.UID, GID: gid, Hostname: "moat", TmpSize: int64(pol.Filesystem.TmpSize), SupervisorTimeout: pol.Process.SupervisorWait()}
	if cfg.TmpSize <= 0 {
		// A tmpfs of size 0 would be unlimited: a policy built in code
		// (not loaded) gets the default.
		cfg.TmpSize = int64(policy.DefaultTmpSize)
	}
	if pol.Process.Limits.OpenFiles > 0 {
		cfg.OpenFiles = uint64(pol.Process.Limits.OpenFiles)
	}
	rs := llRuleset{ABI: abi, ExecFD: -1}
	plan, err := pol.ResolveGrants()
	if err != nil {
		return nil, err
	}
	if err := plan.AddRuntime(); err != nil {
		return nil, err
	}
	cfg.Plan = *plan
	for i, m := range plan.Mounts {
		if slices.Contains(testOmitLandlock, m.Path) {
			continue
		}
		acc := uint64(llFSExecute | llFSReadFile | llFSReadDir)
		if m.Write {
			acc = llFSAll(abi)
		}
		r := llRule{Path: m.Real, Grant: i + 1, Access: acc}
		if m.Runtime {
			rs.HelperRules = append(rs.HelperRules, r)
		} else {
			rs.Rules = append(rs.Rules, r)
		}
	}
	// Volumes follow the grants in the init's list of trees.
	for j, v := range pol.Filesystem.Volumes {
		cfg.Volumes = append(cfg.Volumes, v.Path)
		rs.Rules = append(rs.Rules, llRule{Path: v.Path, Grant: len(plan.Mounts) + j + 1, Access: llFSAll(abi)})
	}
	// read_dir beneath / lets `ls /` (agents do it first) and every
	// skeleton directory be listed: all it shows is names of what is
	// mounted, which the mount table shows anyway; it grants no read of a
	// file and no listing that a grant's own rule does not.
	rs.Rules = append(rs.Rules, llRule{Path: "/", Access: llFSReadDir},
		llRule{Path: "/tmp", Access: llFSAll(abi)}, llRule{Path: "/proc", Access: llFSReadFile | llFSReadDir})
	for _, n := range devNodes {
		rs.Rules = append(rs.Rules, llRule{Path: "/dev/" + n, Access: llFSReadFile | llFSWriteFile | llFSTruncate | llFSIoctlDev})
	}
	cfg.Landlock = rs
	cfg.Egress = len(pol.Egress.Hosts) > 0
	return cfg, nil
}

// startInit starts the init from an OS thread that stays locked for the
// sandbox's lifetime (Pdeathsig fires when that thread exits), and waits
// until it reports ready.
func (sb *sandbox) startInit(ctx context.Context, cfg *initConfig, hostUID, hostGID int) (err error) {
	ctl, child, err := initkit.Pair()
	if err != nil {
		return fmt.Errorf("native: %w", err)
	}
	sb.ctl = ctl
	defer child.Close()
	cfgR, cfgW, err := os.Pipe()
	if err != nil {
		return err
	}
	defer cfgR.Close()
	exePath, err := os.Executable()
	if err != nil {
		return fmt.Errorf("native: locating the moat binary: %w", err)
	}
	// Exec through an fd: as root the init runs as host_uid, which may not
	// be able to walk to the binary's directory.
	exe, err := os.Open(exePath)
	if err != nil {
		return fmt.Errorf("native: opening the moat binary: %w", err)
	}
	defer exe.Close()
	cmd := &exec.Cmd{
		Path:       "/proc/self/fd/" + strconv.Itoa(initExeFD),
		Args:       []string{"moat", InitHelper},
		Env:        []string{},
		Dir:        "/",
		ExtraFiles: []*os.File{cfgR, child, exe}, // fds 3, 4, 5
		SysProcAttr: &syscall.SysProcAttr{
			Cloneflags: unix.CLONE_NEWUSER | unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWNET |
				unix.CLONE_NEWIPC | unix.CLONE_NEWUTS | unix.CLONE_NEWCGROUP,
			UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: hostUID, Size: 1}},
			GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: hostGID, Size: 1}},
			// The fork runs as hostUID without supplementary groups
			// (startOwned), so the maps are written unprivileged and
			// setgroups is denied in the namespace.
			Credential: &syscall.Credential{Uid: 0, Gid: 0, NoSetGroups: true},
			Pdeathsig:  syscall.SIGKILL,
			// A process group of its own: the ^C typed at moat's terminal
			// while it is not yet raw signals moat's group, and killed the
			// init (the run then failed with 125; found by the ^C loop).
			// moat forwards signals to the workload itself.
			Setpgid: true,
		},
	}
	sb.cg, sb.limits = newCgroups(sb.runID, sb.policy.Process.Limits, sb.reaper)
	// On cgroup v1 the init is born in its cgroups: the forking thread
	// moves itself into them for the fork and back after it (see
	// enterThread: no RCU grace period, which a move of the init would
	// wait for).
	born := sb.cg != nil && sb.cg.threadEntry() && !testNotBorn
	start := func() error {
		if born {
			if testBeforeCgroupAdd != nil {
				testBeforeCgroupAdd()
			}
			leave, err := sb.cg.enterThread()
			if err != nil {
				return fmt.Errorf("cgroup: %w", err)
			}
			_, err = startOwned(cmd, hostGID)
			if lerr := leave(); lerr != nil {
				if err == nil {
					cmd.Process.Kill()
					cmd.Wait()
				}
				return fmt.Errorf("cgroup: %w", errors.Join(err, lerr))
			}
			return err
		}
		_, err := startOwned(cmd, hostGID)
		return err
	}
	// startOwned changes the forking thread's ids: StartLocked's thread
	// is the sandbox's own.
	err = initkit.StartLocked(start, sb.release)
	// The init has its own copy of its end of the control channel: this
	// one is closed now, so that the init's end (its exit before it is
	// ready included) reaches readCtl as the channel's end. Held until
	// startInit returned, it kept a supervisor whose init had died
	// waiting for "ready" for ever (seen with 50 sandboxes created at
	// once, stuck in Confirming).
	child.Close()
	if err != nil {
		close(sb.initDone)
		return fmt.Errorf("native: starting the sandbox init: %w", err)
	}
	sb.cmd = cmd
	if testAfterInitStart != nil {
		testAfterInitStart(cmd.Process.Pid)
	}
	// The reaper removes nothing of this run before the sandbox's PID
	// namespace is empty (its init gone).
	sb.reaper.WaitFor(cmd.Process.Pid)
	go func() { cmd.Wait(); close(sb.initDone) }()
	// Elsewhere (cgroup v2), moving a process into a cgroup takes the
	// kernel's threadgroup lock for writing. The init is moved while it
	// builds the sandbox's root: it forks its first spare only when told
	// that the move is done ("moved", initConfig.SpareWhenMoved) and
	// starts no other process before it is asked to, after Prepare;
	// Prepare returns only once the move is done (every return below
	// waits for it).
	added := make(chan error, 1)
	if sb.cg != nil && !born {
		pid := cmd.Process.Pid
		go func() {
			if testBeforeCgroupAdd != nil {
				testBeforeCgroupAdd()
			}
			added <- sb.cg.add(pid)
		}()
	} else {
		added <- nil
	}
	cfg.SpareWhenMoved = sb.cg != nil && !born
	defer func() {
		if aerr := <-added; aerr != nil && err == nil {
			err = fmt.Errorf("native: cgroup: %w", aerr)
		}
		if err == nil && cfg.SpareWhenMoved {
			// The init forks its first spare now (initConfig).
			if serr := sb.ctl.Send(ctlMsg{Op: "moved"}); serr != nil {
				err = fmt.Errorf("native: telling the init it is in its cgroups: %w", serr)
			}
		}
	}()
	if cfg.OpenFiles > 0 {
		sb.limits.OpenFiles = true
		var cur unix.Rlimit
		if unix.Getrlimit(unix.RLIMIT_NOFILE, &cur) == nil && cfg.OpenFiles > cur.Max {
			note := fmt.Sprintf("open_files %d is above moat's own hard limit; processes get %d", cfg.OpenFiles, cur.Max)
			if sb.limits.Detail != "" {
				note = sb.limits.Detail + "; " + note
			}
			sb.limits.Detail = note
		}
	}
	// Volumes are mounted here, as root, and handed to the init, which
	// attaches them in the new root (it reads them after its config).
	for _, v := range sb.policy.Filesystem.Volumes {
		m, img, err := volumeMount(v, hostUID, hostGID)
		if err != nil {
			return err
		}
		sb.volumes = append(sb.volumes, img) // its lock lasts as long as the sandbox
		err = sb.ctl.Send(ctlMsg{Op: "volume", Dir: v.Path}, m)
		unix.Close(m)
		if err != nil {
			return fmt.Errorf("native: sending volume %s: %w", v.Path, err)
		}
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		return fmt.Errorf("BUG: init config: %w", err)
	}
	go func() { cfgW.Write(b); cfgW.Close() }()
	go sb.readCtl()
	select {
	case err := <-sb.ready:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// New returns the native backend; internal/cli/hidden.go registers it.
func New() boundary.Backend { return backend{} }

// dumpMu serializes the moments when the supervisor is dumpable.
var dumpMu sync.Mutex

// startOwned starts cmd, which makes a new user namespace. As root the
// namespace is owned by a fresh uid that no host process runs as (a
// random one from ownerUIDBase on), never by root and never by host_uid:
//
//   - The kernel charges a namespace's object counters (inotify,
//     fanotify, …) up the chain to the owner of the outermost namespace;
//     owned by root, a sandbox drew on root's budget (found by attack).
//   - Owned by host_uid, every host process running as host_uid (65534 by
//     default: "nobody" daemons) held every capability inside the sandbox:
//     it could setns into it, ptrace the init and use the broker (found by
//     attack on the first fix).
//
// A fresh owner has its own budget and no process that could use it. The
// clone runs on a locked OS thread that alone takes that uid as its
// effective uid, without supplementary groups, with its capabilities
// raised again (the permitted set stays root's), so that it can still
// write the id maps (0 → host_uid); raw syscalls, since Go's Setresuid
// would change every thread. It gets root back after.
//
// The supervisor is not dumpable, which makes /proc/<child>/uid_map
// root's; rootless, the fork's writer of the id maps could not open it.
// So it is dumpable for the duration of the fork, and only then.
func startOwned(cmd *exec.Cmd, hostGID int) (owner int, err error) {
	dumpMu.Lock()
	defer dumpMu.Unlock()
	owner = os.Geteuid()
	if owner == 0 {
		var r [4]byte
		if _, err := rand.Read(r[:]); err != nil {
			return 0, err
		}
		owner = ownerUIDBase + int(binary.LittleEndian.Uint32(r[:])%ownerUIDRange)
		groups, err := unix.Getgroups()
		if err != nil {
			return 0, err
		}
		if err := threadIDs(owner, hostGID, nil); err != nil {
			threadIDs(0, 0, groups)
			return 0, fmt.Errorf("native: taking uid %d for the fork: %w", owner, err)
		}
		defer func() {
			if rerr := threadIDs(0, 0, groups); rerr != nil && err == nil {
				err = fmt.Errorf("BUG: native: restoring root on the supervisor thread: %w", rerr)
			}
		}()
		if err := raiseCaps(); err != nil {
			return 0, fmt.Errorf("native: capabilities for the fork: %w", err)
		}
	}
	// After the id change, which resets dumpability; the change back
	// resets it again.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 1, 0, 0, 0); err != nil {
		return 0, err
	}
	defer unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	return owner, cmd.Start()
}

// The owners of root-launched sandboxes' user namespaces: a range of uids
// above those of users, systemd's dynamic users and the usual container
// subordinate ranges (which end below 0x70000000).
const (
	ownerUIDBase  = 0x7e000000
	ownerUIDRange = 0x00ffffff
)

// raiseCaps makes the calling thread's effective capabilities its
// permitted ones (a root thread whose effective uid was changed keeps
// them permitted).
func raiseCaps() error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return err
	}
	data[0].Effective, data[1].Effective = data[0].Permitted, data[1].Permitted
	return unix.Capset(&hdr, &data[0])
}

// threadIDs sets the calling thread's supplementary groups, effective gid
// and effective uid (in the order that keeps the privilege to do each),
// leaving the real and saved ids (root) alone. Going back to uid 0 comes
// first, then the groups.
func threadIDs(uid, gid int, groups []int) error {
	keep := ^uintptr(0)
	if uid == 0 {
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, keep, 0, keep); e != 0 {
			return e
		}
	}
	gs := make([]uint32, len(groups))
	for i, g := range groups {
		gs[i] = uint32(g)
	}
	var gp uintptr
	if len(gs) > 0 {
		gp = uintptr(unsafe.Pointer(&gs[0]))
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, uintptr(len(gs)), gp, 0); e != 0 {
		return e
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, keep, uintptr(gid), keep); e != 0 {
		return e
	}
	if uid != 0 {
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, keep, uintptr(uid), keep); e != 0 {
			return e
		}
	}
	return nil
}
