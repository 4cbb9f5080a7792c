package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"unicode/utf8"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/boundary/measure"
	"github.com/moat-sandbox/moat/broker"
	"github.com/moat-sandbox/moat/internal/fsutil"
	"github.com/moat-sandbox/moat/internal/reaper"
	"github.com/moat-sandbox/moat/policy"
)

// SessionOptions configure a confirmed sandbox with its journal and broker.
type SessionOptions struct {
	Policy  *policy.Policy
	Backend string // overrides Policy.Backend when non-empty
	Stderr  io.Writer
	Explain io.Writer
	Getenv  func(string) string
	// RunDir, when set, is the run directory (journal, public key);
	// default <audit.dir>/<run id>.
	RunDir string
	// LogLevel chooses the broker's lines on Stderr (see ParseLogLevel);
	// "" reads MOAT_LOG through Getenv, and if that is unset too, the
	// default "refusals".
	LogLevel string
	// Sandbox is the sandbox's name (a supervisor's session), "" for
	// moat run: the principal of a request held for approval names it.
	Sandbox string
	// Budget, when set, is the shared budget ledger account the broker
	// charges (a sandbox's; budget.go).
	Budget broker.Budget
	// Term is the TERM given to processes started with a terminal (Start
	// with a tty), unless the policy's env sets TERM itself; "" gives
	// them none. Processes without a terminal never get it from here.
	Term string
}

// LogEnv names moat's variable for the broker's log level; --log-level
// sets it for the command (and so for a sandbox's supervisor).
const LogEnv = "MOAT_LOG"

// Log levels for the broker's lines on moat's stderr. Every request,
// refusal and failure is in the journal whatever the level; these lines
// are for the person watching.
const (
	LogQuiet    = "quiet"    // only failures that end the run (a reflected credential, an audit failure, a run-wide cap)
	LogRefusals = "refusals" // the default: also each refused and each failed request
	LogRequests = "requests" // also one line per completed request
	LogDebug    = "debug"    // also one line per admitted request, before it is sent
)

// LogLevels lists the levels from quietest to loudest.
var LogLevels = []string{LogQuiet, LogRefusals, LogRequests, LogDebug}

// ParseLogLevel maps a level name to the slog level of the broker's
// handler ("" is the default, refusals). The broker logs completed
// requests at Info, refusals and failed requests at Warn, fatal events at
// Error and admissions at Debug.
func ParseLogLevel(name string) (slog.Level, error) {
	switch name {
	case LogQuiet:
		return slog.LevelError, nil
	case LogRefusals, "":
		return slog.LevelWarn, nil
	case LogRequests:
		return slog.LevelInfo, nil
	case LogDebug:
		return slog.LevelDebug, nil
	}
	return 0, fmt.Errorf("unknown log level %q (use one of %s)", name, strings.Join(LogLevels, ", "))
}

// Session is a confirmed sandbox: journal open, boundary measured and
// Ready, broker serving on the sandbox's loopback. Processes started with
// Exec run under the same confinement and are journaled.
type Session struct {
	RunID      string
	Backend    string
	Properties boundary.Properties
	BrokerPort int
	// EgressPort is the broker's egress port inside the sandbox (egress.go);
	// 0 when the policy has no egress hosts.
	EgressPort int
	// brokerHost is where the workload reaches the broker
	// (boundary.ListenerInfo.Host): "" is the sandbox's 127.0.0.1.
	brokerHost string
	// workloadKey is the key the workload sends and the broker requires
	// (workloadKeyFor): "" is the placeholder. Never journaled.
	workloadKey string

	pol *policy.Policy
	w   *audit.Writer
	sb  boundary.Sandbox
	brk *broker.Broker
	// The package grants' lockfiles as read before run.started (which
	// records them), the route built from them, and the reload lock
	// (packages.go).
	pkgCfg    *broker.PackagesConfig
	lockfiles []audit.PackageLockfile
	pkgs      *broker.Packages
	reloadMu  sync.Mutex
	tools     *toolServers // the tool servers (tools.go); nil when the policy has none
	stateDir  string
	reaper    *reaper.Reaper
	checks    []audit.Check
	log       *slog.Logger // the broker's lines, to moat's stderr, at the chosen level
	term      string       // TERM for processes started with a terminal
	sandbox   string       // SessionOptions.Sandbox
	nproc     atomic.Int64
	fatal     chan Fatal

	budget broker.Budget // SessionOptions.Budget

	// binary delivers the moat binary's sha256 for run.started: it is
	// hashed while the sandbox is prepared and measured (about 10 ms for
	// 16 MB; the measurement waits for the same hash, see exehash).
	binary     <-chan binaryHash
	reaperc    <-chan reaperStart // the reaper, started while the journal is created
	startMu    sync.Mutex
	binaryRes  *binaryHash  // what binary delivered
	started    bool         // run.started is in the journal
	startWait  func() error // returns once run.started is durable
	exitedWait func() error // moat run: returns once the workload's process.exited is durable

	mu      sync.Mutex
	running map[string]boundary.Running // process id → process
	// oomAtStart is the memory cgroup's OOM kill count when each process
	// started (where the backend counts them).
	oomAtStart map[string]uint64
	closed     bool
}

// Fatal delivers the reason once the broker stopped all effects
// (credential reflection, audit fault).
func (s *Session) Fatal() <-chan Fatal { return s.fatal }

// Fatal is why the broker stopped all effects: its reason code (e.g.
// credential_reflected, audit_failure, refusal_limit) and the message.
type Fatal struct {
	Reason string
	Msg    string
}

func (f Fatal) String() string { return f.Reason + ": " + f.Msg }

// TerminalReason is run.terminated's reason for a run that this ended:
// the limit itself for a run-wide cap, else cancelled.
func (f Fatal) TerminalReason() audit.TerminalReason {
	switch f.Reason {
	case string(broker.ReasonRefusalLimit):
		return audit.ReasonRefusalLimit
	case string(broker.ReasonJournalLimit):
		return audit.ReasonJournalLimit
	}
	return audit.ReasonCancelled
}

// Open opens the journal, prepares the sandbox, confirms it by measurement
// and starts the broker. On error the journal (if it was opened) holds the
// refusal and its terminal record, and everything is torn down.
func Open(ctx context.Context, o SessionOptions) (*Session, error) {
	getenv := o.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	stderr := o.Stderr
	if stderr == nil {
		stderr = io.Discard
	}
	pol := o.Policy
	// Refusals that need nothing started come first: no journal, no
	// staging directory, nothing to clean up.
	levelName := o.LogLevel
	if levelName == "" {
		levelName = getenv(LogEnv)
	}
	level, err := ParseLogLevel(levelName)
	if err != nil {
		return nil, &RefusedError{Msg: err.Error() + " (from --log-level or " + LogEnv + ")"}
	}
	creds, err := providerCredentials(pol, getenv)
	if err != nil {
		return nil, err
	}
	backendName := pol.Backend
	if o.Backend != "" {
		backendName = o.Backend
	}
	be, err := boundary.Lookup(backendName)
	if err != nil {
		return nil, &RefusedError{Msg: err.Error()}
	}
	runID := NewRunID()
	// The binary is hashed from now on, while the journal key is made
	// and the sandbox prepared; run.started waits for it.
	binary := hashBinary()
	runDir := o.RunDir
	if runDir == "" {
		if err := os.MkdirAll(pol.Audit.Dir, 0o700); err != nil {
			return nil, fmt.Errorf("audit dir: %w", err)
		}
		runDir = filepath.Join(pol.Audit.Dir, runID)
	}
	reaperc := startReaper()
	w, err := audit.Create(runDir, runID)
	if err != nil {
		(<-reaperc).r.Close()
		return nil, fmt.Errorf("opening journal: %w", err)
	}
	fmt.Fprintf(stderr, "moat: run %s: journal %s (key fingerprint %s; pin it: moat audit verify %s --key-fingerprint %s)\n", runID, w.JournalPath(), w.KeyID(), runDir, w.KeyID())
	s := &Session{RunID: runID, Backend: be.Name(), pol: pol, w: w, fatal: make(chan Fatal, 1), binary: binary, reaperc: reaperc,
		running: map[string]boundary.Running{}, oomAtStart: map[string]uint64{}, sandbox: o.Sandbox}
	if validTerm(o.Term) {
		s.term = o.Term
	}
	s.budget = o.Budget
	s.log = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	if err := s.open(ctx, be, creds, o.Explain, stderr); err != nil {
		var sig *SignalError
		if errors.As(context.Cause(ctx), &sig) {
			// Stopped by a signal while starting: the journal says so.
			s.Close(sig.Code(), audit.ReasonTerminated)
			return nil, sig
		}
		reason := audit.ReasonFailed
		if _, ok := err.(*RefusedError); ok {
			reason = audit.ReasonRefused
		}
		s.Close(ExitRefused, reason)
		return nil, err
	}
	return s, nil
}

// SignalError is a run stopped by a signal to moat before its workload
// started; its exit code is 128 + the signal's number, as a shell's.
type SignalError struct{ Sig syscall.Signal }

func (e *SignalError) Error() string {
	return fmt.Sprintf("stopped by %v before the workload started", e.Sig)
}

// Code is the exit code: 128 + the signal's number.
func (e *SignalError) Code() int { return 128 + int(e.Sig) }

// providerCredentials reads every provider's credential_env from moat's
// environment and checks each value by the broker's own rule
// (broker.CheckCredential). Any variable unset, empty or unusable refuses
// the run with one message that names each such variable and its
// providers.
func providerCredentials(pol *policy.Policy, getenv func(string) string) (map[string]string, error) {
	creds := map[string]string{}
	var vars []string              // credential_env names, in policy order
	users := map[string][]string{} // credential_env → provider names
	for _, p := range pol.Inference.Providers {
		if _, seen := users[p.CredentialEnv]; !seen {
			vars = append(vars, p.CredentialEnv)
		}
		users[p.CredentialEnv] = append(users[p.CredentialEnv], strconv.Quote(p.Name))
	}
	var probs []string
	for _, v := range vars {
		names := users[v]
		who := "provider " + names[0]
		if len(names) > 1 {
			who = "providers " + strings.Join(names, ", ")
		}
		val := getenv(v)
		if val == "" {
			probs = append(probs, fmt.Sprintf("%s is not set or empty (%s)", v, who))
			continue
		}
		if err := broker.CheckCredential(strings.Trim(names[0], `"`), val); err != nil {
			probs = append(probs, fmt.Sprintf("%s (%s) is unusable: %s", v, who, strings.TrimPrefix(err.Error(), "moat: ")))
			continue
		}
		for _, p := range pol.Inference.Providers {
			if p.CredentialEnv == v {
				creds[p.Name] = val
			}
		}
	}
	if len(probs) > 0 {
		return nil, &RefusedError{Msg: "the policy's provider credentials are missing or unusable, so nothing was started: " +
			strings.Join(probs, "; ") +
			". moat reads each provider's credential_env from its own environment (the key never enters the sandbox): set them, or remove those providers from the policy"}
	}
	return creds, nil
}

// validTerm accepts a terminal type name as terminfo names them: 1 to 128
// letters, digits and ._+- (anything else from the caller is not passed).
func validTerm(t string) bool {
	if t == "" || len(t) > 128 {
		return false
	}
	for _, c := range []byte(t) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '+' || c == '-') {
			return false
		}
	}
	return true
}

// binaryHash is the moat binary's sha256, or why it could not be had.
type binaryHash struct {
	sum string
	err error
}

// hashBinary hashes the running moat binary in the background.
func hashBinary() <-chan binaryHash {
	ch := make(chan binaryHash, 1)
	go func() {
		sum, err := binarySHA256()
		ch <- binaryHash{sum, err}
	}()
	return ch
}

// reaperStart is the started reaper, or why it could not start.
type reaperStart struct {
	r   *reaper.Reaper
	err error
}

// startReaper starts the reaper in the background (a fork and exec of
// moat, 1 to 2 ms): open waits for it before it makes anything.
func startReaper() <-chan reaperStart {
	ch := make(chan reaperStart, 1)
	go func() {
		var rs reaperStart
		if exe, err := os.Executable(); err == nil {
			rs.r, rs.err = reaper.Start(exe)
		}
		ch <- rs
	}()
	return ch
}

// startRecord appends run.started, the journal's first line, once the
// binary's hash is known; later calls do nothing. Every other record is
// appended after it: open appends it once the sandbox is measured, just
// before boundary.confirmed (so that the hash runs alongside the
// preparation and the measurement), and the refusal and terminal records
// of a run that ends earlier call it first.
func (s *Session) startRecord() error {
	wait, err := s.writeStartRecord()
	if err != nil {
		return err
	}
	return wait()
}

// writeStartRecord is startRecord up to the record written in its place
// in the journal; wait returns once it is durable. open has
// boundary.confirmed appended (and synced) right after it, so that the
// two share one fsync, both before anything runs in the sandbox.
func (s *Session) writeStartRecord() (wait func() error, err error) {
	s.startMu.Lock()
	defer s.startMu.Unlock()
	if s.started {
		return s.startWait, nil
	}
	if s.binaryRes == nil {
		b := <-s.binary
		s.binaryRes = &b
	}
	b := s.binaryRes
	if b.err != nil {
		return nil, fmt.Errorf("hashing moat binary: %w", b.err)
	}
	_, synced, err := s.w.AppendAsync(audit.RunStarted{
		PolicySHA256: s.pol.SHA256(), Backend: s.Backend, BinarySHA256: b.sum, PublicKey: string(s.w.PublicKeyPEM()),
		Lockfiles: s.lockfiles,
	})
	if err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	s.started = true
	s.startWait = func() error {
		if err := synced(); err != nil {
			return fmt.Errorf("journal: %w", err)
		}
		return nil
	}
	return s.startWait, nil
}

func (s *Session) open(ctx context.Context, be boundary.Backend, creds map[string]string, explainTo, stderr io.Writer) error {
	pol := s.pol
	// The reaper removes the staging directory and the backend's cgroups
	// if moat dies without doing so itself. It is told the staging
	// directory before that exists, so that no kill leaves it behind.
	rs := <-s.reaperc
	if rs.err != nil {
		return rs.err
	}
	s.reaper = rs.r
	// The lockfiles are read once, before anything runs in the sandbox;
	// run.started records their digests.
	if err := s.readPackages(stderr); err != nil {
		return err
	}
	var rnd [8]byte
	rand.Read(rnd[:])
	s.stateDir = filepath.Join(os.TempDir(), "moat-"+s.RunID+"-"+hex.EncodeToString(rnd[:]))
	if err := s.reaper.Own(s.stateDir, true); err != nil {
		return fmt.Errorf("reaper: %w", err)
	}
	if err := os.Mkdir(s.stateDir, 0o700); err != nil {
		// Not ours (it existed): the reaper must not remove it.
		s.reaper.Done(s.stateDir)
		s.stateDir = ""
		return err
	}
	sb, err := be.Prepare(ctx, boundary.Spec{RunID: s.RunID, Policy: pol, StateDir: s.stateDir, Reaper: s.reaper})
	if err != nil {
		msg := fmt.Sprintf("backend %s could not prepare the sandbox: %v", be.Name(), err)
		s.confirmFailed(boundary.Properties{}, msg)
		return &RefusedError{Msg: msg}
	}
	s.sb = sb
	if msg, warn := limitsVerdict(pol.Process.Limits, sb.Limits()); msg != "" {
		s.confirmFailed(boundary.Properties{}, msg)
		return &RefusedError{Msg: msg}
	} else if warn != "" {
		fmt.Fprintf(stderr, "moat: warning: %s\n", warn)
	}
	li, err := sb.Listener()
	if err != nil {
		msg := fmt.Sprintf("backend %s gave no broker listener: %v", be.Name(), err)
		s.confirmFailed(boundary.Properties{}, msg)
		return &RefusedError{Msg: msg}
	}
	s.BrokerPort, s.brokerHost = li.Port, li.Host
	s.workloadKey = workloadKeyFor(li)
	eli, egressOn, err := egressListener(sb, be.Name(), pol)
	if err != nil {
		li.File.Close()
		s.confirmFailed(boundary.Properties{}, err.Error())
		return err
	}
	if egressOn {
		s.EgressPort = eli.Port
	}
	secrets, err := hostSecrets(s.stateDir, pol)
	if err != nil {
		return err
	}
	props, rep, err := measure.Confirm(ctx, sb, measure.Config{
		BrokerPort: li.Port, EgressPort: s.EgressPort, ReadWrite: pol.Filesystem.ReadWrite, ReadOnly: pol.Filesystem.ReadOnly,
		HostSecrets: secrets, RequireAttribution: pol.Inference.RequireAttribution, Reaper: s.reaper,
	})
	s.Properties = props
	s.checks = checksOf(rep)
	if err != nil {
		msg := fmt.Sprintf("confirmation of backend %s failed: %v", be.Name(), err)
		s.confirmFailed(props, msg)
		return &RefusedError{Msg: msg}
	}
	if explainTo != nil {
		explain(explainTo, be.Name(), props, sb.Limits())
		explainEgress(explainTo, pol)
	}
	if err := boundary.Ready(props, boundary.Requirements{RequireAttribution: pol.Inference.RequireAttribution}); err != nil {
		s.confirmFailed(props, err.Error())
		return &RefusedError{Msg: err.Error() + " (the workload was not started)"}
	}
	limits := sb.Limits()
	// run.started and boundary.confirmed share one fsync (the second
	// append's covers the first line); both are durable before anything
	// runs in the sandbox.
	started, err := s.writeStartRecord()
	if err != nil {
		return err
	}
	if _, err := s.w.Append(audit.BoundaryConfirmed{Ready: true, Properties: props, Checks: s.checks, Limits: &limits}); err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	if err := started(); err != nil {
		return err
	}
	gw, ts, err := s.openTools(ctx, be, creds)
	if err != nil {
		return err
	}
	s.tools = ts
	svc, err := s.openServices(ctx, toolCredentials(pol, creds))
	if err != nil {
		return err
	}
	pkgs, err := s.openPackages()
	if err != nil {
		return err
	}
	var eg *broker.Egress
	var eln net.Listener
	if egressOn {
		if eg, eln, err = openEgress(pol, eli); err != nil {
			return fmt.Errorf("broker: %w", err)
		}
	}
	brk, err := broker.New(broker.Config{
		Policy: pol, Journal: s.w, Attributor: sb.Attributor(), Tools: gw, Services: svc, Packages: pkgs, Egress: eg,
		AttributionUnavailable: sb.Mechanisms().AttributionUnavailable,
		Credentials:            creds,
		Log:                    s.log,
		Budget:                 s.budget,
		RunID:                  s.RunID,
		Sandbox:                s.sandbox,
		WorkloadKey:            s.workloadKey,
		OnFatal: func(reason string, err error) {
			select {
			case s.fatal <- Fatal{Reason: reason, Msg: err.Error()}:
			default:
			}
		},
	})
	if err != nil {
		if eln != nil {
			eln.Close()
		}
		return fmt.Errorf("broker: %w", err)
	}
	ln, err := fileListener(li.File)
	if err != nil {
		return fmt.Errorf("broker listener: %w", err)
	}
	ln = withAdmission(ln, li.Admit, s.connectionRefused)
	s.brk = brk
	go brk.Serve(ln)
	if eln != nil {
		go brk.ServeEgress(eln)
	}
	return nil
}

// connectionRefused journals a connection to the broker's listener that
// the backend's admission refused (boundary.ListenerInfo.Admit: not from
// the sandbox), as an inference.refused that reached nothing.
func (s *Session) connectionRefused(remote net.Addr, why error) {
	var id [12]byte
	rand.Read(id[:])
	s.w.Append(audit.InferenceRefused{RequestID: "moatreq_" + hex.EncodeToString(id[:]), Reason: "source_not_sandbox",
		Detail:      truncateReason(fmt.Sprintf("connection from %s refused before it was read: %v", remote, why)),
		Attribution: audit.Attribution{Status: boundary.AttributionUnavailable, Reason: "not a connection of the sandbox"}})
}

func (s *Session) confirmFailed(props boundary.Properties, why string) {
	if s.startRecord() != nil {
		return // Close says why; no line may come before run.started
	}
	s.w.Append(audit.BoundaryConfirmed{Ready: false, Properties: props, Reason: why, Checks: s.checks})
}

// checksOf is the measurement's checks, which the journal records as
// they are (measure.Check and audit.Check are confirmation.Check).
func checksOf(rep *measure.Report) []audit.Check {
	if rep == nil {
		return nil
	}
	return rep.Checks
}

// env is the workload environment of a process: the policy's env plus
// the broker's variables (broker.WorkloadEnv), nothing inherited from
// moat's environment; and TERM (the caller's, SessionOptions.Term) for a
// process that has a terminal, unless the policy's env sets TERM itself.
func (s *Session) env(terminal bool) []string {
	extra := broker.WorkloadEnvAt(s.brokerHost, s.BrokerPort, s.workloadKey, s.pol)
	extra = append(extra, toolEnv(s.BrokerPort, s.pol)...)
	extra = append(extra, serviceEnv(s.pol)...)
	extra = append(extra, packageEnv(s.BrokerPort, s.pol)...)
	extra = append(extra, egressEnv(s.EgressPort, s.pol)...)
	if _, own := s.pol.Process.Env["TERM"]; terminal && s.term != "" && !own {
		extra = append(extra, "TERM="+s.term)
	}
	return workloadEnv(s.pol, extra)
}

// Start starts argv in the sandbox and journals process.started. The
// returned id names the process in the journal. last says that nothing
// will be started after it (moat run's workload; boundary.Process.Last).
func (s *Session) Start(ctx context.Context, argv []string, stdin io.Reader, stdout, stderr io.Writer, tty *os.File, last bool) (string, boundary.Running, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return "", nil, &RefusedError{Msg: "the sandbox is shutting down"}
	}
	s.mu.Unlock()
	if err := s.brokerFailed(); err != nil {
		return "", nil, &RefusedError{Msg: "the run was cancelled: " + err.Error()}
	}
	proc, err := s.sb.Start(ctx, boundary.Process{
		Argv: argv, Env: s.env(tty != nil), Dir: s.pol.Process.Workdir,
		Stdin: stdin, Stdout: stdout, Stderr: stderr, TTY: tty, Last: last,
	})
	if err != nil {
		err = fmt.Errorf("starting %q: %w", argv[0], err)
		// Journaled like any refusal after the journal opens: moat run
		// and sandbox exec alike.
		if _, jerr := s.w.Append(audit.ProcessFailed{Argv: argv, ExitCode: startCode(err), Reason: truncateReason(err.Error())}); jerr != nil {
			return "", nil, fmt.Errorf("%w; journal: %v", err, jerr)
		}
		return "", nil, err
	}
	id := "p" + strconv.FormatInt(s.nproc.Add(1), 10)
	rec := audit.ProcessStarted{ProcessID: id, Argv: argv, HostPID: proc.HostPID()}
	if f, ok := s.sb.(boundary.ImageFiles); !ok || !f.FilesFromImage() {
		rec.Executable, rec.SHA256 = s.resolveExecutable(argv[0])
	}
	// Written before Start returns, and made durable in the background:
	// nothing waits for this fsync. The process is running already (as
	// it was before this record, always), and its only way out is the
	// broker, whose pre-effect records are synced before anything leaves;
	// the fsync of any record written after this one covers it too. If
	// the write or sync fails, the run ends (journalFault), as on a
	// failure of the broker's own records.
	_, wait, err := s.w.AppendAsync(rec)
	if err != nil {
		proc.Signal(syscall.SIGKILL)
		proc.Wait()
		return "", nil, fmt.Errorf("journal: %w", err)
	}
	go func() {
		if err := wait(); err != nil {
			s.journalFault("process.started of "+id+" could not be made durable", err)
		}
	}()
	s.mu.Lock()
	s.running[id] = proc
	if n, ok := s.oomKills(); ok {
		s.oomAtStart[id] = n
	}
	s.mu.Unlock()
	return id, proc, nil
}

func (s *Session) oomKills() (uint64, bool) {
	if c, ok := s.sb.(boundary.OOMCounter); ok {
		return c.OOMKills()
	}
	return 0, false
}

// resolveExecutable names the binary that argv0 denotes inside the
// sandbox, and its sha256. Backends mount each grant at its own path, so
// the file inside is the host file at the same path; it is resolved with
// the workload's PATH and accepted only within a grant. ("", "") when it
// cannot be named (the journal then records argv alone).
func (s *Session) resolveExecutable(argv0 string) (string, string) {
	var cands []string
	if strings.Contains(argv0, "/") {
		if !filepath.IsAbs(argv0) {
			return "", ""
		}
		cands = []string{argv0}
	} else {
		for _, dir := range filepath.SplitList(s.pol.Process.Env["PATH"]) {
			if filepath.IsAbs(dir) {
				cands = append(cands, filepath.Join(dir, argv0))
			}
		}
	}
	for _, c := range cands {
		if !inGrant(s.pol, c) {
			continue
		}
		fi, err := os.Stat(c)
		if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
			continue
		}
		sum, err := FileSHA256(c)
		if err != nil {
			return "", ""
		}
		return filepath.Clean(c), sum
	}
	return "", ""
}

// exitedAsync journals process.exited for a process started with Start:
// it returns once the record is written in its place in the journal, and
// wait returns once it is durable. moat run appends run.terminated (and
// syncs it) once the sandbox is torn down, so that the two records share
// one fsync, and calls wait after that; a sandbox's supervisor answers
// the exec's client first and waits after.
//
// oom is true when the kernel killed it for using more memory than the
// sandbox's limit: it died of SIGKILL while the memory cgroup counted an
// out-of-memory kill.
func (s *Session) exitedAsync(id string, code int) (oom bool, wait func() error, err error) {
	s.mu.Lock()
	delete(s.running, id)
	before, counted := s.oomAtStart[id]
	delete(s.oomAtStart, id)
	s.mu.Unlock()
	if n, ok := s.oomKills(); ok && counted && code == 128+int(syscall.SIGKILL) && n > before {
		oom = true
	}
	_, wait, err = s.w.AppendAsync(audit.ProcessExited{ProcessID: id, ExitCode: code, OOMKilled: oom})
	return oom, wait, err
}

// Processes lists the running processes' ids and host pids.
func (s *Session) Processes() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := map[string]int{}
	for id, p := range s.running {
		m[id] = p.HostPID()
	}
	return m
}

// journalFault ends the run after a process record the session wrote
// failed (err is what Append, AppendAsync or its wait returned): through
// the broker, so that it stops all effects (its tunnels and streams
// included) before the supervisor or moat run tears the sandbox down,
// and reports the reason on s.fatal as for its own records. A journal
// that is closed or already terminated means the session is ending:
// nothing to do. A full journal (audit.max_bytes or the record limit)
// ends the run with journal_limit; a failed write or sync poisons the
// journal and ends it with audit_failure.
func (s *Session) journalFault(what string, err error) {
	if errors.Is(err, audit.ErrClosed) || errors.Is(err, audit.ErrTerminated) {
		return
	}
	full := errors.Is(err, audit.ErrJournalFull) || errors.Is(err, audit.ErrTooManyRecords)
	err = fmt.Errorf("%s: %w", what, err)
	if s.brk != nil {
		s.brk.JournalFailed(full, err)
		return
	}
	reason := broker.ReasonAuditFailure
	if full {
		reason = broker.ReasonJournalLimit
	}
	select {
	case s.fatal <- Fatal{Reason: string(reason), Msg: err.Error()}:
	default:
	}
}

func (s *Session) brokerFailed() error {
	if s.brk == nil {
		return nil
	}
	return s.brk.Failed()
}

// Failed returns the broker's fatal error, if effects were stopped.
func (s *Session) Failed() error { return s.brokerFailed() }

// Counts returns the journal's counts so far.
func (s *Session) Counts() audit.Counts { return s.w.Counts() }

// Close terminates every process, stops the broker, writes run.terminated
// with reason and code, and releases everything. It is idempotent.
func (s *Session) Close(code int, reason audit.TerminalReason) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	s.mu.Unlock()
	if s.brk != nil {
		// Close waits for the completion records still syncing; one that
		// fails here poisons the journal, and run.terminated below fails
		// to be written (the verifier reports the journal incomplete).
		// Only a failure during Close is said here: an earlier one was
		// reported when it ended the run.
		before := s.brk.Failed()
		s.brk.Close()
		if err := s.brk.Failed(); err != nil && before == nil {
			fmt.Fprintf(os.Stderr, "moat: run %s: the broker stopped: %v\n", s.RunID, err)
		}
	}
	s.tools.stop()
	if s.sb != nil {
		s.sb.Terminate()
	}
	if err := s.startRecord(); err != nil {
		fmt.Fprintf(os.Stderr, "moat: journal: could not write run.started: %v\n", err)
	}
	if _, err := s.w.Append(audit.RunTerminated{Reason: reason, ExitCode: code, Counts: s.w.Counts()}); err != nil {
		fmt.Fprintf(os.Stderr, "moat: journal: could not write the terminal record: %v\n", err)
	}
	s.w.Close()
	if s.stateDir != "" {
		if os.RemoveAll(s.stateDir) == nil {
			s.reaper.Done(s.stateDir)
		}
	}
	s.reaper.Close()
}

// inGrant reports whether p lies within one of the policy's grants.
func inGrant(pol *policy.Policy, p string) bool {
	for _, g := range append(append([]string{}, pol.Filesystem.ReadOnly...), pol.Filesystem.ReadWrite...) {
		if fsutil.Within(p, g) {
			return true
		}
	}
	return false
}

// limitsVerdict decides on the memory and pids limits the backend could
// not enforce: a refusal (msg) for a strict one (written in the policy,
// or process.limits.required), else a warning for a default one.
func limitsVerdict(want policy.Limits, got boundary.LimitsStatus) (msg, warn string) {
	var strict, soft []string
	if want.Memory > 0 && !got.Memory {
		if want.StrictMemory() {
			strict = append(strict, fmt.Sprintf("memory %s", want.Memory))
		} else {
			soft = append(soft, "memory")
		}
	}
	if want.Pids > 0 && !got.Pids {
		if want.StrictPids() {
			strict = append(strict, fmt.Sprintf("pids %d", want.Pids))
		} else {
			soft = append(soft, "pids")
		}
	}
	why := got.Detail
	if why == "" {
		why = "the backend does not enforce them"
	}
	if len(strict) > 0 {
		return fmt.Sprintf("process.limits %s cannot be enforced here (%s); run where moat can enforce it (as root, or rootless in a delegated cgroup v2 subtree: see moat doctor), or remove the limit from the policy", strings.Join(strict, ", "), why), ""
	}
	if len(soft) > 0 {
		return "", fmt.Sprintf("the default %s limit is not enforced here (%s); set process.limits.required: true to refuse such runs", strings.Join(soft, " and "), why)
	}
	return "", ""
}

// maxReasonBytes bounds a journaled failure text.
const maxReasonBytes = 1024

func truncateReason(s string) string {
	if len(s) <= maxReasonBytes {
		return s
	}
	s = s[:maxReasonBytes]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s + "…"
}
