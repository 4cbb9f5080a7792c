package broker

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/broker/wire"
	"github.com/moat-sandbox/moat/policy"
	"golang.org/x/sync/semaphore"
)

// Timeouts and connection limits of the front.
const (
	// IdleTimeout closes a keep-alive connection that sends nothing.
	IdleTimeout = 2 * time.Minute
	// RequestReadTimeout bounds reading one request, head and body, from its
	// first byte (slow clients are cut off).
	RequestReadTimeout = 30 * time.Second
	// WriteTimeout bounds each write to a worker that does not read.
	WriteTimeout = time.Minute
	// MaxConns caps concurrent worker connections. A connection past it
	// evicts an idle or the slowest arriving one (see evict.go); only when
	// all MaxConns are handling requests is the new one closed at once.
	MaxConns = 256
	// MaxBufferedBytes caps the request and response bytes that all
	// connections together may hold in the supervisor's memory (the
	// sandbox's memory limit does not cover the broker). A request that
	// cannot get its share within the read timeout is refused.
	MaxBufferedBytes = 256 << 20
	// bodyCopies is what one request body byte costs: the bytes read plus
	// the canonical copy that is forwarded.
	bodyCopies = 2
)

// ReasonBusy refuses a request while the broker's memory budget is spent.
const ReasonBusy Reason = "broker_busy"

// Run-wide caps. A workload must not be able to grow the journal (or the
// log) without bound: each refusal record is bounded by construction
// (MaxDetailBytes), the number of refusals by the policy's
// inference.max_refusals and the broker's journal bytes by audit.max_bytes.
// Past either cap the run ends, like after a reflected credential: the
// broker stops all effects and the supervisor is told through OnFatal with
// one of these reasons.
const (
	// ReasonRefusalLimit: the refusal past inference.max_refusals. It is
	// journaled; later refusals are answered but neither journaled nor
	// logged.
	ReasonRefusalLimit Reason = "refusal_limit"
	// ReasonJournalLimit: the broker's records reached audit.max_bytes.
	// After it no new request or refusal is journaled; the records that
	// close requests already in flight still are (at most MaxConns of
	// them, each bounded).
	ReasonJournalLimit Reason = "journal_limit"
	// MaxDetailBytes caps the detail of a refusal or failure: the message
	// the worker gets, its record and its log line. Client-supplied values
	// inside it are already cut to wire.MaxQuotedBytes plus their length
	// and sha256; this is the backstop for the whole message.
	MaxDetailBytes = 4 << 10
)

// Journal is where the broker writes its records. *audit.Writer implements
// it: Append returns the exact line once it is durable, and fails for ever
// after any error.
type Journal interface {
	Append(audit.Record) ([]byte, error)
}

// asyncJournal is a Journal that can also write a record now and make it
// durable later (*audit.Writer's AppendAsync). The broker uses it for
// completion records only; with a Journal without it, every record is
// durable before the broker goes on.
type asyncJournal interface {
	AppendAsync(audit.Record) (line []byte, wait func() error, err error)
}

// Config configures a Broker.
type Config struct {
	Policy     *policy.Policy // validated
	Journal    Journal
	Attributor boundary.Attributor // nil: every request is attributed "unavailable"
	// Tools, when set, serves every path under ToolsPathPrefix (/mcp/):
	// the tool gateway (broker/tools), reached through the same strict
	// front, with the connection's attribution (AttributionFrom).
	Tools http.Handler
	// Services, when set, serves every path under ServicesPathPrefix
	// (/svc/): the policy's egress.services (service.go).
	Services *Services
	// Packages, when set, serves every path under PackagesPathPrefix
	// (/pkg/): the policy's egress.packages (packages.go).
	Packages *Packages
	// Egress, when set, is the egress port's grants and guard
	// (egress.go): ServeEgress accepts CONNECT tunnels to granted hosts.
	Egress *Egress
	// AttributionUnavailable, when non-empty, says the backend is
	// endpoint-only; this reason is recorded on every request.
	AttributionUnavailable string
	// Credentials maps a provider name to its real secret. A provider
	// without one is refused at request time ("provider_unconfigured").
	Credentials map[string]string
	// OnFatal is called once when the run must be cancelled: a reflected
	// credential, a journal failure.
	OnFatal func(reason string, err error)
	// Upstream, when set, is the transport for every provider (tests).
	// Default: per provider, HTTPS with the system roots plus the
	// provider's ca_file, no proxy from the environment, plain http only to
	// loopback addresses.
	Upstream *http.Transport
	// Budget, when set, is the ledger shared with a parent sandbox
	// (budget.go): every inference request is reserved against it before
	// its pre-effect record and settled or kept before its last record.
	Budget Budget
	// Log receives the broker's lines (one canonical line per decision,
	// see the package doc); nil discards. Levels: Error for a fatal event
	// (the run ends), Warn for each refused or failed request, Info for
	// each completed request, Debug for each admitted request before it is
	// sent. The handler's level chooses which are printed (moat:
	// --log-level / MOAT_LOG); the journal has every request anyway.
	Log *slog.Logger
	// RunID and Sandbox (empty for moat run) name the run in the
	// principal of a request held for approval (approval.go).
	RunID, Sandbox string
	// WorkloadKey is the API key the workload holds (WorkloadEnvAt) and
	// must send: "" is Placeholder, for a listener only the sandbox can
	// reach. A per-sandbox key (NewWorkloadKey), for a listener others
	// can reach, is required on every request of every road, before any
	// effect (checkWorkloadKey). It is never journaled.
	WorkloadKey string
}

// Broker is the inference broker of one run.
type Broker struct {
	cfg       Config
	routes    map[string]*route // endpoint path → route
	maxReq    int64
	used      atomic.Int64 // reserved allowance
	log       *slog.Logger
	ctx       context.Context
	cancel    context.CancelFunc
	journal   atomic.Bool // false once the journal failed
	fatalMu   sync.Mutex
	fatalErr  error  // guarded by fatalMu; set once
	fatalCode Reason // guarded by fatalMu; the reason of fatalErr
	failed    atomic.Bool
	mem       *semaphore.Weighted // memLimit
	memLimit  int64               // MaxBufferedBytes; tests shrink it

	maxRefusals int64        // policy inference.max_refusals
	refusals    atomic.Int64 // refusals so far
	keyless     atomic.Int64 // refusals for want of the workload key (refuseKeyless)
	maxBytes    int64        // policy audit.max_bytes
	written     atomic.Int64 // bytes of the broker's journal lines, LF included

	evictions atomic.Int64 // connections evicted so far (tests, benchmarks)

	approvals *ApprovalDesk // nil: the policy holds no request (approval.go)

	// Timeouts, from the constants; tests shorten them.
	idleTimeout, readTimeout time.Duration

	mu     sync.Mutex // guards the fields below
	closed bool
	lns    []net.Listener
	conns  map[net.Conn]*connState
	wg     sync.WaitGroup
	// syncs counts the completion records whose durability is still
	// being waited for off their request's path (syncSoon).
	syncs sync.WaitGroup
}

// route is one endpoint of one API and the providers that serve it.
type route struct {
	api       string
	endpoint  string
	providers []*provider
	models    []string // union of the providers' models
}

// New checks cfg and builds a Broker. It does not listen.
func New(cfg Config) (*Broker, error) {
	if cfg.Policy == nil {
		return nil, errors.New("moat: broker: no policy")
	}
	if cfg.Journal == nil {
		return nil, errors.New("moat: broker: no journal")
	}
	if cfg.Policy.Inference.MaxRefusals < 0 || cfg.Policy.Audit.MaxBytes < policy.MinAuditMaxBytes {
		return nil, fmt.Errorf("moat: broker: policy not validated: inference.max_refusals %d, audit.max_bytes %d (want >= 0 and >= %d)",
			cfg.Policy.Inference.MaxRefusals, cfg.Policy.Audit.MaxBytes, int64(policy.MinAuditMaxBytes))
	}
	if err := checkWorkloadKeyConfig(cfg.WorkloadKey); err != nil {
		return nil, err
	}
	b := &Broker{cfg: cfg, routes: map[string]*route{}, maxReq: int64(cfg.Policy.Inference.MaxRequests),
		log: cfg.Log, conns: map[net.Conn]*connState{}, idleTimeout: IdleTimeout, readTimeout: RequestReadTimeout,
		maxRefusals: int64(cfg.Policy.Inference.MaxRefusals), maxBytes: int64(cfg.Policy.Audit.MaxBytes)}
	if b.log == nil {
		b.log = slog.New(slog.DiscardHandler)
	}
	b.ctx, b.cancel = context.WithCancel(context.Background())
	b.setMemLimit(MaxBufferedBytes)
	b.journal.Store(true)
	for _, api := range []string{wire.APIAnthropicMessages, wire.APIOpenAIChat, wire.APIOpenAIResponses} {
		var ps []*provider
		var models []string
		for i := range cfg.Policy.Inference.Providers {
			pp := &cfg.Policy.Inference.Providers[i]
			if pp.API != api {
				continue
			}
			p, err := newProvider(pp, cfg.Credentials[pp.Name], cfg.Upstream)
			if err != nil {
				return nil, err
			}
			ps = append(ps, p)
			for _, m := range pp.Models {
				if !slices.Contains(models, m) {
					models = append(models, m)
				}
			}
		}
		for _, ep := range wire.Endpoints(api) {
			if _, dup := b.routes[ep]; dup {
				return nil, fmt.Errorf("BUG: endpoint %q served by two APIs", ep)
			}
			b.routes[ep] = &route{api: api, endpoint: ep, providers: ps, models: models}
		}
	}
	for i := range cfg.Policy.Inference.Providers {
		pp := &cfg.Policy.Inference.Providers[i]
		if len(wire.Endpoints(pp.API)) == 0 {
			return nil, fmt.Errorf("moat: broker: provider %q has unknown api %q", pp.Name, pp.API)
		}
	}
	b.shareAccount()
	if len(cfg.Policy.Approvals.Rules) > 0 {
		b.approvals = newApprovalDesk(b)
	}
	return b, nil
}

// Serve accepts worker connections on l until Close. l is the listener
// created inside the sandbox's network namespace.
func (b *Broker) Serve(l net.Listener) error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		l.Close()
		return net.ErrClosed
	}
	b.lns = append(b.lns, l)
	b.mu.Unlock()
	var delay time.Duration
	for {
		c, err := l.Accept()
		if err != nil {
			b.mu.Lock()
			closed := b.closed
			b.mu.Unlock()
			if closed {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				time.Sleep(delay)
				continue
			}
			return fmt.Errorf("moat: broker: accept: %w", err)
		}
		delay = 0
		b.mu.Lock()
		if b.closed || len(b.conns) >= MaxConns && !b.makeRoomLocked() {
			b.mu.Unlock()
			c.Close()
			continue
		}
		st := newConnState(c)
		b.conns[c] = st
		b.wg.Add(1)
		b.mu.Unlock()
		go func() {
			defer b.wg.Done()
			defer func() {
				if !st.evicted() {
					lingerClose(c)
				}
				b.mu.Lock()
				if b.conns[c] == st {
					delete(b.conns, c)
				}
				b.mu.Unlock()
				c.Close()
			}()
			b.serveConn(st)
		}()
	}
}

// Linger after a refusal: closing a socket that still holds unread request
// bytes makes the kernel send a reset, which can destroy the refusal before
// the client reads it. So the write side is shut first, and what the
// client still sends is read and dropped for a moment (as net/http does).
const (
	lingerTime  = 500 * time.Millisecond
	lingerBytes = 256 << 10
)

func lingerClose(c net.Conn) {
	tc, ok := c.(interface{ CloseWrite() error })
	if !ok || tc.CloseWrite() != nil {
		return
	}
	c.SetReadDeadline(time.Now().Add(lingerTime))
	io.CopyN(io.Discard, c, lingerBytes)
}

// Close stops accepting, cancels upstream requests, closes every worker
// connection and waits for their handlers.
func (b *Broker) Close() error {
	b.mu.Lock()
	b.closed = true
	for _, l := range b.lns {
		l.Close()
	}
	for c := range b.conns {
		c.Close()
	}
	b.mu.Unlock()
	b.cancel()
	b.wg.Wait()
	b.syncs.Wait()
	return nil
}

// JournalFailed stops all effects after a record the broker did not write
// (a process record of the session's) failed: full is true when the
// journal reached its size or record limit (journal_limit), false when a
// write or sync failed (audit_failure, and nothing is journaled again).
// OnFatal is called as for the broker's own records; later calls, and
// calls after another fatal event, do nothing.
func (b *Broker) JournalFailed(full bool, err error) {
	if full {
		b.fatal(ReasonJournalLimit, err)
		return
	}
	b.journalFailed(err)
}

// Failed reports the fatal event that stopped all effects, or nil.
func (b *Broker) Failed() error {
	b.fatalMu.Lock()
	defer b.fatalMu.Unlock()
	return b.fatalErr
}

// fatal records the first fatal event, stops all further effects and tells
// the supervisor. Later calls do nothing.
func (b *Broker) fatal(reason Reason, err error) {
	b.fatalMu.Lock()
	first := b.fatalErr == nil
	if first {
		b.fatalErr, b.fatalCode = fmt.Errorf("%s: %w", reason, err), reason
		b.failed.Store(true)
	}
	b.fatalMu.Unlock()
	if !first {
		return
	}
	b.log.LogAttrs(context.Background(), slog.LevelError, "moat.broker fatal",
		slog.String("reason", string(reason)), slog.String("detail", err.Error()))
	if b.cfg.OnFatal != nil {
		b.cfg.OnFatal(string(reason), err)
	}
}

// append writes rec, or reports false after turning a failure into the
// run's fatal event. Once the journal failed nothing is written again.
// Once the broker's records reached audit.max_bytes, records that start
// something (a request, a refusal) are no longer written.
func (b *Broker) append(rec audit.Record) ([]byte, bool) {
	line, wait, ok := b.appendAsync(rec, false)
	if ok && wait != nil {
		ok = b.synced(wait)
	}
	return line, ok
}

// appendAsync is append for a record that may become durable after the
// call: with async and an asyncJournal, it returns once the line is
// written in its place, and wait (nil when there is nothing to wait for)
// makes it durable; the caller hands it to syncSoon (or synced). Only
// completion records are written so (see doc.go: why the answer may be
// released before its record is durable).
func (b *Broker) appendAsync(rec audit.Record, async bool) (line []byte, wait func() error, ok bool) {
	if !b.journal.Load() {
		return nil, nil, false
	}
	switch r := rec.(type) {
	case audit.InferenceRequested, audit.InferenceRefused, audit.ToolRequested, audit.ToolRefused, audit.EgressOpened, audit.EgressRefused:
		if b.written.Load() >= b.maxBytes {
			b.journalFull()
			return nil, nil, false
		}
	case audit.InferenceFailed:
		r.Detail = wire.BoundTo(r.Detail, MaxDetailBytes)
		rec = r
	}
	var err error
	if aj, isAsync := b.cfg.Journal.(asyncJournal); async && isAsync {
		line, wait, err = aj.AppendAsync(rec)
	} else {
		line, err = b.cfg.Journal.Append(rec)
	}
	if err != nil {
		b.journalFailed(err)
		return nil, nil, false
	}
	if b.written.Add(int64(len(line))+1) >= b.maxBytes {
		b.journalFull()
	}
	return line, wait, true
}

// synced waits for a line written by appendAsync to be durable; a failure
// is the run's fatal event, as a failed append is.
func (b *Broker) synced(wait func() error) bool {
	if wait == nil {
		return true
	}
	if err := wait(); err != nil {
		b.journalFailed(err)
		return false
	}
	return true
}

// completionSyncDelay is how long a completion record may wait for
// another record's fsync to cover it before syncSoon syncs it itself.
const completionSyncDelay = 2 * time.Millisecond

// syncSoon makes a completion record durable off its request's path: the
// request is done once its answer is released, and its connection is
// read again at once. The record's wait runs completionSyncDelay later;
// by then the next record's fsync (such as the next request's pre-effect
// record, which is durable before anything leaves) has usually covered
// it, so that back-to-back requests cost one fsync each, not two, and
// the wait returns at once; otherwise the wait syncs it. A failure ends
// the run (audit_failure), as on any journal failure. Close waits for
// every such wait.
func (b *Broker) syncSoon(wait func() error) {
	if wait == nil {
		return
	}
	b.syncs.Add(1)
	time.AfterFunc(completionSyncDelay, func() {
		defer b.syncs.Done()
		b.synced(wait)
	})
}

func (b *Broker) journalFailed(err error) {
	b.journal.Store(false)
	b.fatal(ReasonAuditFailure, err)
}

func (b *Broker) journalFull() {
	b.fatal(ReasonJournalLimit, fmt.Errorf("the broker's journal records reached %d bytes, the policy's audit.max_bytes (%d); the run was ended so that the journal stays bounded: look at the journal for what made so many records, or raise audit.max_bytes if the workload needs more",
		b.written.Load(), b.maxBytes))
}

func (b *Broker) attribute(c net.Conn) audit.Attribution {
	switch {
	case b.cfg.AttributionUnavailable != "":
		return audit.Attribution{Status: boundary.AttributionUnavailable, Reason: b.cfg.AttributionUnavailable}
	case b.cfg.Attributor == nil:
		return audit.Attribution{Status: boundary.AttributionUnavailable, Reason: "no attributor configured"}
	}
	return b.cfg.Attributor.Attribute(c)
}

// conn is one worker connection.
type conn struct {
	c      net.Conn
	br     *bufio.Reader
	bw     *bufio.Writer
	charge *charge // the memory charged for the current request
}

// charge is one request's share of MaxBufferedBytes.
type charge struct {
	b        *Broker
	st       *connState // the connection it is charged to
	deadline time.Time
	n        int64
}

// take charges n body bytes (times bodyCopies), waiting until the deadline.
func (c *charge) take(n int64) error {
	return c.takeRaw(n * bodyCopies)
}

func (c *charge) takeRaw(n int64) error {
	if c.n+n > c.b.memLimit {
		return refuse(ReasonBodyTooLarge, 413, "the request and its response need more than %d bytes of broker memory", c.b.memLimit)
	}
	if !c.b.mem.TryAcquire(n) {
		// Requests that began to arrive earlier and still arrive are the
		// slow ones: make room by evicting them, then wait for what they
		// release (or for requests being handled to finish).
		c.b.evictForMemory(c.st, n)
		ctx, cancel := context.WithDeadline(c.b.ctx, c.deadline)
		defer cancel()
		if err := c.b.mem.Acquire(ctx, n); err != nil {
			return refuse(ReasonBusy, 503, "the broker is busy with other large requests; retry later")
		}
	}
	c.n += n
	c.st.held.Add(n)
	return nil
}

func (b *Broker) setMemLimit(n int64) {
	b.memLimit, b.mem = n, semaphore.NewWeighted(n)
}

func (c *charge) release() {
	if c.n > 0 {
		c.st.held.Add(-c.n)
		c.b.mem.Release(c.n)
		c.n = 0
	}
}

func (w *conn) Write(p []byte) (int, error) {
	w.c.SetWriteDeadline(time.Now().Add(WriteTimeout))
	return w.c.Write(p)
}

func (b *Broker) serveConn(st *connState) {
	c := st.c
	w := &conn{c: c, br: bufio.NewReaderSize(c, frontBufferBytes)}
	w.bw = bufio.NewWriter(w)
	for {
		c.SetReadDeadline(time.Now().Add(b.idleTimeout))
		if _, err := w.br.Peek(1); err != nil {
			return // closed, evicted or idle between requests: not a request
		}
		if !st.enter(phaseIdle, phaseReading) {
			return // evicted
		}
		deadline := time.Now().Add(b.readTimeout)
		c.SetReadDeadline(deadline)
		ch := &charge{b: b, st: st, deadline: deadline}
		x := b.newExchange(w)
		req, err := readRequest(w.br, w, ch.take)
		c.SetReadDeadline(time.Time{})
		if err == nil && !st.enter(phaseReading, phaseBusy) {
			err = io.ErrUnexpectedEOF // evicted just as the request was complete
		}
		if err != nil {
			ch.release()
			if st.evicted() {
				b.refuse(x, refuse(ReasonEvicted, 503,
					"the broker was at its connection or memory limit and this request was the slowest to arrive; it was dropped to admit another"))
				return
			}
			var fe *frontError
			if !errors.As(err, &fe) {
				return
			}
			b.refuse(x, fe)
			return
		}
		w.charge = ch
		keep := b.handle(x, req)
		ch.release()
		if !keep || req.close || !st.enter(phaseBusy, phaseIdle) {
			return
		}
	}
}

// exchange is one request as the broker decides it: made once, when the
// request begins to arrive, and filled in as it is routed, admitted and
// answered. Its journal records, its canonical log line and its answer
// are all made from it, so they name the same request the same way.
type exchange struct {
	w        *conn
	id       string
	start    time.Time
	api      string    // "" until routed
	endpoint string    // "" until routed
	provider *provider // nil until picked
	model    string    // "" until admitted
	stream   bool
	status   int // the HTTP status answered, 0 before the head is written

	att      audit.Attribution
	attKnown bool // att was resolved (once: attribution)
	budgeted bool // a Budget reservation is open (budget.go)
}

func (b *Broker) newExchange(w *conn) *exchange {
	return &exchange{w: w, id: newRequestID(), start: time.Now()}
}

// providerName is the picked provider's name, or "".
func (x *exchange) providerName() string {
	if x.provider == nil {
		return ""
	}
	return x.provider.name
}

// attribution resolves the connection's process once per request.
func (b *Broker) attribution(x *exchange) audit.Attribution {
	if !x.attKnown {
		x.att, x.attKnown = b.attribute(x.w.c), true
	}
	return x.att
}

// Decisions: the canonical log line of a request is "moat.broker" and
// one of these, with the fields of logDecision, always the same and in the
// same order (smokescreen's CANONICAL-PROXY-DECISION is the model). A
// request has at most one admitted line (Debug, before it is sent) and
// exactly one line that ends it: completed (Info), refused or failed
// (Warn). The run's fatal event is one line of its own (Error).
const (
	decisionAdmitted  = "admitted"
	decisionCompleted = "completed"
	decisionRefused   = "refused"
	decisionFailed    = "failed"
)

// logDecision writes the canonical line of x. reason is "" for admitted
// and completed; detail is the message the worker got, prefixed.
func (b *Broker) logDecision(x *exchange, level slog.Level, decision string, reason Reason, detail string) {
	if !b.log.Enabled(context.Background(), level) {
		return
	}
	att := "unresolved"
	pid := 0
	if x.attKnown {
		att, pid = string(x.att.Status), x.att.PID
	}
	b.log.LogAttrs(context.Background(), level, "moat.broker "+decision,
		slog.String("request_id", x.id),
		slog.String("reason", string(reason)),
		slog.String("api", x.api),
		slog.String("endpoint", x.endpoint),
		slog.String("provider", x.providerName()),
		slog.String("model", x.model),
		slog.Bool("stream", x.stream),
		slog.Int("status", x.status),
		slog.String("attribution", att),
		slog.Int("pid", pid),
		slog.Float64("duration_ms", float64(time.Since(x.start).Microseconds())/1000),
		slog.String("detail", detail),
	)
}

// handle serves one framed request and reports whether the connection
// may be kept.
func (b *Broker) handle(x *exchange, req *request) bool {
	if fe := checkWorkloadKey(b.workloadKey(), req); fe != nil {
		return b.refuseKeyless(x, fe)
	}
	if b.cfg.Tools != nil && strings.HasPrefix(req.path, ToolsPathPrefix) {
		return b.serveTools(x, req)
	}
	if b.cfg.Services != nil && strings.HasPrefix(req.path, ServicesPathPrefix) {
		return b.serveService(x, req)
	}
	if b.cfg.Packages != nil && strings.HasPrefix(req.path, PackagesPathPrefix) {
		return b.servePackage(x, req)
	}
	rt, ok := b.routes[req.path]
	if !ok {
		return b.refuse(x, refuse(ReasonPathNotAllowed, 404,
			"path %s is not served; moat serves %s", quote(req.path), strings.Join(b.endpoints(), ", ")))
	}
	x.api, x.endpoint = rt.api, rt.endpoint
	if req.method != http.MethodPost {
		return b.refuse(x, refuse(ReasonMethod, 405, "method %s is not allowed on %s; use POST", quote(req.method), rt.endpoint))
	}
	if b.failed.Load() {
		return b.refuse(x, refuse(ReasonRunFailed, 503, "the run was stopped after a fatal event (%s); no further requests are possible", b.fatalReason()))
	}
	if len(rt.providers) == 0 {
		return b.refuse(x, refuse(ReasonAPINotConfigured, 404, "the policy configures no provider for the %s API (endpoint %s)", rt.api, rt.endpoint))
	}
	fwd, fe := checkHeaders(rt.api, b.workloadKey(), req)
	if fe != nil {
		return b.refuse(x, fe)
	}
	adm, rf := wire.Admit(rt.api, rt.endpoint, req.body, wire.Limits{Models: rt.models, MaxOutputTokens: b.cfg.Policy.Inference.MaxOutputTokens})
	switch {
	case rf != nil && rf.Code == wire.ReasonInternal:
		return b.refuse(x, &frontError{Code: rf.Code, Status: 500, Msg: rf.Message})
	case rf != nil:
		return b.refuse(x, &frontError{Code: rf.Code, Status: 400, Msg: rf.Message})
	case adm == nil:
		return b.refuse(x, refuse(ReasonInternal, 500, "BUG: admission returned neither a request nor a refusal"))
	}
	x.model, x.stream = adm.Model, adm.Stream
	p := rt.pick(adm.Model)
	if p == nil {
		return b.refuse(x, refuse(ReasonInternal, 500, "BUG: admitted model %q has no provider", adm.Model))
	}
	x.provider = p
	if p.cred == "" {
		return b.refuse(x, refuse(ReasonProviderUnconfigured, 503,
			"provider %q has no credential: the operator must set %s in moat's environment", p.name, p.credEnv))
	}
	att := b.attribution(x)
	if b.cfg.Policy.Inference.RequireAttribution && att.Status != boundary.AttributionResolved {
		return b.refuse(x, refuse(ReasonUnattributed, 403,
			"the policy requires every request to be attributed to a process, and this connection could not be (%s)", wire.Bound(att.Reason)))
	}
	if !b.reserve() {
		return b.refuse(x, refuse(ReasonAllowanceExhausted, 429,
			"the run's request allowance (max_requests %d) is used up; no further model requests are possible in this run", b.maxReq))
	}
	if d := b.approvals; d != nil && b.cfg.Policy.Approvals.MatchInference(p.name, adm.Model, adm.MaxTokens) {
		if fe := d.hold(x, policy.RoadInference, p.name, adm.Model, adm.Canonical); fe != nil {
			return b.refuse(x, fe)
		}
	}
	b.logDecision(x, slog.LevelDebug, decisionAdmitted, "", "")
	return b.forward(x, req, adm, fwd)
}

// fatalReason names the fatal event for the worker: its reason code only.
// The cause (a journal error names host paths) is in the log and in
// Failed, not in what the sandbox gets.
func (b *Broker) fatalReason() Reason {
	b.fatalMu.Lock()
	defer b.fatalMu.Unlock()
	return b.fatalCode
}

// reserve takes one unit of the run's allowance; a reservation is never
// returned, even when the request fails later.
func (b *Broker) reserve() bool {
	for {
		n := b.used.Load()
		if n >= b.maxReq {
			return false
		}
		if b.used.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

func (b *Broker) endpoints() []string {
	var eps []string
	for ep, rt := range b.routes {
		if len(rt.providers) > 0 {
			eps = append(eps, ep)
		}
	}
	slices.Sort(eps)
	if len(eps) == 0 {
		return []string{"nothing (the policy configures no provider)"}
	}
	return eps
}

// pick chooses the provider for model: the first, in policy order, that
// lists it.
func (rt *route) pick(model string) *provider {
	for _, p := range rt.providers {
		if slices.Contains(p.models, model) {
			return p
		}
	}
	return nil
}

// Reason is why the broker refused or failed a request: the reason of its
// inference.refused or inference.failed record, its Moat-Reason header,
// the API error's code and the log line's reason. It is broker/wire's
// type, so that the front, the header policy, admission and the upstream
// stage name their decisions with one type.
type Reason = wire.Reason

// Reasons decided by the broker after framing.
const (
	ReasonPathNotAllowed       Reason = "path_not_allowed"
	ReasonMethod               Reason = "method_not_allowed"
	ReasonAPINotConfigured     Reason = "api_not_configured"
	ReasonProviderUnconfigured Reason = "provider_unconfigured"
	ReasonAllowanceExhausted   Reason = "allowance_exhausted"
	ReasonRunFailed            Reason = "run_failed"
	ReasonUnattributed         Reason = "unattributed"      // require_attribution and the connection's process is unknown
	ReasonInternal                    = wire.ReasonInternal // a bug in moat, never blamed on the client
)

// refusalPrefix starts every refusal the worker, the journal and the log
// get. Messages inside moat (frontError.Msg, wire.Refusal.Message) carry
// none; refuse adds it here, once.
const refusalPrefix = "moat: refused: "

// refuse journals an inference.refused record, logs its canonical line
// and answers in the API's shape; the connection is then closed (it
// reports false, for handle). The refusal past inference.max_refusals
// ends the run; later ones are only answered.
func (b *Broker) refuse(x *exchange, fe *frontError) bool {
	// The journal takes valid UTF-8 only, and a bounded detail.
	msg := wire.BoundTo(refusalPrefix+fe.Msg, MaxDetailBytes)
	x.status = fe.Status
	switch n := b.refusals.Add(1); {
	case n <= b.maxRefusals+1:
		rec := audit.InferenceRefused{RequestID: x.id, Reason: string(fe.Code), Detail: msg,
			Provider: x.providerName(), Endpoint: x.endpoint, Attribution: b.attribution(x)}
		b.logDecision(x, slog.LevelWarn, decisionRefused, fe.Code, msg)
		b.append(rec) // a no-op once the journal failed
		if n == b.maxRefusals+1 {
			b.fatal(ReasonRefusalLimit, fmt.Errorf("the broker refused %d requests, more than the policy's inference.max_refusals (%d); the run was ended so that refusals cannot fill the journal: read the refusals in the journal and fix the workload's requests, or raise inference.max_refusals",
				n, b.maxRefusals))
		}
	case n == b.maxRefusals+2:
		b.logDecision(x, slog.LevelWarn, decisionRefused, fe.Code, "refusals past inference.max_refusals are answered but neither journaled nor logged")
	}
	writeError(x.w.bw, x.api, fe.Status, fe.Code, msg, x.id)
	return false
}

// Refusals for want of the workload key. With a per-sandbox key
// (Config.WorkloadKey) the listener can be reached by others than the
// sandbox, and a request without the key may come from any of them: on
// Kubernetes, a neighbour Pod forging the sandbox's address. Such a
// refusal does not count toward inference.max_refusals, or a neighbour
// could end the sandbox's run by sending keyless requests. Its cost is
// bounded instead: the first keylessJournaled are journaled and logged
// as any refusal is; after them only the n-th for n a power of two, its
// detail giving n, so a flood of them grows the journal and the log by a
// few records per doubling. A workload that holds the key and sends bad
// requests still ends its run at inference.max_refusals; only requests
// without the key are counted here.
const keylessJournaled = 32

// refuseKeyless refuses a request that did not carry the workload key
// (checkWorkloadKey) as refuse does, except that it is not counted toward
// inference.max_refusals and only some of them are journaled.
func (b *Broker) refuseKeyless(x *exchange, fe *frontError) bool {
	msg := wire.BoundTo(refusalPrefix+fe.Msg, MaxDetailBytes)
	x.status = fe.Status
	n := b.keyless.Add(1)
	if n <= keylessJournaled || n&(n-1) == 0 {
		detail := msg
		if n >= keylessJournaled {
			detail = wire.BoundTo(fmt.Sprintf("%s (request %d without this sandbox's broker key; they do not count toward inference.max_refusals, and after the first %d only the n-th for n a power of two is journaled)",
				msg, n, keylessJournaled), MaxDetailBytes)
		}
		b.logDecision(x, slog.LevelWarn, decisionRefused, fe.Code, detail)
		b.append(audit.InferenceRefused{RequestID: x.id, Reason: string(fe.Code), Detail: detail,
			Provider: x.providerName(), Endpoint: x.endpoint, Attribution: b.attribution(x)})
	}
	writeError(x.w.bw, x.api, fe.Status, fe.Code, msg, x.id)
	return false
}

func newRequestID() string {
	const prefix = "moatreq_"
	var r [12]byte
	rand.Read(r[:])
	var s [len(prefix) + 2*len(r)]byte
	copy(s[:], prefix)
	hex.Encode(s[len(prefix):], r[:])
	return string(s[:])
}
