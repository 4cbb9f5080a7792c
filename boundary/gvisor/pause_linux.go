package gvisor

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/boundary/internal/initkit"
)

// pauseCtlFD is the pause's end of its channel to the init (runsc run
// --pass-fd): the host socket over which the init asks the pause to start
// processes, instead of a `runsc exec` for each.
const pauseCtlFD = 3

// The channel between the init (host) and the pause (in the sentry):
//
//   - init → pause: "exec" (ID, Process; stdin, stdout, stderr attached)
//     and "signal" (ID, Signal).
//   - pause → init: "started" (ID, PID inside the sentry), "exited" (ID,
//     Code, once what it left in its process group and every orphan of no
//     live group is gone) and "error" (ID).
//
// What the pause can start is bounded by what it is, not by what it is
// asked: the container's process is `stage -- moat pause`, and the stage
// runs the pause in its own process, on the locked thread it installed
// moat's seccomp filter on (one Go start-up inside the sentry instead of
// two). The pause forks every process from that thread, which checks
// that it is in filter mode before each fork, so each inherits the
// filter (a filter cannot be removed; the pause's other threads, moat's
// own code, have none, as the stage's never had); it has the
// workload's uid and gid, no capability and noNewPrivileges, and its
// children inherit the same. It accepts only a process that names that
// uid and gid, noNewPrivileges, and the stage's argv prefix, and it
// execs the command after the prefix itself (what the stage would do,
// the filter being installed already). The sentry refuses descriptors
// sent towards the host (transport.HostSender), so the pause can send the
// init nothing but bytes, which the init decodes strictly and matches to
// the ids it asked for.
//
// The workload cannot reach the channel: the descriptor is close-on-exec
// from the pause's first instruction on (runsc passes it without), and
// the pause makes itself non-dumpable before anything else, so that a
// process of the same uid can neither ptrace it nor open its
// /proc/1/fd (TestRootGVisorPauseChannelUnreachable).

// PauseMain is the container's init inside the sentry: it starts the
// processes the init asks for over its channel, reports their exits, and
// reaps every orphan.
func PauseMain([]string) int {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		fmt.Fprintf(os.Stderr, "moat: gvisor pause: not dumpable: %v\n", err)
		return boundary.ExitRefused
	}
	unix.CloseOnExec(pauseCtlFD)
	c, err := initkit.NewConn(pauseCtlFD)
	if err != nil {
		fmt.Fprintf(os.Stderr, "moat: gvisor pause: %v\n", err)
		return boundary.ExitRefused
	}
	p := &pause{c: c, byPID: map[int]int{}, byID: map[int]int{}}
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM, syscall.SIGINT)
	go func() { <-term; os.Exit(0) }()
	// As the container's init it is the parent of every orphan: it reaps
	// them, so that a killed leftover does not stay a zombie.
	chld := make(chan os.Signal, 16)
	signal.Notify(chld, syscall.SIGCHLD)
	go p.reap(chld)
	// The loop, and so every fork, stays on this goroutine's thread: the
	// one the stage installed the filter on (see StageMain).
	runtime.LockOSThread()
	for {
		var m msg
		files, err := c.Recv(&m)
		if errors.Is(err, initkit.ErrClosed) {
			return 0 // the init is gone: so is the sandbox
		}
		if err != nil {
			initkit.CloseFiles(files)
			continue
		}
		switch m.Op {
		case "exec":
			p.exec(m, files)
		case "signal":
			initkit.CloseFiles(files)
			p.mu.Lock()
			if pid := p.byID[m.ID]; pid > 0 && m.Signal > 0 {
				unix.Kill(pid, syscall.Signal(m.Signal))
			}
			p.mu.Unlock()
		default:
			initkit.CloseFiles(files)
		}
	}
}

type pause struct {
	c     *initkit.Conn
	mu    sync.Mutex  // held from fork to "started", so that "exited" follows it
	byPID map[int]int // pid → id of the processes started here, until reaped
	byID  map[int]int // id → pid
}

// exec starts one process for the init; files are its stdin, stdout and
// stderr, closed here once the child has them.
func (p *pause) exec(m msg, files []*os.File) {
	defer initkit.CloseFiles(files)
	argv, err := pauseArgv(m.Process, len(files))
	if err != nil {
		p.c.Send(msg{Op: "error", ID: m.ID, Error: err.Error()})
		return
	}
	env, cwd := m.Process.Env, m.Process.Cwd
	if fi, err := os.Stat(cwd); err != nil || !fi.IsDir() {
		p.c.Send(msg{Op: "error", ID: m.ID, Error: fmt.Sprintf("working directory %s: not a directory inside the sandbox", cwd)})
		return
	}
	// Exit codes as the stage's: 127 not found, 126 cannot execute.
	refuse := func(code int, format string, a ...any) {
		fmt.Fprintf(files[2], format, a...)
		p.c.Send(msg{Op: "started", ID: m.ID})
		p.c.Send(msg{Op: "exited", ID: m.ID, Code: code})
	}
	path := argv[0]
	if !strings.Contains(path, "/") {
		if path = lookPath(path, env); path == "" {
			refuse(boundary.ExitNotFound, "moat: %s: command not found\n", argv[0])
			return
		}
	}
	// The child inherits this thread's filter: refuse to fork from a
	// thread without one (PR_GET_SECCOMP is 2 in filter mode).
	if mode, err := unix.PrctlRetInt(unix.PR_GET_SECCOMP, 0, 0, 0, 0); err != nil || mode != 2 {
		p.c.Send(msg{Op: "error", ID: m.ID, Error: fmt.Sprintf("the pause's thread has no seccomp filter (mode %d, %v)", mode, err)})
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	// Its own process group, as runsc exec gives it (killLeftovers).
	pid, err := syscall.ForkExec(path, argv, &syscall.ProcAttr{
		Dir: cwd, Env: env,
		Files: []uintptr{files[0].Fd(), files[1].Fd(), files[2].Fd()},
		Sys:   &syscall.SysProcAttr{Setpgid: true},
	})
	if err != nil {
		code := boundary.ExitCannotExec
		if errors.Is(err, unix.ENOENT) {
			code = boundary.ExitNotFound
		}
		refuse(code, "moat: cannot execute %s: %v\n", argv[0], err)
		return
	}
	p.byPID[pid], p.byID[m.ID] = m.ID, pid
	p.c.Send(msg{Op: "started", ID: m.ID, PID: pid})
}

// pauseArgv checks a process the init asks for against what the pause is
// (its uid, gid, noNewPrivileges, no capability) and returns the command
// after the stage's prefix.
func pauseArgv(pr *ociProcess, nfiles int) ([]string, error) {
	switch {
	case pr == nil || nfiles != 3:
		return nil, errors.New("exec needs a process and three stdio fds")
	case pr.Terminal:
		return nil, errors.New("the pause starts no process with a terminal (runsc exec does)")
	case pr.User.UID != os.Getuid() || pr.User.GID != os.Getgid():
		return nil, fmt.Errorf("process as %d:%d, the pause runs as %d:%d", pr.User.UID, pr.User.GID, os.Getuid(), os.Getgid())
	case !pr.NoNewPrivileges:
		return nil, errors.New("process without noNewPrivileges")
	case len(pr.Capabilities.Bounding)+len(pr.Capabilities.Effective)+len(pr.Capabilities.Inheritable)+len(pr.Capabilities.Permitted)+len(pr.Capabilities.Ambient) > 0:
		return nil, errors.New("process with capabilities")
	case len(pr.Args) < 4 || !slices.Equal(pr.Args[:3], stagePrefix):
		return nil, errors.New("process not behind the stage")
	}
	return pr.Args[3:], nil
}

// stagePrefix is the argv before every command moat starts in the sentry.
var stagePrefix = []string{moatInside, StageHelper, "--"}

// lookPath finds file in env's PATH as the stage's exec.LookPath would in
// that environment: a regular file with an execute bit, absolute
// directories only.
func lookPath(file string, env []string) string {
	var path string
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		if !filepath.IsAbs(dir) {
			continue
		}
		p := filepath.Join(dir, file)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p
		}
	}
	return ""
}

// reap waits for every child; for one the init started it kills what the
// process left (pauseLeftovers) and then reports its exit.
func (p *pause) reap(chld <-chan os.Signal) {
	for range chld {
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
			p.mu.Lock()
			id, ok := p.byPID[pid]
			if ok {
				delete(p.byPID, pid)
				delete(p.byID, id)
			}
			p.mu.Unlock()
			if !ok {
				continue
			}
			code := ws.ExitStatus()
			if ws.Signaled() {
				code = 128 + int(ws.Signal())
			}
			go func() {
				p.leftovers(pid)
				p.c.Send(msg{Op: "exited", ID: id, Code: code})
			}()
		}
	}
}

// leftovers kills what a finished process left running, as killLeftovers
// does for a `runsc exec`: every process of its group, and every orphan
// (a child of this pause, pid 1) that is in no live group, a live group
// being one of a process started here or by `runsc exec` (whose parent
// inside the sentry is none, ppid 0).
func (p *pause) leftovers(pgid int) {
	for range leftoverRounds {
		procs := sentryProcs()
		live := map[int]bool{}
		p.mu.Lock()
		for pid := range p.byPID {
			live[pid] = true
		}
		p.mu.Unlock()
		for _, pr := range procs {
			if pr.ppid == 0 && pr.pid != 1 {
				live[pr.pid] = true
			}
		}
		var victims []int
		for _, pr := range procs {
			if pr.pid == 1 || pr.zombie || live[pr.pid] || live[pr.pgid] {
				continue
			}
			if pr.pgid == pgid || pr.ppid == 1 {
				victims = append(victims, pr.pid)
			}
		}
		if len(victims) == 0 {
			return
		}
		for _, v := range victims {
			unix.Kill(v, unix.SIGKILL)
		}
		time.Sleep(time.Millisecond)
	}
}

type sentryProc struct {
	pid, ppid, pgid int
	zombie          bool
}

// sentryProcs lists the processes of the sentry's /proc (stat: pid
// (comm) state ppid pgrp …).
func sentryProcs() []sentryProc {
	ents, _ := os.ReadDir("/proc")
	var out []sentryProc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 3 {
			continue
		}
		ppid, e1 := strconv.Atoi(f[1])
		pgid, e2 := strconv.Atoi(f[2])
		if e1 != nil || e2 != nil {
			continue
		}
		out = append(out, sentryProc{pid: pid, ppid: ppid, pgid: pgid, zombie: f[0] == "Z" || f[0] == "X"})
	}
	return out
}
