package native

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/boundary/attrib"
	"github.com/moat-sandbox/moat/boundary/internal/initkit"
	"github.com/moat-sandbox/moat/internal/reaper"
	"github.com/moat-sandbox/moat/policy"
)

// stdioDrainDelay bounds how long Wait keeps copying a process's output
// after it exited, while a descendant still holds the pipe.
const stdioDrainDelay = 2 * time.Second

type sandbox struct {
	runID  string
	abi    int
	policy *policy.Policy
	cmd    *exec.Cmd
	ctl    *initkit.Conn
	cg     *cgroups
	limits boundary.LimitsStatus
	reaper *reaper.Reaper
	// volumes are the open, locked images of the policy's volumes.
	volumes []*os.File

	listener *os.File
	port     int
	// egress and egressPort: the egress port's listener, when the policy
	// has egress hosts.
	egress     *os.File
	egressPort int
	ready      chan error

	initDone chan struct{} // closed when the init has been reaped
	release  chan struct{} // closed to end the supervisor's locked thread

	mu      sync.Mutex
	nextID  int
	pending map[int]*proc // sent "start", no answer yet
	procs   map[int]*proc // started, not exited
	dead    error         // set once the control channel is gone
	readyOK bool

	termOnce sync.Once
	termErr  error
}

// readCtl dispatches the init's messages until the channel closes.
func (sb *sandbox) readCtl() {
	for {
		m, files, err := recvCtl(sb.ctl)
		if err != nil {
			sb.channelGone(err)
			sb.ctl.Close()
			return
		}
		switch m.Op {
		case "ready":
			if want := 1 + min(m.EgressPort, 1); len(files) != want || m.Port <= 0 || m.EgressPort < 0 {
				initkit.CloseFiles(files)
				sb.ready <- errors.New("native: BUG: init sent no broker listener")
				continue
			}
			sb.mu.Lock()
			sb.listener, sb.port, sb.readyOK = files[0], m.Port, true
			if m.EgressPort > 0 {
				sb.egress, sb.egressPort = files[1], m.EgressPort
			}
			sb.mu.Unlock()
			// Beat for as long as this process runs and the channel is
			// open: the init kills the workload when the beats stop.
			go sb.ctl.Heartbeats(ctlMsg{Op: initkit.HeartbeatOp}, sb.policy.Process.SupervisorWait())
			sb.ready <- nil
		case "error":
			initkit.CloseFiles(files)
			sb.mu.Lock()
			ok := sb.readyOK
			sb.mu.Unlock()
			if !ok {
				sb.ready <- errors.New(m.Err)
			}
		case "started", "failed":
			sb.mu.Lock()
			p := sb.pending[m.ID]
			delete(sb.pending, m.ID)
			if p != nil && m.Op == "started" {
				sb.procs[m.ID] = p
			}
			sb.mu.Unlock()
			if p == nil {
				initkit.CloseFiles(files)
				continue
			}
			if m.Op == "failed" {
				initkit.CloseFiles(files)
				p.started <- &boundary.StartError{Code: m.Code, Msg: m.Err}
				continue
			}
			if len(files) != 1 {
				initkit.CloseFiles(files)
				p.started <- errors.New("native: BUG: started without a pidfd")
				continue
			}
			p.pidfd = files[0]
			p.hostPID = pidOfPidfd(p.pidfd)
			p.started <- nil
		case "exited":
			initkit.CloseFiles(files)
			sb.mu.Lock()
			p := sb.procs[m.ID]
			delete(sb.procs, m.ID)
			sb.mu.Unlock()
			if p != nil {
				p.exit <- exitResult{code: m.Code}
			}
		default:
			initkit.CloseFiles(files)
		}
	}
}

func (sb *sandbox) channelGone(err error) {
	if errors.Is(err, initkit.ErrClosed) {
		err = errors.New("native: the sandbox init exited")
	}
	sb.mu.Lock()
	sb.dead = err
	pending, procs := sb.pending, sb.procs
	sb.pending, sb.procs = map[int]*proc{}, map[int]*proc{}
	ok := sb.readyOK
	sb.mu.Unlock()
	if !ok {
		select {
		case sb.ready <- fmt.Errorf("native: the sandbox init failed before it was ready: %w", err):
		default:
		}
	}
	for _, p := range pending {
		p.started <- err
	}
	for _, p := range procs {
		p.exit <- exitResult{code: 128 + int(unix.SIGKILL), err: err}
	}
}

// Start runs p under the sandbox's full confinement.
func (sb *sandbox) Start(ctx context.Context, p boundary.Process) (boundary.Running, error) {
	if len(p.Argv) == 0 {
		return nil, errors.New("moat: refused: no command given")
	}
	return sb.start(ctx, p, false)
}

// StartHelper runs moat's own binary with args under the same confinement
// as Start; the binary is reached through an fd, it is not in the root.
func (sb *sandbox) StartHelper(ctx context.Context, args []string, p boundary.Process) (boundary.Running, error) {
	p.Argv = append([]string{"moat"}, args...)
	return sb.start(ctx, p, true)
}

type exitResult struct {
	code int
	err  error
}

type proc struct {
	started chan error
	exit    chan exitResult
	pidfd   *os.File
	hostPID int

	stdio    *initkit.Stdio
	waitOnce sync.Once
	res      exitResult
}

func (sb *sandbox) start(ctx context.Context, p boundary.Process, helper bool) (boundary.Running, error) {
	pr := &proc{started: make(chan error, 1), exit: make(chan exitResult, 1)}
	stdio, err := initkit.OpenStdio(p)
	if err != nil {
		return nil, fmt.Errorf("native: stdio: %w", err)
	}
	pr.stdio = stdio
	sb.mu.Lock()
	if sb.dead != nil {
		sb.mu.Unlock()
		stdio.CloseChild()
		stdio.Close()
		return nil, fmt.Errorf("moat: the sandbox is gone: %w", sb.dead)
	}
	sb.nextID++
	id := sb.nextID
	sb.pending[id] = pr
	sb.mu.Unlock()
	env := p.Env
	if env == nil {
		env = []string{}
	}
	err = sb.ctl.Send(ctlMsg{Op: "start", ID: id, Argv: p.Argv, Env: env, Dir: p.Dir, Helper: helper, TTY: p.TTY != nil, Last: p.Last}, stdio.FDs()...)
	stdio.CloseChild()
	if err != nil {
		sb.mu.Lock()
		delete(sb.pending, id)
		sb.mu.Unlock()
		stdio.Close()
		return nil, fmt.Errorf("native: asking the init to start %q: %w", p.Argv[0], err)
	}
	select {
	case err = <-pr.started:
	case <-ctx.Done():
		// The init answers regardless; a process started after we gave up
		// is killed.
		go func() {
			if <-pr.started == nil {
				pr.Signal(unix.SIGKILL)
				pr.Wait()
			}
		}()
		stdio.Close()
		return nil, ctx.Err()
	}
	if err != nil {
		stdio.Close()
		return nil, err
	}
	return pr, nil
}

func (pr *proc) HostPID() int { return pr.hostPID }

// Wait returns the exit code (128+signal when killed).
func (pr *proc) Wait() (int, error) {
	pr.waitOnce.Do(func() {
		pr.res = <-pr.exit
		pr.stdio.Wait(stdioDrainDelay)
		if pr.pidfd != nil {
			pr.pidfd.Close()
		}
	})
	return pr.res.code, pr.res.err
}

// Signal sends sig through the process's pidfd (never to a recycled pid).
func (pr *proc) Signal(sig os.Signal) error {
	s, ok := sig.(unix.Signal)
	if !ok {
		return fmt.Errorf("native: unsupported signal %v", sig)
	}
	if pr.pidfd == nil {
		return errors.New("native: process not started")
	}
	return unix.PidfdSendSignal(int(pr.pidfd.Fd()), s, nil, 0)
}

// pidOfPidfd reads the pid a pidfd refers to, as this process's /proc
// sees it (the host pid).
func pidOfPidfd(f *os.File) int {
	fi, err := os.Open("/proc/self/fdinfo/" + strconv.Itoa(int(f.Fd())))
	if err != nil {
		return 0
	}
	defer fi.Close()
	return parseFdinfoPid(fi)
}

// parseFdinfoPid reads the "Pid:" line of a pidfd's fdinfo; 0 when absent
// or malformed (the kernel writes -1 for a process that is gone).
func parseFdinfoPid(r io.Reader) int {
	sc := bufio.NewScanner(io.LimitReader(r, maxFdinfoBytes))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "Pid:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil || n < 0 {
				return 0
			}
			return n
		}
	}
	return 0
}

// maxFdinfoBytes bounds what is read of an fdinfo file.
const maxFdinfoBytes = 4096

// Listener returns the broker's listening socket, made inside the
// sandbox's network namespace. The caller owns the returned File.
func (sb *sandbox) Listener() (boundary.ListenerInfo, error) {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.listener == nil {
		return boundary.ListenerInfo{}, errors.New("native: no broker listener (the sandbox is not prepared or was terminated)")
	}
	f, err := initkit.Dup(sb.listener)
	if err != nil {
		return boundary.ListenerInfo{}, err
	}
	return boundary.ListenerInfo{File: f, Port: sb.port}, nil
}

// EgressListener returns the egress port's listening socket, made inside
// the sandbox's network namespace when the policy has egress hosts; ok is
// false without one. The caller owns the returned File.
func (sb *sandbox) EgressListener() (boundary.ListenerInfo, bool, error) {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.egress == nil {
		return boundary.ListenerInfo{}, false, nil
	}
	f, err := initkit.Dup(sb.egress)
	if err != nil {
		return boundary.ListenerInfo{}, false, err
	}
	return boundary.ListenerInfo{File: f, Port: sb.egressPort}, true, nil
}

// Attributor resolves broker connections by socket inode in the sandbox's
// network namespace.
func (sb *sandbox) Attributor() boundary.Attributor { return attrib.New(sb.HostPID()) }

// Mechanisms names what enforces each property. It never authorizes.
func (sb *sandbox) Mechanisms() boundary.Mechanisms {
	egress := "netns-loopback+seccomp"
	if sb.abi >= 4 {
		egress = "netns-loopback+landlock-net+seccomp"
	}
	return boundary.Mechanisms{
		FilesystemConfinement: fmt.Sprintf("mountns+landlock-v%d", sb.abi),
		EgressInterception:    egress,
		RequestAttribution:    "socket-inode-lookup",
		PrivilegeFloor:        "userns+nnp+seccomp+capdrop",
	}
}

// HostPID is the init's pid on the host.
func (sb *sandbox) HostPID() int {
	if sb.cmd == nil || sb.cmd.Process == nil {
		return 0
	}
	return sb.cmd.Process.Pid
}

// Limits reports which resource limits hold.
func (sb *sandbox) Limits() boundary.LimitsStatus {
	l := sb.limits
	l.Disk, l.DiskDetail = diskStatus(sb.policy.Filesystem)
	return l
}

// OOMKills counts the kernel's out-of-memory kills in the sandbox's
// memory cgroup (boundary.OOMCounter); ok is false without one.
func (sb *sandbox) OOMKills() (uint64, bool) { return sb.cg.oomKills() }

// diskStatus says whether the workload's disk use is limited: only when
// everything it can write is size-capped (volumes and /tmp), that is, when
// it has no read_write grant.
func diskStatus(fs policy.Filesystem) (bool, string) {
	switch {
	case len(fs.ReadWrite) > 0 && len(fs.Volumes) > 0:
		return false, "workspace disk use is not limited: the volumes are capped, but the read_write grants are host directories the workload can fill"
	case len(fs.ReadWrite) > 0:
		return false, boundary.DiskUnlimited
	}
	var caps []string
	for _, v := range fs.Volumes {
		caps = append(caps, fmt.Sprintf("%s %s", v.Path, v.Size))
	}
	caps = append(caps, "/tmp (tmp_size)")
	return true, "disk use is limited: everything the workload can write is size-capped (" + strings.Join(caps, ", ") + ")"
}

// Terminate kills the init (the PID namespace takes every other process
// with it), reaps it, and releases the listener and cgroups. Idempotent.
func (sb *sandbox) Terminate() error {
	sb.termOnce.Do(func() {
		close(sb.release)
		if sb.cmd != nil && sb.cmd.Process != nil {
			sb.cmd.Process.Signal(unix.SIGKILL)
			<-sb.initDone
		}
		if sb.ctl != nil {
			sb.ctl.Close()
		}
		sb.mu.Lock()
		if sb.egress != nil {
			sb.egress.Close()
			sb.egress = nil
		}
		if sb.listener != nil {
			sb.listener.Close()
			sb.listener = nil
		}
		sb.mu.Unlock()
		if sb.cg != nil {
			sb.termErr = sb.cg.remove()
		}
		// The init is reaped: its mounts of the volumes are gone. Their
		// locks go with these files.
		for _, f := range sb.volumes {
			f.Close()
		}
	})
	return sb.termErr
}
