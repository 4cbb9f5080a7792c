package native

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/boundary/internal/initkit"
	"github.com/moat-sandbox/moat/internal/grants"
)

// File descriptors the supervisor gives the init.
const (
	initConfigFD = 3 // JSON initConfig, read to EOF
	initCtlFD    = 4 // SOCK_SEQPACKET control channel
	initExeFD    = 5 // the moat binary, exec'd as /proc/self/fd/5
)

// File descriptors the init gives a stage.
const (
	stageErrFD    = 3 // CLOEXEC pipe: EOF means the exec succeeded
	stageConfigFD = 4 // JSON stageConfig
	stageExeFD    = 5 // the moat binary (for StartHelper)
	stageRuleFD   = 6 // first of the grant trees (Landlock rules), count in argv
)

// maxConfigBytes bounds the JSON configs read from the init/stage fds.
const maxConfigBytes = 1 << 20

// exeFDMin is where the init keeps its fd of the moat binary, above any fd
// number a stage's file table uses.
const exeFDMin = 100

// initConfig is everything the init needs, sent by the supervisor.
type initConfig struct {
	// Plan is the grants as the supervisor resolved them (package grants).
	Plan grants.Plan `json:"plan"`
	// Volumes are the paths inside of the policy's volumes, whose mounts
	// arrive on the control channel after the config, in this order.
	Volumes  []string `json:"volumes,omitempty"`
	TmpSize  int64    `json:"tmp_size"`
	UID      int      `json:"uid"`
	GID      int      `json:"gid"`
	Hostname string   `json:"hostname"`
	// Landlock is the ruleset template; the init fills ConnectPort.
	Landlock  llRuleset `json:"landlock"`
	OpenFiles uint64    `json:"open_files"`
	Seccomp   bool      `json:"seccomp"`
	// Egress: make the egress port too (the policy has egress hosts).
	Egress bool `json:"egress,omitempty"`
	// SupervisorTimeout: the workload is killed when no message (the
	// supervisor beats, see initkit.Heartbeats) came for this long.
	SupervisorTimeout time.Duration `json:"supervisor_timeout"`
	// SpareWhenMoved: the host moves the init into the sandbox's cgroups
	// after the init started (cgroup v2; on v1 it is born in them), and
	// says so with a "moved" message; the first spare is forked only
	// then, so that no stage is born outside the sandbox's limits.
	SpareWhenMoved bool `json:"spare_when_moved,omitempty"`
}

// InitMain is pid 1 of the sandbox.
func InitMain(args []string) int {
	// Only the fds named above may survive into the sandbox: whatever
	// moat itself inherited without close-on-exec goes now. Not the
	// runtime's own (its netpoller's, opened during package
	// initialisation when a package touches it): those are close-on-exec.
	initkit.CloseInherited(initExeFD + 1)
	unix.CloseOnExec(initCtlFD)
	ctl, err := initkit.NewConn(initCtlFD)
	if err != nil {
		fmt.Fprintf(os.Stderr, "moat: init: %v\n", err)
		return boundary.ExitRefused
	}
	fail := func(err error) int {
		ctl.Send(ctlMsg{Op: "error", Err: err.Error()})
		return boundary.ExitRefused
	}
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fail(fmt.Errorf("init: PR_SET_DUMPABLE: %w", err))
	}
	var cfg initConfig
	if err := readConfig(initConfigFD, &cfg); err != nil {
		return fail(fmt.Errorf("init: config: %w", err))
	}
	if cfg.SupervisorTimeout <= 0 {
		return fail(errors.New("BUG: init: config without a supervisor timeout"))
	}
	// Keep the moat binary open: after pivot_root it is reachable only
	// through this fd.
	exeFD, err := unix.FcntlInt(initExeFD, unix.F_DUPFD_CLOEXEC, exeFDMin)
	if err != nil {
		return fail(fmt.Errorf("init: keeping the moat binary open: %w", err))
	}
	unix.Close(initExeFD)
	var volumes []clonedTree
	for _, p := range cfg.Volumes {
		m, files, err := recvCtl(ctl)
		if err != nil {
			return fail(fmt.Errorf("init: waiting for volume %s: %w", p, err))
		}
		if m.Op != "volume" || m.Dir != p || len(files) != 1 {
			initkit.CloseFiles(files)
			return fail(fmt.Errorf("BUG: init: expected the mount of volume %s, got %q %q with %d fds", p, m.Op, m.Dir, len(files)))
		}
		fd, err := unix.FcntlInt(files[0].Fd(), unix.F_DUPFD_CLOEXEC, 0)
		files[0].Close()
		if err != nil {
			return fail(err)
		}
		volumes = append(volumes, clonedTree{path: p, fd: fd, dir: true})
	}
	ruleFDs, err := buildRoot(&cfg, volumes)
	if err != nil {
		return fail(fmt.Errorf("init: building the sandbox root: %w", err))
	}
	// After the root is built: open_tree clones count as mount namespaces.
	if err := capCounters(); err != nil {
		return fail(fmt.Errorf("init: %w", err))
	}
	in := &initState{cfg: &cfg, ctl: ctl, exeFD: exeFD, exe: os.NewFile(uintptr(exeFD), "moat"), procs: map[int]*initProc{},
		forked: make(chan struct{}, 1)}
	for _, fd := range ruleFDs {
		in.rules = append(in.rules, os.NewFile(uintptr(fd), "grant"))
	}
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, unix.SIGCHLD)
	go in.reap(sigs)
	// The first start's stage is forked as soon as the root it needs is
	// built, while the init finishes the sandbox (hostname, loopback,
	// listeners) and the host its side (the measurement's preparation):
	// the measurement's helper then starts on a spare, as every later
	// process does, and that stage's start-up is off the path. The spare
	// shares the init's network and UTS namespaces, so what follows
	// applies to it too, and it inherits none of the listeners (they do
	// not exist yet; a stage gets only the fds forkStage gives it). Where
	// the init is moved into its cgroups after its start, the first
	// spare waits for the host's "moved" instead: forked before the
	// move, it would stay in moat's own cgroups, outside the limits.
	if !cfg.SpareWhenMoved {
		in.refill()
	}
	if err := unix.Sethostname([]byte(cfg.Hostname)); err != nil {
		return fail(fmt.Errorf("init: sethostname: %w", err))
	}
	if err := initkit.LoopbackUp(); err != nil {
		return fail(fmt.Errorf("init: %w", err))
	}
	lfd, port, err := initkit.BrokerListener()
	if err != nil {
		return fail(fmt.Errorf("init: broker listener: %w", err))
	}
	cfg.Landlock.ConnectPort = port
	fds := []int{lfd}
	egressPort := 0
	if cfg.Egress {
		efd, eport, err := initkit.BrokerListener()
		if err != nil {
			return fail(fmt.Errorf("init: egress listener: %w", err))
		}
		fds, egressPort = append(fds, efd), eport
		cfg.Landlock.EgressPort = eport
	}
	if err := ctl.Send(ctlMsg{Op: "ready", Port: port, EgressPort: egressPort}, fds...); err != nil {
		return boundary.ExitRefused
	}
	for _, fd := range fds {
		unix.Close(fd)
	}
	for {
		if err := ctl.ArmHeartbeat(cfg.SupervisorTimeout); err != nil {
			return boundary.ExitRefused
		}
		m, files, err := recvCtl(ctl)
		if err != nil {
			// The supervisor is gone, or stopped beating: so is the
			// sandbox (the init is pid 1: its exit kills every process
			// of the namespace).
			if initkit.SupervisorLost(err) {
				fmt.Fprintf(os.Stderr, "moat: init: no heartbeat of the supervisor for %s: killing the workload\n", cfg.SupervisorTimeout)
			}
			return boundary.ExitRefused
		}
		switch m.Op {
		case initkit.HeartbeatOp:
			initkit.CloseFiles(files)
		case "start":
			in.start(m, files)
		case "moved":
			// In the sandbox's cgroups now: so is every stage forked
			// from here on.
			initkit.CloseFiles(files)
			if cfg.SpareWhenMoved {
				in.refill()
			}
		default:
			initkit.CloseFiles(files)
			ctl.Send(ctlMsg{Op: "error", Err: fmt.Sprintf("BUG: unknown control op %q", m.Op)})
		}
	}
}

func readConfig(fd int, v any) error {
	f := os.NewFile(uintptr(fd), "config")
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxConfigBytes+1))
	if err != nil {
		return err
	}
	if len(b) > maxConfigBytes {
		return fmt.Errorf("config exceeds %d bytes", maxConfigBytes)
	}
	return json.Unmarshal(b, v)
}

type initState struct {
	cfg   *initConfig
	ctl   *initkit.Conn
	exeFD int
	exe   *os.File // exeFD, kept open for the sandbox's lifetime
	// rules are the attached grant trees, in plan order: each stage gets
	// them from stageRuleFD on as its Landlock rules' descriptors.
	rules []*os.File

	// mu is held while a stage is forked and registered, and while a
	// child that is not registered is reaped (reap); forked wakes the
	// reaper when a fork released it (forkDone).
	mu      sync.Mutex
	forked  chan struct{}
	procsMu sync.Mutex // guards procs
	procs   map[int]*initProc

	spareMu sync.Mutex // held while forking or taking the spare
	spare   *spare     // the next start's stage, forked ahead (spare_linux.go)
	devNull *os.File   // a spare's stdio until it has its own
}

type initProc struct {
	exit chan int // the exit code, once reaped
}

// start starts one stage for a "start" request; files are its stdio.
// It takes the spare stage when there is a live one (spare_linux.go), else
// forks a fresh stage; then, unless the request is the last (m.Last), it
// asks for the next spare in the background.
func (in *initState) start(m ctlMsg, files []*os.File) {
	defer initkit.CloseFiles(files)
	if !m.Last {
		defer in.refill()
	}
	fail := func(code int, err error) {
		in.ctl.Send(ctlMsg{Op: "failed", ID: m.ID, Code: code, Err: err.Error()})
	}
	if len(files) != 3 {
		fail(boundary.ExitRefused, fmt.Errorf("BUG: start with %d stdio fds", len(files)))
		return
	}
	rs := in.cfg.Landlock
	rs.ExecFD = -1
	if m.Helper {
		rs.ExecFD = stageExeFD
		rs.Rules = append(slices.Clone(rs.Rules), rs.HelperRules...)
	}
	rs.HelperRules = nil
	sc := stageConfig{Argv: m.Argv, Env: m.Env, Dir: m.Dir, Helper: m.Helper, TTY: m.TTY, Landlock: rs,
		OpenFiles: in.cfg.OpenFiles, Seccomp: in.cfg.Seccomp}
	st, rep, err := in.startSpare(&sc, files)
	if st == nil && err == nil {
		st, rep, err = in.startFresh(&sc, files)
	}
	if err != nil {
		fail(boundary.ExitRefused, err)
		return
	}
	if rep != nil {
		if st.pidfd >= 0 {
			unix.Close(st.pidfd)
		}
		go func() { <-st.ip.exit }()
		fail(rep.Code, errors.New(rep.Err))
		return
	}
	if st.pidfd < 0 {
		fail(boundary.ExitRefused, errors.New("BUG: no pidfd for the stage"))
		return
	}
	in.ctl.Send(ctlMsg{Op: "started", ID: m.ID, PID: st.pid}, st.pidfd)
	unix.Close(st.pidfd)
	go func() {
		code := <-st.ip.exit
		// A process is reported exited only when everything it started
		// is gone: detached descendants (double fork, setsid) are killed,
		// not left running unaccounted for.
		if st.nsIno != 0 {
			killUserNS(st.nsIno)
		}
		in.ctl.Send(ctlMsg{Op: "exited", ID: m.ID, Code: code})
	}()
}

// stageProc is a forked stage, registered with the reaper.
type stageProc struct {
	pid   int
	pidfd int    // -1 when it could not be opened
	nsIno uint64 // its user namespace's identity; 0 when it ended first
	ip    *initProc
}

// forkStage forks a stage with fds 0-5 from files (nil: closed) and the
// grant trees from stageRuleFD on.
func (in *initState) forkStage(files []*os.File, args []string, tty bool) (*stageProc, error) {
	attr := &os.ProcAttr{
		Dir:   "/",
		Env:   []string{},
		Files: append(files, in.rules...),
		Sys: &syscall.SysProcAttr{
			// A cgroup namespace rooted at the sandbox's own cgroup: the
			// workload's /proc/self/cgroup says "/", not moat-<run id>
			// (the init joins its cgroup only after its own clone).
			Cloneflags:  unix.CLONE_NEWUSER | unix.CLONE_NEWCGROUP,
			UidMappings: []syscall.SysProcIDMap{{ContainerID: in.cfg.UID, HostID: 0, Size: 1}},
			GidMappings: []syscall.SysProcIDMap{{ContainerID: in.cfg.GID, HostID: 0, Size: 1}},
			// The stage needs CAP_SETPCAP to empty the bounding set and
			// CAP_SYS_RESOURCE to cap its user namespaces; it drops both
			// before it execs the target.
			AmbientCaps: []uintptr{unix.CAP_SETPCAP, unix.CAP_SYS_RESOURCE},
			Setsid:      true,
			Setctty:     tty,
			// No Pdeathsig: it would fire when the Go thread that forked
			// the stage exits; the PID namespace already ends every
			// process when the init exits.
		},
	}
	argv := append([]string{"moat", StageHelper, strconv.Itoa(len(in.rules))}, args...)
	in.mu.Lock()
	p, err := os.StartProcess("/proc/self/fd/"+strconv.Itoa(in.exeFD), argv, attr)
	if err != nil {
		in.forkDone()
		return nil, fmt.Errorf("starting the stage: %w", err)
	}
	// Every process this start makes lives in the stage's user namespace
	// (the workload cannot make another): its identity names them all.
	// Taken now, while mu keeps the stage from being reaped and before it
	// has its config (so before the workload exists): later, a workload
	// that forked and exited at once could be gone, and its descendants
	// with no name.
	st := &stageProc{pid: p.Pid, pidfd: -1, ip: &initProc{exit: make(chan int, 1)}}
	st.pidfd, _ = unix.PidfdOpen(p.Pid, 0) // cannot fail while we hold mu: the child is unreaped
	endedEarly := false
	var nst unix.Stat_t
	if unix.Stat("/proc/"+strconv.Itoa(p.Pid)+"/ns/user", &nst) == nil {
		st.nsIno = nst.Ino
	} else {
		// Asked while mu still keeps the stage unreaped.
		endedEarly = stageEnded(st.pidfd)
	}
	in.procsMu.Lock()
	in.procs[p.Pid] = st.ip
	in.procsMu.Unlock()
	p.Release()
	in.forkDone()
	if st.nsIno == 0 && !endedEarly {
		// Fail closed: without the namespace's identity, what this
		// process leaves running could not be found. (A stage that had
		// already ended, endedEarly, died before it could read its
		// config, e.g. of the terminal's ^C while the run starts: it
		// started nothing, so there is nothing to find, and its end is
		// reported as any process's, 128+n for a signal.)
		// Through the pidfd: mu is released, so the pid alone could be
		// reaped and reused by now.
		if st.pidfd >= 0 {
			unix.PidfdSendSignal(st.pidfd, unix.SIGKILL, nil, 0)
			unix.Close(st.pidfd)
		}
		go func() { <-st.ip.exit }()
		return nil, errors.New("BUG: cannot read the new process's user namespace")
	}
	return st, nil
}

// startFresh forks a stage for sc with files as its stdio, hands it its
// config on a pipe, and waits until it exec'd the target (rep nil) or
// reported why not.
func (in *initState) startFresh(sc *stageConfig, files []*os.File) (*stageProc, *stageReport, error) {
	errR, errW, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	defer errR.Close()
	cfgR, cfgW, err := os.Pipe()
	if err != nil {
		errW.Close()
		return nil, nil, err
	}
	st, err := in.forkStage([]*os.File{files[0], files[1], files[2], errW, cfgR, in.exe}, nil, sc.TTY)
	errW.Close()
	cfgR.Close()
	if err != nil {
		cfgW.Close()
		return nil, nil, err
	}
	go func() {
		json.NewEncoder(cfgW).Encode(sc)
		cfgW.Close()
	}()
	// The stage reports a failure before exec on the pipe; EOF means the
	// target is running.
	b, _ := io.ReadAll(io.LimitReader(errR, initkit.MaxMessage))
	return st, parseReport(b), nil
}

// parseReport is the stage's report of b, nil for none (it exec'd).
func parseReport(b []byte) *stageReport {
	if len(b) == 0 {
		return nil
	}
	var rep stageReport
	if json.Unmarshal(b, &rep) != nil || rep.Code == 0 {
		rep = stageReport{Code: boundary.ExitRefused, Err: "stage failed: " + string(b)}
	}
	return &rep
}

// reap collects every child, including orphans that reparent to pid 1.
//
// The registered children (stages) that have ended are reaped first,
// without mu: a start that forks meanwhile (the spare forked after each
// start holds mu through its fork and exec, a Go start-up) does not hold
// back the report of a workload's exit, as it did when every reap took
// mu. Then every child that has ended, registered or not (orphans), is
// reaped under mu: a stage being forked is registered under mu before mu
// is released, so it is never reaped unregistered (its exit would be
// lost, and its pid free for reuse while forkStage still reads its
// namespace).
func (in *initState) reap(sigs <-chan os.Signal) {
	for {
		select {
		case <-sigs:
		case <-in.forked:
		}
		in.reapRegistered()
		// mu busy: a stage is being forked; forkDone sends on in.forked
		// once it is registered, and the rest is reaped then.
		if in.mu.TryLock() {
			in.reapAll()
			in.mu.Unlock()
		}
	}
}

// forkDone releases mu, taken for a stage's fork, and has the reaper
// collect what ended while it was held.
func (in *initState) forkDone() {
	in.mu.Unlock()
	select {
	case in.forked <- struct{}{}:
	default: // one is pending already
	}
}

// reapRegistered reaps the registered children that have ended.
func (in *initState) reapRegistered() {
	in.procsMu.Lock()
	pids := make([]int, 0, len(in.procs))
	for pid := range in.procs {
		pids = append(pids, pid)
	}
	in.procsMu.Unlock()
	for _, pid := range pids {
		// Seen ended without being reaped, then taken out of procs, then
		// reaped: its pid cannot be reused (and registered again) before
		// its entry is gone.
		var info unix.Siginfo
		if err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil); err != nil || siginfoPID(&info) == 0 {
			continue
		}
		ip := in.take(pid)
		code := reapPID(pid)
		if ip != nil {
			ip.exit <- code
		}
	}
}

// take removes pid's registration and returns it (nil: not registered).
func (in *initState) take(pid int) *initProc {
	in.procsMu.Lock()
	defer in.procsMu.Unlock()
	ip := in.procs[pid]
	delete(in.procs, pid)
	return ip
}

// reapAll reaps every child that has ended; mu is held.
func (in *initState) reapAll() {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		if ip := in.take(pid); ip != nil {
			ip.exit <- exitCode(ws)
		}
	}
}

// sigchld is siginfo_t as waitid fills it for a child: the union that
// holds the pid follows the three ints, aligned as a pointer.
type sigchld struct {
	signo, errno, code int32
	_                  [unsafe.Sizeof(uintptr(0)) - 4]byte
	pid                int32
}

// siginfoPID is the pid that waitid put in info (0 when, with WNOHANG,
// no child had ended: the kernel zeroes info then).
func siginfoPID(info *unix.Siginfo) int {
	return int((*sigchld)(unsafe.Pointer(info)).pid)
}

// reapPID reaps pid, a child that has ended, and returns its exit code.
func reapPID(pid int) int {
	for {
		var ws unix.WaitStatus
		_, err := unix.Wait4(pid, &ws, 0, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return boundary.ExitRefused
		}
		return exitCode(ws)
	}
}

func exitCode(ws unix.WaitStatus) int {
	switch {
	case ws.Exited():
		return ws.ExitStatus()
	case ws.Signaled():
		return 128 + int(ws.Signal())
	}
	return boundary.ExitRefused
}

// userCaps are the kernel object counters capped in the sandbox's user
// namespace before anything of the workload runs. The kernel charges
// these objects to the namespace's owner up the chain of user namespaces
// (a fresh uid of its own for a root-launched sandbox, see startOwned; the
// caller rootless), so without a cap one sandbox could take the whole
// per-uid budget (the attack used up host root's 128 inotify instances
// when root owned the namespace). A cap set here holds
// for every process of the sandbox together, since each stage's user
// namespace is a child of this one. The values are a small share of the
// kernel defaults (inotify: 128 instances, 8192+ watches per uid).
var userCaps = []struct {
	name string
	max  int
}{
	{"max_inotify_instances", 16},   // 1/8 of the default per-uid budget
	{"max_inotify_watches", 8192},   // enough for an editor or a build watcher
	{"max_fanotify_groups", 0},      // fanotify_init is refused by the filter too
	{"max_fanotify_marks", 0},       // idem
	{"max_user_namespaces", 1024},   // one per running stage; the workload gets none (each stage caps its own at 0)
	{"max_mnt_namespaces", 0},       // the workload never needs a namespace
	{"max_ipc_namespaces", 0},       //
	{"max_net_namespaces", 0},       //
	{"max_pid_namespaces", 0},       //
	{"max_uts_namespaces", 0},       //
	{"max_cgroup_namespaces", 1024}, // one per running stage, as for user namespaces
	{"max_time_namespaces", 0},      //
}

// capCounters writes userCaps in this user namespace's /proc/sys/user.
// A counter this kernel does not have is skipped (older kernels lack the
// fanotify ones); any other failure refuses the sandbox.
func capCounters() error {
	for _, c := range userCaps {
		err := os.WriteFile("/proc/sys/user/"+c.name, []byte(strconv.Itoa(c.max)+"\n"), 0)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("capping user.%s at %d: %w", c.name, c.max, err)
		}
	}
	return nil
}

// killRounds bounds killUserNS: each round kills what it finds and looks
// again (a process may fork between a look and a kill); the kill of a
// round's processes makes the next round's list shorter.
const killRounds = 1000

// killUserNS kills every process of the sandbox whose user namespace is
// ino, until none is left (zombies have no namespace and do not count;
// the init reaps them, since they reparent to it).
func killUserNS(ino uint64) {
	for range killRounds {
		ents, err := os.ReadDir("/proc")
		if err != nil {
			return
		}
		found := false
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || pid == 1 {
				continue
			}
			var st unix.Stat_t
			if unix.Stat("/proc/"+e.Name()+"/ns/user", &st) != nil || st.Ino != ino {
				continue
			}
			found = true
			unix.Kill(pid, unix.SIGKILL)
		}
		if !found {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// stageEnded reports whether the process of pidfd has ended (it is a
// zombie), without reaping it.
func stageEnded(pidfd int) bool {
	if pidfd < 0 {
		return false
	}
	var info unix.Siginfo
	err := unix.Waitid(unix.P_PIDFD, pidfd, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
	// WNOHANG: a live child leaves info zeroed (no pid).
	return err == nil && info.Signo != 0
}
