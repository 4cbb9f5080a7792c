// Package sandbox runs workloads in a confirmed boundary: it opens the
// journal, prepares the backend's sandbox, has moat's own measurement
// confirm it, starts the broker on the sandbox's listener, and only then
// starts the workload. `moat run` is one such run; the lifecycle commands
// (create/get/list/exec/delete) keep a sandbox alive between commands.
package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/boundary/seccomp"
	"github.com/moat-sandbox/moat/internal/exehash"
	"github.com/moat-sandbox/moat/internal/fsutil"
	"github.com/moat-sandbox/moat/internal/runinfo"
	"github.com/moat-sandbox/moat/internal/term"
	"github.com/moat-sandbox/moat/policy"
)

// Exit codes, as docker run uses them (defined in boundary).
const (
	ExitRefused    = boundary.ExitRefused
	ExitCannotExec = boundary.ExitCannotExec
	ExitNotFound   = boundary.ExitNotFound
)

// RunOptions configure one `moat run`.
type RunOptions struct {
	Policy  *policy.Policy
	Backend string // overrides Policy.Backend when non-empty
	Argv    []string
	// RunInfoPath, when set, receives the run info (JSON), written and
	// synced once the sandbox is Ready and before the workload starts.
	RunInfoPath string
	Stdin       io.Reader
	Stdout      io.Writer
	Stderr      io.Writer
	// Terminal gives the workload a pty that moat allocates and relays to
	// Stdin and Stdout, which must then be *os.File (see internal/term):
	// set when moat's stdin or stdout is a terminal, so that the caller's
	// terminal never enters the sandbox.
	Terminal bool
	// Explain, when set, receives the measured properties with their
	// mechanisms once confirmation is done.
	Explain io.Writer
	// Getenv reads moat's own environment (credentials, MOAT_LOG, TERM);
	// os.Getenv if nil.
	Getenv func(string) string
	// LogLevel chooses the broker's lines on Stderr (ParseLogLevel); ""
	// reads MOAT_LOG, else the default "refusals".
	LogLevel string
	// OnJournal, when set, is called with the run directory once the
	// journal is open (moat run -o reads its summary from there).
	OnJournal func(runDir string)
}

// RefusedError is a refusal by moat itself; the run exits 125.
type RefusedError struct{ Msg string }

func (e *RefusedError) Error() string { return "refused: " + e.Msg }

// RunInfo is what --run-info holds (one type for the writer and every
// reader: see internal/runinfo).
type RunInfo = runinfo.Info

// NewRunID returns a fresh run id: UTC time plus 48 random bits.
func NewRunID() string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("BUG: crypto/rand failed: " + err.Error())
	}
	return time.Now().UTC().Format("20060102T150405Z") + "-" + hex.EncodeToString(b[:])
}

// binarySHA256 hashes the running moat binary (once per version and
// process: the measurement hashes the same file, and the attributor the
// helper that runs it). A settled version's hash is also shared between
// moat processes through the kernel keyring, sealed under a secret in
// the state directory (see internal/exehash's FileShared): a 33 MB
// binary was about 26 ms of one core per moat run on a slow machine.
func binarySHA256() (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	dir, err := StateDir()
	if err != nil {
		return FileSHA256(exe)
	}
	return exehash.FileShared(exe, 1<<40, dir)
}

// FileSHA256 returns the hex sha256 of a file's contents (a version of a
// file is hashed once per process: see internal/exehash).
func FileSHA256(path string) (string, error) { return exehash.File(path, 1<<40) }

// Run runs one workload and returns its exit code. A non-nil error means
// moat itself refused or failed (exit 125, or 126/127 when the command
// cannot be started); it has been journaled when the journal was open.
func Run(ctx context.Context, o RunOptions) (int, error) {
	if len(o.Argv) == 0 {
		return ExitRefused, &RefusedError{Msg: "no command given (usage: moat run [--policy F] -- CMD [ARG…])"}
	}
	// Signals are caught before anything is created: one that comes while
	// moat starts stops the start (the journal, once open, ends with its
	// terminal record; the reaper removes what was made), and moat exits
	// 128+n; once the workload runs, runMain forwards them to it.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	startCtx, cancelStart := context.WithCancelCause(ctx)
	defer cancelStart(nil)
	started := make(chan struct{})
	early := make(chan os.Signal, 1)
	go func() {
		select {
		case sig := <-sigs:
			early <- sig
			cancelStart(&SignalError{Sig: sig.(syscall.Signal)})
		case <-started:
		}
		close(early)
	}()
	var ri *runinfo.Target
	if o.RunInfoPath != "" {
		// Checked and pinned before anything starts: a path inside a grant
		// is refused, and the file is later written through this directory
		// descriptor only.
		t, err := runinfo.Open(o.RunInfoPath, runinfo.Grants{ReadOnly: o.Policy.Filesystem.ReadOnly, ReadWrite: o.Policy.Filesystem.ReadWrite})
		if err != nil {
			return ExitRefused, &RefusedError{Msg: err.Error()}
		}
		defer t.Close()
		ri = t
	}
	getenv := o.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	// The caller's TERM goes in only with the pty that moat gives the
	// workload: without one, the workload's output is not a terminal and
	// a TERM would only mislead it.
	var termName string
	if o.Terminal {
		termName = getenv("TERM")
	}
	s, err := Open(startCtx, SessionOptions{Policy: o.Policy, Backend: o.Backend, Stderr: o.Stderr, Explain: o.Explain, Getenv: getenv,
		LogLevel: o.LogLevel, Term: termName})
	close(started)
	sig, caught := <-early
	var se *SignalError
	switch {
	case errors.As(err, &se):
		return se.Code(), se
	case err != nil:
		return ExitRefused, err
	case caught && sig != nil:
		// It came as the start ended: end the run the same way.
		se = &SignalError{Sig: sig.(syscall.Signal)}
		s.Close(se.Code(), audit.ReasonTerminated)
		return se.Code(), se
	}
	stopControl, err := s.serveRunControl()
	if err != nil {
		s.Close(ExitRefused, audit.ReasonFailed)
		return ExitRefused, &RefusedError{Msg: err.Error()}
	}
	if o.OnJournal != nil {
		o.OnJournal(filepath.Dir(s.w.JournalPath()))
	}
	code, reason, err := s.runMain(ctx, o, ri, sigs)
	stopControl() // no decision after the run's end: Close refuses what is still held
	s.Close(code, reason)
	// process.exited became durable with run.terminated's fsync (or
	// Close's); a journal that failed makes the run fail as before.
	if s.exitedWait != nil {
		if jerr := s.exitedWait(); jerr != nil && err == nil {
			return ExitRefused, fmt.Errorf("journal: %w", jerr)
		}
	}
	return code, err
}

func (s *Session) runMain(ctx context.Context, o RunOptions, ri *runinfo.Target, sigs <-chan os.Signal) (code int, reason audit.TerminalReason, err error) {
	// Signals are caught (by Run) before the terminal goes raw, so that
	// none of them ends moat with the caller's terminal left raw; one that
	// comes before the workload starts is forwarded once it has.
	var relay *term.Relay
	if o.Terminal {
		in, ok1 := o.Stdin.(*os.File)
		out, ok2 := o.Stdout.(*os.File)
		if !ok1 || !ok2 {
			return ExitRefused, audit.ReasonFailed, errors.New("a terminal for the workload needs moat's stdin and stdout as files")
		}
		if relay, err = term.Start(in, out); err != nil {
			return ExitRefused, audit.ReasonFailed, fmt.Errorf("terminal: %w", err)
		}
		// Deferred after signal.Stop's defer, so it runs first: the
		// caller's terminal is restored on every return.
		defer relay.Stop()
	}
	var tty *os.File
	if relay != nil {
		tty = relay.Slave()
	}
	id, proc, err := s.Start(ctx, o.Argv, o.Stdin, o.Stdout, o.Stderr, tty, true)
	if relay != nil {
		relay.CloseSlave()
	}
	if err != nil {
		if code := startCode(err); code != ExitRefused {
			return code, audit.ReasonExecFailed, err
		}
		return ExitRefused, audit.ReasonFailed, err
	}
	if ri != nil {
		if err := ri.Write(RunInfo{
			RunID: s.RunID, Journal: s.w.JournalPath(), PublicKeyPEM: string(s.w.PublicKeyPEM()),
			KeyID: s.w.KeyID(), HostPID: s.sb.HostPID(), WorkloadPID: proc.HostPID(), Backend: s.Backend,
			Properties: s.Properties, Limits: s.sb.Limits(), BrokerPort: s.BrokerPort,
		}); err != nil {
			proc.Signal(syscall.SIGKILL)
			proc.Wait()
			return ExitRefused, audit.ReasonFailed, err
		}
	}
	if relay != nil {
		relay.SetOnSignal(func(sig os.Signal) { proc.Signal(sig) })
	}
	done := make(chan struct{})
	var werr error
	go func() { code, werr = proc.Wait(); close(done) }()
	var fatal Fatal
loop:
	for {
		select {
		case <-done:
			break loop
		case sig := <-sigs:
			proc.Signal(sig)
		case fatal = <-s.fatal:
			// Credential reflection or an audit fault: stop all effects.
			proc.Signal(syscall.SIGKILL)
		case <-ctx.Done():
			proc.Signal(syscall.SIGKILL)
		}
	}
	if relay != nil {
		// The workload's last output, then the caller's terminal back
		// before moat says anything more.
		if err := relay.Stop(); err != nil {
			fmt.Fprintf(o.Stderr, "moat: terminal: %v\n", err)
		}
	}
	if e, ok := s.sb.(boundary.Ending); ok {
		select {
		case <-e.Ended():
			// The sandbox ended from outside moat (a Pod deleted or
			// evicted) under the workload.
			return ExitRefused, audit.ReasonSandboxLost, fmt.Errorf("the sandbox ended from outside moat: %s", e.EndReason())
		default:
		}
	}
	if werr != nil {
		return ExitRefused, audit.ReasonFailed, fmt.Errorf("waiting for workload: %w", werr)
	}
	// Written now, made durable by run.terminated's fsync after the
	// teardown (Run waits for it before it returns).
	oom, wait, err := s.exitedAsync(id, code)
	if err != nil {
		return ExitRefused, audit.ReasonFailed, fmt.Errorf("journal: %w", err)
	}
	s.exitedWait = wait
	if oom && o.Stderr != nil {
		fmt.Fprintf(o.Stderr, "moat: the workload was killed: out of memory (process.limits.memory %s)\n", s.pol.Process.Limits.Memory)
	}
	if fatal.Msg == "" {
		select {
		case fatal = <-s.fatal: // the workload exited first
		default:
			if err := s.Failed(); err != nil {
				fatal = Fatal{Reason: "cancelled", Msg: err.Error()}
			}
		}
	}
	if fatal.Msg != "" {
		return ExitRefused, fatal.TerminalReason(), fmt.Errorf("run cancelled: %s", fatal)
	}
	return code, audit.ReasonCompleted, nil
}

// workloadEnv is the policy's env plus moat's own variables, sorted;
// nothing is inherited from moat's environment.
func workloadEnv(pol *policy.Policy, extra []string) []string {
	m := map[string]string{}
	for k, v := range pol.Process.Env {
		m[k] = v
	}
	for _, kv := range extra {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	env := make([]string, 0, len(m))
	for k, v := range m {
		env = append(env, k+"="+v)
	}
	sort.Strings(env)
	return env
}

// hostSecrets lists host paths that must be unreadable inside: a sentinel
// written now outside every grant, plus well-known secrets and the caller's
// home and working directory when they are not granted.
func hostSecrets(stateDir string, pol *policy.Policy) ([]string, error) {
	sentinel := filepath.Join(stateDir, "host-sentinel")
	// Made once in the run's own new 0700 staging directory and removed
	// with it: a plain exclusive create, without the two fsyncs of an
	// atomic durable write (0.3 to 0.5 ms on the start path).
	f, err := os.OpenFile(sentinel, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o644)
	if err != nil {
		return nil, err
	}
	// World-readable whatever the umask: the sandbox must be kept from
	// it by its confinement, not by the file's mode.
	werr := f.Chmod(0o644)
	if werr == nil {
		_, werr = f.WriteString("moat host sentinel\n")
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		return nil, werr
	}
	out := []string{sentinel}
	cands := []string{"/etc/shadow", "/root"}
	if h, err := os.UserHomeDir(); err == nil {
		cands = append(cands, h)
	}
	if wd, err := os.Getwd(); err == nil {
		cands = append(cands, wd)
	}
	for _, c := range cands {
		if _, err := os.Lstat(c); err == nil && !granted(pol, c) {
			out = append(out, c)
		}
	}
	return out, nil
}

// granted reports whether p is a grant, inside one, or contains one.
func granted(pol *policy.Policy, p string) bool {
	for _, g := range append(append([]string{}, pol.Filesystem.ReadOnly...), pol.Filesystem.ReadWrite...) {
		if fsutil.Within(p, g) || fsutil.Within(g, p) {
			return true
		}
	}
	return false
}

func explain(w io.Writer, backend string, p boundary.Properties, l boundary.LimitsStatus) {
	fmt.Fprintf(w, "moat: boundary confirmed by measurement (backend %s)\n", backend)
	for _, np := range p.Named() {
		state := "enforced"
		switch {
		case np.Unavailable:
			state = "unavailable"
		case !np.Enforced:
			state = "NOT enforced"
		}
		fmt.Fprintf(w, "  %-24s %-12s mechanism=%s", np.Name, state, np.Mechanism)
		if np.Detail != "" {
			fmt.Fprintf(w, " (%s)", np.Detail)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "  limits: memory=%v pids=%v open_files=%v disk=%v", l.Memory, l.Pids, l.OpenFiles, l.Disk)
	if l.Detail != "" {
		fmt.Fprintf(w, " (%s)", l.Detail)
	}
	fmt.Fprintln(w)
	if l.DiskDetail != "" {
		fmt.Fprintf(w, "  disk: %s\n", l.DiskDetail)
	}
	if be, err := boundary.Lookup(backend); err == nil {
		if f, ok := be.(seccomp.Filtered); ok {
			ExplainFilter(w, f.SeccompOptions())
		}
	}
}

// ExplainFilter writes the rules of the seccomp filter built with opts,
// one a line, in the order the filter decides.
func ExplainFilter(w io.Writer, opts seccomp.Options) {
	rules := seccomp.Policy(opts)
	if len(rules) == 0 {
		fmt.Fprintln(w, "  seccomp filter: none on this system")
		return
	}
	fmt.Fprintf(w, "  seccomp filter (%d rules; for each syscall the first that holds decides):\n", len(rules))
	for _, r := range rules {
		fmt.Fprintf(w, "    %s\n", r)
	}
}

// startCode maps a backend's start failure to docker run's exit codes:
// 127 not found, 126 cannot execute, 125 anything else.
func startCode(err error) int {
	var se *boundary.StartError
	if errors.As(err, &se) && (se.Code == ExitCannotExec || se.Code == ExitNotFound) {
		return se.Code
	}
	return ExitRefused
}
