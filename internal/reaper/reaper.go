// Package reaper removes what a run leaves on the host (its staging
// directory, its cgroups) when moat dies without cleaning up, however it
// dies: SIGKILL included.
//
// Start re-runs the moat binary as the hidden helper "__moat-reaper", in a
// session of its own and outside every sandbox, with the read end of a
// pipe whose write end only moat holds (close-on-exec, so no child of moat
// keeps it open). moat writes one line per thing it made and one when it
// removed that thing itself:
//
//	own <tab> tree|dir|file <tab> <absolute path>
//	done <tab> <absolute path>
//	wait <tab> <pid>
//
// wait names a sandbox's init (the init of its PID namespace, moat's
// child): the reaper opens a pidfd of it at once, and after moat is gone
// it waits (bounded) for that init to exit before removing anything. The
// kernel lets a PID namespace's init finish exiting only once every other
// process of the namespace is gone, so nothing of the sandbox can still
// make a file after that (a measurement helper did, right after a first
// removal: found by the crash trials).
//
// End of file on the pipe means moat is gone (the kernel closes the write
// end whatever the cause of death). The reaper then removes what is still
// owned: a tree with os.RemoveAll (which never follows symlinks), a
// directory (a cgroup) with rmdir, retried while its last tasks exit, a
// file (the measurement's sockets and probe files in a grant, a directory
// a sandbox can write) only if it is a socket or regular file, through its
// parent opened without following any symlink. The
// sandbox's own processes die with moat (Pdeathsig, PID namespace), so a
// cgroup empties within moments.
//
// A helper also removes, at its start, the moat-* cgroups that earlier
// runs left when moat and its reaper were both SIGKILLed: only one that
// no live run holds (internal/cgroup.Sweep: old enough, unlocked, empty,
// and the kernel agrees to rmdir it).
package reaper

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/moat-sandbox/moat/internal/reexec"
)

// Helper is the hidden helper of the moat binary that runs Main;
// internal/cli/hidden.go lists it.
const Helper = reexec.Prefix + "reaper"

// Limits of the helper.
const (
	maxLine    = 4096 // one record
	maxEntries = 1024 // paths owned at once
	rmdirTries = 250  // × rmdirPause: how long a cgroup may take to empty
	rmdirPause = 20 * time.Millisecond
)

// Reaper is moat's end of the pipe. The zero value and a nil *Reaper do
// nothing, so that callers without one (tests, other tools) need no
// special case.
//
// A helper that dies while moat runs is started again and told again what
// is still owned: a signal to moat's process group (^C typed at moat's
// terminal during its start) reaches a new helper in the moment between
// its fork and its setsid, and killed it (found by the ^C loop under a
// pty: moat then failed with a broken pipe and exit 125).
type Reaper struct {
	mu       sync.Mutex
	w        *os.File
	exe      string
	pid      int      // the current helper's
	log      []string // records still in force, replayed to a new helper
	restarts int
	err      error // why there is no helper, once restarts ran out
}

// maxRestarts bounds how often a dead helper is replaced.
const maxRestarts = 5

// Start starts the reaper helper from exe (the moat binary).
func Start(exe string) (*Reaper, error) {
	rp := &Reaper{exe: exe}
	rp.mu.Lock()
	defer rp.mu.Unlock()
	if err := rp.spawn(); err != nil {
		return nil, err
	}
	return rp, nil
}

// spawn starts a helper and makes it the current one; rp.mu is held.
func (rp *Reaper) spawn() error {
	r, w, err := os.Pipe() // both close-on-exec
	if err != nil {
		return err
	}
	defer r.Close()
	cmd := &exec.Cmd{
		Path:        rp.exe,
		Args:        []string{"moat", Helper},
		Env:         []string{},
		Dir:         "/",
		ExtraFiles:  []*os.File{r}, // fd 3
		SysProcAttr: &syscall.SysProcAttr{Setsid: true},
	}
	if err := cmd.Start(); err != nil {
		w.Close()
		return fmt.Errorf("starting the reaper: %w", err)
	}
	rp.w, rp.pid = w, cmd.Process.Pid
	go rp.watch(cmd, w)
	return nil
}

// watch waits for a helper; one that ends while it is still the current
// one (moat has not closed its pipe) is replaced.
func (rp *Reaper) watch(cmd *exec.Cmd, w *os.File) {
	cmd.Wait()
	rp.mu.Lock()
	defer rp.mu.Unlock()
	if rp.w == w {
		rp.restart()
	}
}

// restart replaces the current helper with a new one, told every record
// still in force; rp.mu is held.
func (rp *Reaper) restart() error {
	if rp.w != nil {
		rp.w.Close()
		rp.w = nil
	}
	if rp.restarts >= maxRestarts {
		rp.err = fmt.Errorf("reaper: the helper died %d times", rp.restarts+1)
		return rp.err
	}
	rp.restarts++
	if err := rp.spawn(); err != nil {
		rp.err = err
		return err
	}
	for _, line := range rp.log {
		if _, err := io.WriteString(rp.w, line+"\n"); err != nil {
			return rp.restart()
		}
	}
	return nil
}

// Own says that path (a whole tree when tree is true, else one empty
// directory) is to be removed if moat dies before Done(path).
func (rp *Reaper) Own(path string, tree bool) error {
	kind := "dir"
	if tree {
		kind = "tree"
	}
	return rp.send("own\t" + kind + "\t" + path)
}

// OwnFile says that the file (or socket) at path is to be unlinked if moat
// dies before Done(path).
func (rp *Reaper) OwnFile(path string) error { return rp.send("own\tfile\t" + path) }

// WaitFor says that pid (a child of moat: a sandbox's PID-namespace init)
// must be gone before anything is removed.
func (rp *Reaper) WaitFor(pid int) error { return rp.send("wait\t" + strconv.Itoa(pid)) }

// Done says that moat removed path itself.
func (rp *Reaper) Done(path string) error { return rp.send("done\t" + path) }

// Close ends the conversation: the reaper removes whatever is still owned
// (nothing, after a clean exit) and exits.
func (rp *Reaper) Close() error {
	if rp == nil || rp.w == nil {
		return nil
	}
	rp.mu.Lock()
	defer rp.mu.Unlock()
	err := rp.w.Close()
	rp.w = nil
	return err
}

func (rp *Reaper) send(line string) error {
	if rp == nil {
		return nil
	}
	if strings.ContainsAny(line, "\n") || len(line) >= maxLine {
		return fmt.Errorf("reaper: bad record %q", line)
	}
	rp.mu.Lock()
	defer rp.mu.Unlock()
	if rp.w == nil {
		if rp.err != nil {
			return rp.err
		}
		return errors.New("reaper: closed")
	}
	rp.remember(line)
	if _, err := io.WriteString(rp.w, line+"\n"); err != nil {
		// The helper is gone and watch has not noticed yet: a new one
		// is told everything, this record included.
		return rp.restart()
	}
	return nil
}

// remember keeps the records a new helper must be told: an own record
// until its done, and wait records.
func (rp *Reaper) remember(line string) {
	if path, ok := strings.CutPrefix(line, "done\t"); ok {
		for i := len(rp.log) - 1; i >= 0; i-- {
			if f := strings.Split(rp.log[i], "\t"); len(f) == 3 && f[0] == "own" && f[2] == path {
				rp.log = append(rp.log[:i], rp.log[i+1:]...)
				return
			}
		}
		return
	}
	if len(rp.log) < 2*maxEntries {
		rp.log = append(rp.log, line)
	}
}

type entry struct {
	path string
	tree bool
	file bool
}

// waitTimeout bounds how long the reaper waits for a sandbox's init.
const waitTimeout = 20 * time.Second

// Main reads records until moat is gone, then removes what is owned.
// Meanwhile it sweeps the cgroups of runs that died with their reaper
// (startSweep), and waits for that sweep (bounded) before it exits.
func Main([]string) int {
	sweepDone := startSweep()
	f := os.NewFile(3, "reaper")
	var pidfds []int
	owned, err := read(f, func(pid int) {
		if fd, err := pidfdOpen(pid); err == nil {
			pidfds = append(pidfds, fd)
		}
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "moat: reaper: %v\n", err)
	}
	waitExited(pidfds, waitTimeout)
	code := remove(owned)
	sweepDone(sweepWait)
	return code
}

// read collects owned entries until end of file; wait records go to
// onWait.
func read(r io.Reader, onWait func(pid int)) ([]entry, error) {
	var owned []entry
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, maxLine), maxLine)
	var bad error
	for sc.Scan() {
		f := strings.Split(sc.Text(), "\t")
		switch {
		case len(f) == 3 && f[0] == "own" && (f[1] == "tree" || f[1] == "dir" || f[1] == "file") && clean(f[2]):
			if len(owned) < maxEntries {
				owned = append(owned, entry{path: f[2], tree: f[1] == "tree", file: f[1] == "file"})
			}
		case len(f) == 2 && f[0] == "wait":
			if pid, err := strconv.Atoi(f[1]); err == nil && pid > 1 && onWait != nil {
				onWait(pid)
			}
		case len(f) == 2 && f[0] == "done":
			for i, e := range owned {
				if e.path == f[1] {
					owned = append(owned[:i], owned[i+1:]...)
					break
				}
			}
		default:
			if bad == nil {
				bad = fmt.Errorf("ignoring a bad record %q", sc.Text())
			}
		}
	}
	// Keep reading to EOF even after a scanner error, so that nothing is
	// removed while moat still runs.
	if err := sc.Err(); err != nil {
		io.Copy(io.Discard, r)
		if bad == nil {
			bad = err
		}
	}
	return owned, bad
}

func clean(p string) bool {
	return filepath.IsAbs(p) && filepath.Clean(p) == p && p != "/"
}

// remove removes the owned entries, newest first (a cgroup before the
// directory that holds it); it returns 0 when all are gone.
func remove(owned []entry) int {
	code := 0
	for i := len(owned) - 1; i >= 0; i-- {
		e := owned[i]
		var err error
		switch {
		case e.tree:
			err = os.RemoveAll(e.path)
		case e.file:
			err = unlinkFile(e.path)
		default:
			for range rmdirTries {
				if err = syscall.Rmdir(e.path); err == nil || errors.Is(err, os.ErrNotExist) {
					err = nil
					break
				}
				time.Sleep(rmdirPause)
			}
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "moat: reaper: removing %s: %v\n", e.path, err)
			code = 1
		}
	}
	return code
}
