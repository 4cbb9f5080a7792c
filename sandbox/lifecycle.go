package sandbox

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/internal/term"
	"github.com/moat-sandbox/moat/policy"
)

// Limits of the control protocol.
const (
	maxControlMsg = 1 << 20
	createTimeout = 2 * time.Minute
	deleteTimeout = 15 * time.Second
)

// CreateOptions configure `moat sandbox create`.
type CreateOptions struct {
	Name       string
	PolicyPath string // validated by the caller; the supervisor loads it again
	Backend    string
	// AuditDir, when set, replaces the policy's audit.dir (as moat run
	// --audit-dir does); it must be absolute.
	AuditDir string
	// Parent, when set, names the sandbox whose budget this one draws
	// on (its requests and output tokens are charged to the parent and
	// every ancestor too); MaxTokens caps the sandbox's own output
	// tokens (0: no cap of its own). See budget.go.
	Parent    string
	MaxTokens int64
}

// Create starts a per-sandbox supervisor that outlives this process and
// returns once the sandbox is Ready, or failed with the reason.
func Create(ctx context.Context, o CreateOptions) (*State, error) {
	if err := ValidateName(o.Name); err != nil {
		return nil, &RefusedError{Msg: err.Error()}
	}
	pp, err := filepath.Abs(o.PolicyPath)
	if err != nil {
		return nil, err
	}
	st, err := openStore()
	if err != nil {
		return nil, err
	}
	unlock, err := st.lock()
	if err != nil {
		return nil, err
	}
	var ledgerDir string
	if o.Parent != "" {
		if ledgerDir, err = parentLedger(st, o.Parent); err != nil {
			unlock()
			return nil, err
		}
	}
	dir := st.sandboxDir(o.Name)
	if err := os.Mkdir(dir, 0o700); err != nil {
		unlock()
		if errors.Is(err, os.ErrExist) {
			return nil, &RefusedError{Msg: fmt.Sprintf("a sandbox named %q already exists (delete it first: moat sandbox delete %s)", o.Name, o.Name)}
		}
		return nil, err
	}
	unlock()

	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	logf, err := os.OpenFile(filepath.Join(dir, logFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, append([]string{SupervisorHelper, o.Name, pp, o.Backend, st.dir, o.AuditDir}, budgetArgs(ledgerDir, o.Parent, o.MaxTokens)...)...)
	cmd.Stdin = nil
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.ExtraFiles = []*os.File{pw}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		pw.Close()
		pr.Close()
		os.RemoveAll(dir)
		return nil, fmt.Errorf("starting supervisor: %w", err)
	}
	pw.Close()
	go cmd.Wait() // reap if it exits while we wait; it is detached otherwise
	type answer struct {
		line string
		err  error
	}
	ch := make(chan answer, 1)
	go func() {
		b, err := io.ReadAll(io.LimitReader(pr, 4096))
		ch <- answer{strings.TrimSpace(string(b)), err}
	}()
	var a answer
	select {
	case a = <-ch:
	case <-time.After(createTimeout):
		a = answer{err: fmt.Errorf("supervisor did not report within %v", createTimeout)}
	case <-ctx.Done():
		a = answer{err: ctx.Err()}
	}
	pr.Close()
	state, rerr := st.read(o.Name)
	if a.err != nil {
		return state, a.err
	}
	if a.line != "ready" {
		msg := strings.TrimPrefix(a.line, "error: ")
		if msg == "" {
			msg = "the supervisor exited without reporting (see " + filepath.Join(dir, logFile) + ")"
		}
		return state, &RefusedError{Msg: msg}
	}
	return state, rerr
}

// Get returns a sandbox's state, with live fields from its supervisor. A
// sandbox whose supervisor is gone is reported in phase Error.
func Get(name string) (*State, error) { return get(name, true) }

// get is Get; without ask it does not ask the supervisor for its
// processes and allowance (Exec asks it for the process instead, and a
// supervisor that does not answer is refused there alike).
func get(name string, ask bool) (*State, error) {
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	st, err := openStore()
	if err != nil {
		return nil, err
	}
	s, err := st.read(name)
	if err != nil {
		return nil, err
	}
	switch s.Phase {
	case boundary.PhaseReady, boundary.PhaseRunning, boundary.PhaseProvisioning, boundary.PhaseConfirming:
		if s.SupervisorPID != 0 && !s.alive() {
			s.Phase = boundary.PhaseError
			s.Error = fmt.Sprintf("the supervisor (pid %d) is gone; its sandbox died with it (moat sandbox delete %s cleans up)", s.SupervisorPID, name)
			return s, nil
		}
	}
	if ask && (s.Phase == boundary.PhaseReady || s.Phase == boundary.PhaseRunning) {
		var live statusReply
		if err := control(st.sandboxDir(name), controlRequest{Op: "status"}, nil, func(l []byte) bool {
			json.Unmarshal(l, &live)
			return false
		}); err == nil {
			s.AllowanceUsed, s.Processes = live.AllowanceUsed, live.Processes
			if len(live.Processes) > 0 {
				s.Phase = boundary.PhaseRunning
			}
		} else {
			s.Phase = boundary.PhaseError
			s.Error = fmt.Sprintf("the supervisor does not answer: %v", err)
		}
	}
	return s, nil
}

// List returns every sandbox's state, sorted by name.
func List() ([]*State, error) {
	st, err := openStore()
	if err != nil {
		return nil, err
	}
	ents, err := os.ReadDir(filepath.Join(st.dir, "sandboxes"))
	if err != nil {
		return nil, err
	}
	var out []*State
	for _, e := range ents {
		if !e.IsDir() || ValidateName(e.Name()) != nil {
			continue
		}
		s, err := Get(e.Name())
		if err != nil {
			continue // deleted meanwhile
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Exec runs argv in the sandbox and returns its exit code. A command that
// cannot be started returns 127 (not found) or 126 (not executable) with
// its error, as Run does; moat's own failure returns ExitRefused. With tty, or
// when stdin or stdout is a terminal, the process gets a pty of its own
// that this client allocates and relays (internal/term), so that the
// caller's terminal never enters the sandbox; otherwise it gets the
// caller's stdio, passed to the supervisor as file descriptors. SIGINT,
// SIGTERM and SIGHUP to the client are forwarded to the process.
func Exec(ctx context.Context, name string, argv []string, tty bool, stdin, stdout, stderr *os.File) (code int, err error) {
	if len(argv) == 0 {
		return ExitRefused, &RefusedError{Msg: "no command given (usage: moat sandbox exec NAME -- CMD [ARG…])"}
	}
	// The state file and the supervisor's pid only: the exec request
	// below is the round trip to the supervisor (one less per command).
	s, err := get(name, false)
	if err != nil {
		return ExitRefused, err
	}
	if s.Phase != boundary.PhaseReady && s.Phase != boundary.PhaseRunning {
		why := s.Error
		if why == "" {
			why = "phase " + string(s.Phase)
		}
		return ExitRefused, &RefusedError{Msg: fmt.Sprintf("sandbox %s is not ready: %s", name, why)}
	}
	st, err := openStore()
	if err != nil {
		return ExitRefused, err
	}
	dir := st.sandboxDir(name)
	// Caught before a terminal goes raw; forwarded once the process runs.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	files := []*os.File{stdin, stdout, stderr}
	var relay *term.Relay
	if tty || term.IsTerminal(stdin) || term.IsTerminal(stdout) {
		if relay, err = term.Start(stdin, stdout); err != nil {
			return ExitRefused, fmt.Errorf("terminal: %w", err)
		}
		defer func() {
			if rerr := relay.Stop(); rerr != nil && err == nil {
				fmt.Fprintf(stderr, "moat: terminal: %v\n", rerr)
			}
		}()
		sl := relay.Slave()
		files, tty = []*os.File{sl, sl, sl}, true
	}
	var (
		mu      sync.Mutex
		started string
		pending []os.Signal
	)
	forward := func(sig os.Signal) {
		mu.Lock()
		id := started
		if id == "" {
			pending = append(pending, sig)
		}
		mu.Unlock()
		if id != "" {
			control(dir, controlRequest{Op: "signal", ID: id, Signal: int(sig.(syscall.Signal))}, nil, func([]byte) bool { return false })
		}
	}
	if relay != nil {
		relay.SetOnSignal(forward)
	}
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case sig := <-sigs:
				forward(sig)
			case <-stop:
				return
			}
		}
	}()
	code = ExitRefused
	var failure string
	failCode := ExitRefused
	err = control(dir, controlRequest{Op: "exec", Argv: argv, TTY: tty},
		files, func(l []byte) bool {
			var r execReply
			if json.Unmarshal(l, &r) != nil {
				return true
			}
			if r.Error != "" {
				failure = r.Error
				if r.Code == ExitNotFound || r.Code == ExitCannotExec {
					failCode = r.Code
				}
				return false
			}
			if r.Started != "" {
				if relay != nil {
					relay.CloseSlave() // the supervisor holds its own copies
				}
				mu.Lock()
				started = r.Started
				early := pending
				pending = nil
				mu.Unlock()
				for _, sig := range early {
					go forward(sig)
				}
			}
			if r.Exited {
				code = r.Code
				return false
			}
			return true
		})
	if relay != nil {
		relay.Stop() // the last output, and the caller's terminal back
	}
	var dial *net.OpError
	if errors.As(err, &dial) && dial.Op == "dial" {
		return ExitRefused, &RefusedError{Msg: fmt.Sprintf("sandbox %s is not ready: the supervisor does not answer: %v", name, err)}
	}
	if err != nil {
		return ExitRefused, err
	}
	if failure != "" {
		if failCode != ExitRefused {
			return failCode, &boundary.StartError{Code: failCode, Msg: failure}
		}
		return ExitRefused, &RefusedError{Msg: failure}
	}
	return code, nil
}

// Delete terminates a sandbox's processes, has its supervisor write
// run.terminated, and removes its state. Deleting an absent sandbox is not
// an error (found reports whether there was one).
func Delete(name string) (found bool, err error) {
	if err := ValidateName(name); err != nil {
		return false, err
	}
	st, err := openStore()
	if err != nil {
		return false, err
	}
	unlock, err := st.lock()
	if err != nil {
		return false, err
	}
	defer unlock()
	dir := st.sandboxDir(name)
	s, err := st.read(name)
	if errors.Is(err, ErrNotFound) {
		return false, nil
	}
	if err == nil {
		if kids := liveChildren(st, s); len(kids) > 0 {
			return true, &RefusedError{Msg: fmt.Sprintf("sandbox %s has running children drawing on its budget (%s): delete them first", name, strings.Join(kids, ", "))}
		}
	}
	if err == nil && s.alive() {
		control(dir, controlRequest{Op: "delete"}, nil, func([]byte) bool { return false })
		deadline := time.Now().Add(deleteTimeout)
		for s.alive() && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if s.alive() {
			syscall.Kill(s.SupervisorPID, syscall.SIGKILL)
			for i := 0; i < 100 && s.alive(); i++ {
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
	if err == nil && s.Staging != "" && strings.HasPrefix(filepath.Base(s.Staging), "moat-") {
		os.RemoveAll(s.Staging)
	}
	return true, os.RemoveAll(dir)
}

type controlRequest struct {
	Op     string   `json:"op"` // status | exec | signal | delete | reload-lockfiles
	Argv   []string `json:"argv,omitempty"`
	TTY    bool     `json:"tty,omitempty"`
	ID     string   `json:"id,omitempty"`     // signal: the process, as exec's reply named it
	Signal int      `json:"signal,omitempty"` // signal: its number
}

type statusReply struct {
	AllowanceUsed int            `json:"allowance_used"`
	Processes     map[string]int `json:"processes"`
}

type execReply struct {
	Started string `json:"started,omitempty"`
	Exited  bool   `json:"exited,omitempty"`
	// Code is the exit code once Exited; with Error, 127 or 126 when the
	// command could not be started (not found, not executable).
	Code  int    `json:"code"`
	Error string `json:"error,omitempty"`
}

// control sends one request (with fds) to a supervisor and feeds each reply
// line to onLine until it returns false or the connection ends.
func control(dir string, req controlRequest, files []*os.File, onLine func([]byte) bool) error {
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: filepath.Join(dir, controlSock), Net: "unix"})
	if err != nil {
		return fmt.Errorf("control socket: %w", err)
	}
	defer c.Close()
	b, _ := json.Marshal(req)
	b = append(b, '\n')
	if len(b) > maxControlMsg {
		// The supervisor would stop reading and refuse it; said here
		// before anything is sent.
		return &RefusedError{Msg: errControlTooLarge.Error()}
	}
	var oob []byte
	if len(files) > 0 {
		fds := make([]int, len(files))
		for i, f := range files {
			fds[i] = int(f.Fd())
		}
		oob = syscall.UnixRights(fds...)
	}
	if err := writeControl(c, b, oob); err != nil {
		return fmt.Errorf("control request: %w", err)
	}
	sc := bufio.NewScanner(c)
	sc.Buffer(make([]byte, 4096), maxControlMsg)
	for sc.Scan() {
		if !onLine(sc.Bytes()) {
			return nil
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return nil
}

// writeControl sends one control request b with the descriptors in oob.
// One sendmsg on a stream socket may take only part of a long request
// (a long argv): the descriptors go with its first bytes, the rest
// follows.
func writeControl(c *net.UnixConn, b, oob []byte) error {
	n, _, err := c.WriteMsgUnix(b, oob, nil)
	if err == nil && n < len(b) {
		_, err = c.Write(b[n:])
	}
	return err
}

// loadPolicyFile is policy.Load, kept here so that the supervisor and the
// CLI agree on it.
func loadPolicyFile(path string) (*policy.Policy, error) { return policy.Load(path) }
