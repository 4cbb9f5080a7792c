package gvisor

import (
	"encoding/json"
	"errors"
	"fmt"
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
)

// initConfig is sent by the supervisor as the first control message.
type initConfig struct {
	Runsc  string `json:"runsc"`
	Root   string `json:"root"`   // runsc --root
	Bundle string `json:"bundle"` // OCI bundle directory
	ID     string `json:"id"`     // container id
	// Plan is the grants as the supervisor resolved them; the init opens,
	// checks and clones each, and attaches it at GrantsDir/<index>.
	Plan      grants.Plan `json:"plan"`
	GrantsDir string      `json:"grants_dir"`
	// WriteOwner is the host uid that must own every read_write grant
	// (the workload's, see hostIDs); checked on the descriptor mounted.
	WriteOwner int `json:"write_owner"`
	// Egress: make the egress port too (the policy has egress hosts).
	Egress bool `json:"egress,omitempty"`
	// SupervisorTimeoutMS: the sandbox is ended when no message (the
	// supervisor beats, see initkit.Heartbeats) came for this long.
	// (Milliseconds: the strict decoder has no form for a
	// time.Duration.)
	SupervisorTimeoutMS int64 `json:"supervisor_timeout_ms"`
}

// msg is one control message in either direction (SOCK_SEQPACKET: one
// message per packet, fds attached).
type msg struct {
	Op   string `json:"op"`
	ID   int    `json:"id,omitempty"`
	Port int    `json:"port,omitempty"`
	// EgressPort: the egress port (listener: its fd after the broker's).
	EgressPort int         `json:"egress_port,omitempty"`
	PID        int         `json:"pid,omitempty"` // inner pid (the init's PID namespace)
	Code       int         `json:"code,omitempty"`
	Signal     int         `json:"signal,omitempty"`
	Error      string      `json:"error,omitempty"`
	Process    *ociProcess `json:"process,omitempty"`
	Config     *initConfig `json:"config,omitempty"`
}

// initCtlFD is the init's end of the control channel.
const initCtlFD = 3

// recvMsg returns the next message (decoded strictly, see initkit) and the
// files attached to it.
func recvMsg(c *initkit.Conn) (msg, []*os.File, error) {
	var m msg
	files, err := c.Recv(&m)
	return m, files, err
}

// InitMain runs as pid 1 of a new PID, network and mount namespace. It
// brings up loopback, makes the broker's listener, starts runsc, and then
// runs `runsc exec` for each process the supervisor asks for.
func InitMain([]string) int {
	unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	unix.CloseOnExec(initCtlFD)
	c, err := initkit.NewConn(initCtlFD)
	if err != nil {
		fmt.Fprintf(os.Stderr, "moat: gvisor init: %v\n", err)
		return boundary.ExitRefused
	}
	send := func(m msg, fds ...int) { c.Send(m, fds...) }
	fail := func(err error) int {
		send(msg{Op: "error", Error: err.Error()})
		return boundary.ExitRefused
	}
	m, _, err := recvMsg(c)
	if err != nil || m.Config == nil {
		return fail(fmt.Errorf("no config: %v", err))
	}
	cfg := *m.Config
	supervisorTimeout := time.Duration(cfg.SupervisorTimeoutMS) * time.Millisecond
	if supervisorTimeout <= 0 {
		return fail(errors.New("BUG: config without a supervisor timeout"))
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fail(fmt.Errorf("making / private: %w", err))
	}
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fail(fmt.Errorf("mounting /proc: %w", err))
	}
	if err := stageGrants(&cfg); err != nil {
		return fail(err)
	}
	if err := initkit.LoopbackUp(); err != nil {
		return fail(err)
	}
	lfd, port, err := initkit.BrokerListener()
	if err != nil {
		return fail(fmt.Errorf("broker listener: %w", err))
	}
	fds, egressPort := []int{lfd}, 0
	if cfg.Egress {
		efd, eport, err := initkit.BrokerListener()
		if err != nil {
			return fail(fmt.Errorf("egress listener: %w", err))
		}
		fds, egressPort = append(fds, efd), eport
	}
	send(msg{Op: "listener", Port: port, EgressPort: egressPort}, fds...)
	for _, fd := range fds {
		unix.Close(fd)
	}

	runsc := func(args ...string) *exec.Cmd {
		a := []string{"--root", cfg.Root, "--network=host"}
		if d := os.Getenv("MOAT_RUNSC_DEBUG"); d != "" {
			a = append(a, "--debug", "--debug-log="+d+"/")
		}
		a = append(a, args...)
		cmd := exec.Command(cfg.Runsc, a...)
		cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
		cmd.Stderr = os.Stderr
		return cmd
	}
	pidFile := filepath.Join(filepath.Dir(cfg.Bundle), "sandbox.pid")
	// The pause's channel (pause_linux.go): its end is the container
	// init's fd pauseCtlFD, donated by runsc to the sentry.
	pfds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fail(fmt.Errorf("pause channel: %w", err))
	}
	pauseEnd := os.NewFile(uintptr(pfds[1]), "pause-channel")
	pc, err := initkit.NewConn(pfds[0])
	if err != nil {
		pauseEnd.Close()
		return fail(fmt.Errorf("pause channel: %w", err))
	}
	run := runsc("run", "--bundle", cfg.Bundle, "--detach", "--pid-file", pidFile,
		fmt.Sprintf("--pass-fd=%d:%d", 3, pauseCtlFD), cfg.ID)
	run.ExtraFiles = []*os.File{pauseEnd} // fd 3 of runsc run
	// The container's own stdio (the pause process) goes to a log beside
	// the bundle; runsc's errors are read back from it on failure.
	logPath := filepath.Join(filepath.Dir(cfg.Bundle), "runsc-run.log")
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fail(err)
	}
	run.Stdout, run.Stderr = logf, logf
	err = run.Run()
	logf.Close()
	pauseEnd.Close()
	if err != nil {
		out, _ := os.ReadFile(logPath)
		return fail(fmt.Errorf("runsc run: %v: %s", err, out))
	}
	b, _ := os.ReadFile(pidFile)
	pid, _ := strconv.Atoi(string(trimSpace(b)))
	send(msg{Op: "ready", PID: pid})

	var pmu sync.Mutex
	procs := map[int]*exec.Cmd{}
	// fast: the processes the pause started (by id), with their pids
	// inside the sentry (0 until "started").
	fast := map[int]int{}
	go func() {
		// What the pause sends is taken for what it says only for the
		// ids asked of it; it cannot send descriptors (the sentry
		// refuses them towards the host), and any it did are closed.
		for {
			var pm msg
			files, err := pc.Recv(&pm)
			initkit.CloseFiles(files)
			if errors.Is(err, initkit.ErrClosed) {
				// The container's init is gone, and the sandbox with it.
				fmt.Fprintln(os.Stderr, "moat: gvisor init: the container's pause ended: ending the sandbox")
				os.Exit(0)
			}
			if err != nil {
				continue
			}
			pmu.Lock()
			_, ok := fast[pm.ID]
			switch {
			case !ok:
			case pm.Op == "started":
				fast[pm.ID] = max(pm.PID, 0)
				send(msg{Op: "started", ID: pm.ID})
			case pm.Op == "error":
				delete(fast, pm.ID)
				send(msg{Op: "error", ID: pm.ID, Error: pm.Error})
			case pm.Op == "exited":
				delete(fast, pm.ID)
				send(msg{Op: "exited", ID: pm.ID, Code: pm.Code})
			}
			pmu.Unlock()
		}
	}()
	// Terminating is the init's own exit: it is pid 1 of the PID namespace
	// that holds runsc, its gofer, its sandbox and every exec, so the
	// kernel kills them all. (`runsc delete` here waits seconds for a
	// sandbox that is about to die anyway.)
	terminate := func() {}
	for {
		if err := c.ArmHeartbeat(supervisorTimeout); err != nil {
			terminate()
			return 0
		}
		m, files, err := recvMsg(c)
		if err != nil {
			if initkit.SupervisorLost(err) {
				fmt.Fprintf(os.Stderr, "moat: gvisor init: no heartbeat of the supervisor for %s: ending the sandbox\n", supervisorTimeout)
			}
			terminate()
			return 0
		}
		switch m.Op {
		case initkit.HeartbeatOp:
			initkit.CloseFiles(files)
		case "exec":
			if m.Process == nil || len(files) != 3 {
				send(msg{Op: "error", ID: m.ID, Error: "exec needs a process and three stdio fds"})
				initkit.CloseFiles(files)
				continue
			}
			if !m.Process.Terminal && !isTerminal(files[0]) {
				// Started by the pause inside the sentry: no runsc exec.
				// (A terminal goes through runsc exec: the sentry imports
				// a pty received over the channel as a plain file.)
				pmu.Lock()
				fast[m.ID] = 0
				pmu.Unlock()
				if err := pc.Send(msg{Op: "exec", ID: m.ID, Process: m.Process}, fileFDs(files)...); err != nil {
					pmu.Lock()
					delete(fast, m.ID)
					pmu.Unlock()
					send(msg{Op: "error", ID: m.ID, Error: "the container's pause: " + err.Error()})
				}
				initkit.CloseFiles(files)
				continue
			}
			pf := filepath.Join(filepath.Dir(cfg.Bundle), fmt.Sprintf("process-%d.json", m.ID))
			pb, _ := json.Marshal(m.Process)
			if err := os.WriteFile(pf, pb, 0o600); err != nil {
				send(msg{Op: "error", ID: m.ID, Error: err.Error()})
				initkit.CloseFiles(files)
				continue
			}
			cmd := runsc("exec", "--process", pf, "--internal-pid-file", ipidFile(cfg, m.ID), cfg.ID)
			cmd.Stdin, cmd.Stdout, cmd.Stderr = files[0], files[1], files[2]
			if m.Process.Terminal {
				// runsc exec makes its controlling terminal (the pty
				// moat relays) the process's console.
				cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
			}
			if err := cmd.Start(); err != nil {
				send(msg{Op: "error", ID: m.ID, Error: err.Error()})
				initkit.CloseFiles(files)
				continue
			}
			initkit.CloseFiles(files)
			pmu.Lock()
			procs[m.ID] = cmd
			pmu.Unlock()
			send(msg{Op: "started", ID: m.ID, PID: cmd.Process.Pid})
			go func(id int, cmd *exec.Cmd, pf string) {
				cmd.Wait()
				os.Remove(pf)
				code := cmd.ProcessState.ExitCode()
				if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
					code = 128 + int(ws.Signal())
				}
				pmu.Lock()
				delete(procs, id)
				live := map[int]bool{}
				for other := range procs {
					if pid := innerPID(cfg, other); pid > 0 {
						live[pid] = true
					}
				}
				for _, pid := range fast {
					if pid > 0 {
						live[pid] = true
					}
				}
				pmu.Unlock()
				// Reported exited only once what it started is gone.
				killLeftovers(runsc, cfg.ID, innerPID(cfg, id), live)
				os.Remove(ipidFile(cfg, id))
				send(msg{Op: "exited", ID: id, Code: code})
			}(m.ID, cmd, pf)
		case "signal":
			pmu.Lock()
			cmd := procs[m.ID]
			_, isFast := fast[m.ID]
			pmu.Unlock()
			if isFast {
				pc.Send(msg{Op: "signal", ID: m.ID, Signal: m.Signal})
				continue
			}
			if cmd == nil {
				continue
			}
			// To the process inside the sentry (runsc exec itself would
			// die of it, not pass it on); runsc exec only while the
			// inner pid is not known yet.
			if pid := innerPID(cfg, m.ID); pid > 0 {
				if runsc("kill", "--pid", strconv.Itoa(pid), cfg.ID, strconv.Itoa(m.Signal)).Run() == nil {
					continue
				}
			}
			cmd.Process.Signal(syscall.Signal(m.Signal))
		case "terminate":
			terminate()
			send(msg{Op: "terminated"})
			return 0
		}
	}
}

// fileFDs are the descriptors of files.
func fileFDs(files []*os.File) []int {
	fds := make([]int, len(files))
	for i, f := range files {
		fds[i] = int(f.Fd())
	}
	return fds
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == ' ') {
		b = b[:len(b)-1]
	}
	return b
}

// stageGrants opens each planned grant in this mount namespace without
// following symlinks, checks it on that descriptor (grants.Mount.Open),
// clones the tree from the descriptor and attaches it at its staging
// point, a directory only root can reach.
func stageGrants(cfg *initConfig) error {
	if cfg.WriteOwner <= 0 {
		return fmt.Errorf("BUG: read_write grant owner %d", cfg.WriteOwner)
	}
	for i, m := range cfg.Plan.Mounts {
		pfd, err := m.Open(grants.Checks{WriteOwner: cfg.WriteOwner})
		if err != nil {
			return err
		}
		fd, err := unix.OpenTree(pfd, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE|unix.AT_EMPTY_PATH)
		unix.Close(pfd)
		if err != nil {
			return fmt.Errorf("cloning grant %s: %w", m.Path, err)
		}
		attr := uint64(unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV)
		if !m.Write {
			attr |= unix.MOUNT_ATTR_RDONLY
		}
		to := stagedGrant(cfg.GrantsDir, i)
		if m.Dir {
			err = os.Mkdir(to, 0o700)
		} else {
			err = os.WriteFile(to, nil, 0o600)
		}
		if err == nil {
			err = unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &unix.MountAttr{Attr_set: attr, Propagation: unix.MS_PRIVATE})
		}
		if err == nil {
			err = unix.MoveMount(fd, "", unix.AT_FDCWD, to, unix.MOVE_MOUNT_F_EMPTY_PATH)
		}
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("staging grant %s: %w", m.Path, err)
		}
	}
	return nil
}

// ipidFile is where runsc exec writes process id's pid inside the sentry.
func ipidFile(cfg initConfig, id int) string {
	return filepath.Join(filepath.Dir(cfg.Bundle), fmt.Sprintf("process-%d.ipid", id))
}

// innerPID is process id's pid inside the sentry, or 0 when not known.
func innerPID(cfg initConfig, id int) int {
	b, err := os.ReadFile(ipidFile(cfg, id))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(string(trimSpace(b)))
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}

// leftoverRounds bounds killLeftovers (a process may fork between a look
// and a kill).
const leftoverRounds = 100

// killLeftovers kills what a finished exec left running in the sentry:
// every process of its process group (runsc exec makes the process a
// group leader, pgid its pid), and every orphan (reparented to the
// container's init, pid 1) that belongs to no live exec's group. gVisor
// cannot tell which exec a setsid'd orphan came from: such a process is
// killed when any exec of the sandbox ends.
func killLeftovers(runsc func(...string) *exec.Cmd, id string, pgid int, live map[int]bool) {
	for range leftoverRounds {
		ps := runsc("ps", id)
		ps.Stderr = nil
		out, err := ps.Output()
		if err != nil {
			return
		}
		var victims []string
		for _, line := range strings.Split(string(out), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) < 4 {
				continue
			}
			pid, e1 := strconv.Atoi(f[1])
			ppid, e2 := strconv.Atoi(f[2])
			pg, e3 := strconv.Atoi(f[3])
			if e1 != nil || e2 != nil || e3 != nil || pid == 1 || live[pid] || live[pg] {
				continue
			}
			if (pgid > 0 && pg == pgid) || ppid == 1 {
				victims = append(victims, f[1])
			}
		}
		if len(victims) == 0 {
			return
		}
		for _, v := range victims {
			runsc("kill", "--pid", v, id, "9").Run()
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// isTerminal reports whether f is a terminal (TCGETS succeeds).
func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
