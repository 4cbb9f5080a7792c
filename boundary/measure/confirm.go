package measure

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/internal/exehash"
	"github.com/moat-sandbox/moat/internal/fsutil"
)

// Limits and timeouts of the host side.
const (
	// ConfirmTimeout bounds a whole measurement when ctx allows longer.
	ConfirmTimeout = 60 * time.Second
	// killGrace is how long Confirm waits for a killed helper to be reaped.
	killGrace = 5 * time.Second
	// maxMeasureConns bounds the connections accepted during a measurement.
	maxMeasureConns = 16
	// connTimeout bounds one broker connection of the helper.
	connTimeout = 10 * time.Second
	// maxGreetingBytes bounds the helper's greeting line.
	maxGreetingBytes = 128
	// maxStderrBytes bounds the helper's stderr kept for diagnostics.
	maxStderrBytes = 4 << 10
)

// greeting is what the helper sends on its broker connection, followed by
// the plan's nonce and LF; the host answers brokerAck.
const (
	greeting  = "moat-measure "
	brokerAck = "ok\n"
)

// Confirm measures sb's properties from inside it and returns them with the
// full report. Properties are enforced only as measured; sb.Mechanisms only
// fills in the Mechanism fields.
//
// Confirm accepts on a duplicate of the broker's listener and closes only
// that duplicate: the listener itself stays open for the broker.
//
// An error means the measurement could not be run or did not finish (no
// listener, a bad Config, the helper could not start, ctx ended); the
// returned properties are then all not enforced. A helper that ran but
// produced no valid report is not an error: its properties are simply not
// enforced, and the report says why.
func Confirm(ctx context.Context, sb boundary.Sandbox, cfg Config) (boundary.Properties, *Report, error) {
	ctx, cancel := context.WithTimeout(ctx, ConfirmTimeout)
	defer cancel()
	mech := sb.Mechanisms()
	props := withMechanisms(boundary.Properties{}, mech)

	li, err := sb.Listener()
	if err != nil {
		return props, nil, fmt.Errorf("measure: the sandbox has no broker listener: %w", err)
	}
	if li.File == nil {
		return props, nil, errors.New("measure: BUG: the sandbox's broker listener has no file")
	}
	// The broker's address is the listener's: a sandbox whose broker is
	// off its own network (li.Host) is measured as one (Config.BrokerHost).
	if cfg.BrokerHost == "" {
		cfg.BrokerHost = li.Host
	}
	if cfg.BrokerHost != li.Host {
		li.File.Close()
		return props, nil, fmt.Errorf("measure: broker host %q differs from the sandbox listener's host %q", cfg.BrokerHost, li.Host)
	}
	if err := cfg.validate(li.Port); err != nil {
		return props, nil, err
	}
	nonce := make([]byte, 16)
	rand.Read(nonce)
	// The sandbox's /tmp is writable by design; a sentinel in the host's
	// /tmp shows that it is not the host's.
	if tmpSentinel, err := plantTmpSentinel(); err == nil {
		defer os.Remove(tmpSentinel)
		cfg.HostSecrets = append(slices.Clip(cfg.HostSecrets), tmpSentinel)
	}
	recv := startReceivers(&cfg, hex.EncodeToString(nonce))
	defer recv.stop()
	pl, err := buildPlan(cfg, hex.EncodeToString(nonce))
	if err != nil {
		return props, nil, err
	}
	arg, err := encodePlan(pl)
	if err != nil {
		return props, nil, err
	}
	ln, err := net.FileListener(li.File) // a dup; li.File stays open
	if err != nil {
		return props, nil, fmt.Errorf("measure: using the broker listener: %w", err)
	}
	// What the helper may leave in the read-write grants if moat is
	// killed mid-measurement is the reaper's before it exists.
	for i, p := range pl.Probes {
		if p.Op == opWrite && slices.ContainsFunc(cfg.ReadWrite, func(g string) bool { return fsutil.Within(p.Path, g) }) {
			f := filepath.Join(p.Path, probeFileName(pl.Nonce, i))
			cfg.Reaper.OwnFile(f)
			defer cfg.Reaper.Done(f)
		}
	}
	obs := &observer{ln: ln, nonce: pl.Nonce, attr: sb.Attributor(), admit: li.Admit, done: make(chan struct{})}
	go obs.run()

	stdout := &capBuffer{max: MaxReportBytes}
	stderr := &capBuffer{max: maxStderrBytes}
	// The helper waits for its stdin to close before it exits, so that it
	// is still there (not reaped) when the backend reads its host pid.
	stdinR, stdinW := io.Pipe()
	run, err := sb.StartHelper(ctx, []string{Helper, arg}, boundary.Process{
		Env: []string{}, Dir: "/", Stdin: stdinR, Stdout: stdout, Stderr: stderr,
	})
	if err != nil {
		stdinW.Close()
		obs.stop()
		return props, nil, fmt.Errorf("measure: starting the measurement helper: %w", err)
	}
	helperPID := run.HostPID()
	stdinW.Close()
	code, finished, waitErr := waitHelper(ctx, run)
	conns := obs.stop()
	// moat's own sum is taken only now: its caller may be hashing the
	// same binary while the helper runs (moat run does, for run.started),
	// and exehash then shares that one hash instead of reading it again.
	moatSum, err := selfSHA256()
	if err != nil {
		return props, nil, fmt.Errorf("measure: hashing moat's own binary: %w", err)
	}

	rep := &Report{}
	results, repErr := decodeReport(stdout.Bytes(), pl)
	switch {
	case !finished:
		repErr = fmt.Errorf("the helper did not finish: %w", ctx.Err())
	case waitErr != nil:
		repErr = fmt.Errorf("waiting for the helper: %w", waitErr)
	case repErr == nil && code != 0:
		repErr = fmt.Errorf("the helper exited with code %d", code)
	}
	if repErr != nil {
		results = nil
		if s := strings.TrimSpace(stderr.String()); s != "" {
			repErr = fmt.Errorf("%w (helper stderr: %s)", repErr, s)
		}
	}
	for _, p := range pl.Probes {
		c := Check{Property: p.property, Name: p.ID, Kind: p.kind, Outcome: OutcomeMissing}
		if r, ok := results[p.ID]; ok {
			c.Outcome, c.Detail = r.Outcome, r.Detail
		} else if repErr != nil {
			c.Detail = truncate("no valid report: " + repErr.Error())
		} else {
			c.Detail = "the helper's report has no result for this check"
		}
		c.OK = judge(c.Kind, c.Outcome)
		rep.Checks = append(rep.Checks, c)
	}
	rep.Checks = append(rep.Checks, hostChecks(conns, helperPID, moatSum)...)
	rep.Checks = append(rep.Checks, recv.stop())

	props = decide(rep, mech, cfg.RequireAttribution)
	if !finished {
		err := fmt.Errorf("measure: the measurement did not finish: %w", ctx.Err())
		for _, np := range props.Named() {
			np.Enforced, np.Detail = false, err.Error()
		}
		return props, rep, err
	}
	return props, rep, nil
}

// withMechanisms copies the declared mechanisms into p.
func withMechanisms(p boundary.Properties, m boundary.Mechanisms) boundary.Properties {
	p.FilesystemConfinement.Mechanism = m.FilesystemConfinement
	p.EgressInterception.Mechanism = m.EgressInterception
	p.RequestAttribution.Mechanism = m.RequestAttribution
	p.PrivilegeFloor.Mechanism = m.PrivilegeFloor
	return p
}

// decide computes the properties from the checks alone.
func decide(rep *Report, mech boundary.Mechanisms, requireAttribution bool) boundary.Properties {
	props := withMechanisms(boundary.Properties{}, mech)
	for _, np := range props.Named() {
		var bad []string
		violations, controls := 0, 0
		for _, c := range rep.Checks {
			if c.Property != np.Name {
				continue
			}
			if c.Kind == KindControl {
				controls++
			} else {
				violations++
			}
			if !c.OK {
				bad = append(bad, describe(c))
			}
		}
		switch {
		case len(bad) > 0:
			np.Detail = truncate(fmt.Sprintf("%d of %d checks not as required: %s", len(bad), violations+controls, strings.Join(bad, "; ")))
		case controls == 0:
			np.Detail = "no positive control was measured (e.g. no filesystem grant), so the violations prove nothing"
		default:
			np.Enforced = true
			np.Detail = fmt.Sprintf("%d violations failed, %d controls succeeded", violations, controls)
		}
	}
	if r := mech.AttributionUnavailable; r != "" {
		a := &props.RequestAttribution
		a.Enforced, a.Unavailable = false, true
		a.Detail = "the backend declares attribution unavailable (endpoint-only): " + r
		if requireAttribution {
			a.Detail += "; the policy requires it (inference.require_attribution: true)"
		}
	}
	return props
}

func describe(c Check) string {
	what := "violation " + c.Name + " " + c.Outcome
	if c.Kind == KindControl {
		what = "control " + c.Name + " " + c.Outcome
	}
	if c.Detail != "" {
		what += " (" + c.Detail + ")"
	}
	return what
}

// waitHelper waits for the helper, killing it when ctx ends.
func waitHelper(ctx context.Context, run boundary.Running) (code int, finished bool, err error) {
	type res struct {
		code int
		err  error
	}
	ch := make(chan res, 1)
	go func() {
		c, e := run.Wait()
		ch <- res{c, e}
	}()
	select {
	case r := <-ch:
		return r.code, true, r.err
	case <-ctx.Done():
	}
	run.Signal(syscall.SIGKILL)
	select {
	case r := <-ch:
		return r.code, false, r.err
	case <-time.After(killGrace):
		return -1, false, errors.New("the helper did not exit after SIGKILL")
	}
}

// Host-side check names.
const (
	checkBrokerSeen  = "net/broker-seen-by-host"
	checkAttribution = "attrib/broker-connection"
	checkReceivers   = "net/host-receivers"
)

// hostChecks judges what the host observed on the broker listener.
func hostChecks(conns []connObs, helperPID int, moatSum string) []Check {
	seen := Check{Property: PropEgress, Name: checkBrokerSeen, Kind: KindControl, Outcome: OutcomeFailed}
	attr := Check{Property: PropAttribution, Name: checkAttribution, Kind: KindControl, Outcome: OutcomeFailed,
		Detail: "no broker connection carrying this run's nonce was seen"}
	var ours *connObs
	for i := range conns {
		if conns[i].nonceOK {
			ours = &conns[i]
			break
		}
	}
	if ours == nil {
		seen.Detail = fmt.Sprintf("accepted %d connections, none carrying this run's nonce", len(conns))
	} else {
		seen.Outcome = OutcomeSucceeded
		seen.Detail = fmt.Sprintf("accepted %d connections; the helper's came from %s", len(conns), ours.remote)
		a := ours.attribution
		switch {
		case a.Status != boundary.AttributionResolved:
			attr.Detail = fmt.Sprintf("attribution %q: %s", a.Status, a.Reason)
		case a.PID != helperPID:
			attr.Detail = fmt.Sprintf("attributed to pid %d, but the helper is pid %d", a.PID, helperPID)
		case a.SHA256 != moatSum:
			attr.Detail = fmt.Sprintf("attributed to executable %s with sha256 %s, but moat's binary has sha256 %s", a.Executable, a.SHA256, moatSum)
		default:
			attr.Outcome = OutcomeSucceeded
			attr.Detail = fmt.Sprintf("pid %d, %s, sha256 %s", a.PID, a.Executable, a.SHA256)
		}
	}
	seen.OK = judge(seen.Kind, seen.Outcome)
	attr.OK = judge(attr.Kind, attr.Outcome)
	seen.Detail, attr.Detail = truncate(seen.Detail), truncate(attr.Detail)
	return []Check{seen, attr}
}

// connObs is one broker connection accepted during the measurement.
type connObs struct {
	remote      string
	nonceOK     bool
	attribution boundary.Attribution
}

// observer accepts the helper's broker connections.
type observer struct {
	ln    net.Listener
	nonce string
	attr  boundary.Attributor
	admit func(net.Addr) error // the listener's (boundary.ListenerInfo.Admit); nil admits all
	done  chan struct{}

	mu    sync.Mutex
	conns []connObs
}

func (o *observer) run() {
	defer close(o.done)
	for n := 0; ; n++ {
		c, err := o.ln.Accept()
		if err != nil {
			return
		}
		if n >= maxMeasureConns {
			c.Close()
			continue
		}
		ob := o.handle(c)
		o.mu.Lock()
		o.conns = append(o.conns, ob)
		o.mu.Unlock()
	}
}

// handle reads the greeting, attributes the connection while the helper
// still holds it, then answers.
func (o *observer) handle(c net.Conn) connObs {
	defer c.Close()
	ob := connObs{remote: c.RemoteAddr().String()}
	if o.admit != nil && o.admit(c.RemoteAddr()) != nil {
		return ob // not the sandbox's: never the helper's connection
	}
	c.SetDeadline(time.Now().Add(connTimeout))
	line, err := bufio.NewReaderSize(io.LimitReader(c, maxGreetingBytes), maxGreetingBytes).ReadString('\n')
	if err != nil || line != greeting+o.nonce+"\n" {
		return ob
	}
	ob.nonceOK = true
	if o.attr == nil {
		ob.attribution = boundary.Attribution{Status: boundary.AttributionUnavailable, Reason: "BUG: the backend has no attributor"}
	} else {
		ob.attribution = o.attr.Attribute(c)
	}
	c.Write([]byte(brokerAck))
	return ob
}

// stop closes the duplicate listener and returns what was observed.
func (o *observer) stop() []connObs {
	o.ln.Close()
	<-o.done
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.conns
}

// capBuffer keeps at most max bytes and remembers that it overflowed (then
// its content is invalid as a report: one byte past max).
type capBuffer struct {
	max int

	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *capBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.max + 1 - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (b *capBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Clone(b.buf.Bytes())
}

func (b *capBuffer) String() string { return string(b.Bytes()) }

// plantTmpSentinel creates a world-readable file in the host's /tmp.
func plantTmpSentinel() (string, error) {
	f, err := os.CreateTemp(sandboxTmp, ".moat-measure-sentinel-")
	if err != nil {
		return "", err
	}
	defer f.Close()
	if _, err := f.WriteString("moat measurement sentinel: the sandbox must not read this\n"); err != nil {
		os.Remove(f.Name())
		return "", err
	}
	if err := f.Chmod(0o644); err != nil {
		os.Remove(f.Name())
		return "", err
	}
	return f.Name(), nil
}

// selfSHA256 hashes moat's own executable, the file the helper runs
// (once per version and process: see internal/exehash).
func selfSHA256() (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	return exehash.File(exe, 1<<40)
}
