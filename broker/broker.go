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
const ReasonBusy = "broker_busy"

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
	ReasonRefusalLimit = "refusal_limit"
	// ReasonJournalLimit: the broker's records reached audit.max_bytes.
	// After it no new request or refusal is journaled; the records that
	// close requests already in flight still are (at most MaxConns of
	// them, each bounded).
	ReasonJournalLimit = "journal_limit"
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

// Config configures a Broker.
type Config struct {
	Policy     *policy.Policy // validated
	Journal    Journal
	Attributor boundary.Attributor // nil: every request is attributed "unavailable"
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
	// Log receives the broker's lines; nil discards. Levels: Error for a
	// fatal event (the run ends), Warn for each refused or failed request,
	// Info for each completed request, Debug for each admitted request
	// before it is sent. The handler's level chooses which are printed
	// (moat: --log-level / MOAT_LOG); the journal has every request anyway.
	Log *slog.Logger
}

// Broker is the inference broker of one run.
type Broker struct {
	cfg      Config
	routes   map[string]*route // endpoint path → route
	maxReq   int64
	used     atomic.Int64 // reserved allowance
	log      *slog.Logger
	ctx      context.Context
	cancel   context.CancelFunc
	journal  atomic.Bool // false once the journal failed
	fatalMu  sync.Mutex
	fatalErr error // guarded by fatalMu; set once
	failed   atomic.Bool
	mem      *semaphore.Weighted // memLimit
	memLimit int64               // MaxBufferedBytes; tests shrink it

	maxRefusals int64        // policy inference.max_refusals
	refusals    atomic.Int64 // refusals so far
	maxBytes    int64        // policy audit.max_bytes
	written     atomic.Int64 // bytes of the broker's journal lines, LF included

	evictions atomic.Int64 // connections evicted so far (tests, benchmarks)

	// fwdHeaders maps the id of a request being forwarded to the worker
	// headers sent with it (name → canonical value); append writes them
	// into the request's pre-effect record.
	fwdHeaders sync.Map

	// Timeouts, from the constants; tests shorten them.
	idleTimeout, readTimeout time.Duration

	mu     sync.Mutex // guards the fields below
	closed bool
	lns    []net.Listener
	conns  map[net.Conn]*connState
	wg     sync.WaitGroup
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
	return nil
}

// Failed reports the fatal event that stopped all effects, or nil.
func (b *Broker) Failed() error {
	b.fatalMu.Lock()
	defer b.fatalMu.Unlock()
	return b.fatalErr
}

// fatal records the first fatal event, stops all further effects and tells
// the supervisor. Later calls do nothing.
func (b *Broker) fatal(reason string, err error) {
	b.fatalMu.Lock()
	first := b.fatalErr == nil
	if first {
		b.fatalErr = fmt.Errorf("%s: %w", reason, err)
		b.failed.Store(true)
	}
	b.fatalMu.Unlock()
	if !first {
		return
	}
	b.log.Error("moat.broker fatal", "reason", reason, "error", err.Error())
	if b.cfg.OnFatal != nil {
		b.cfg.OnFatal(reason, err)
	}
}

// append writes rec, or reports false after turning a failure into the
// run's fatal event. Once the journal failed nothing is written again.
// Once the broker's records reached audit.max_bytes, records that start
// something (a request, a refusal) are no longer written.
func (b *Broker) append(rec audit.Record) ([]byte, bool) {
	if !b.journal.Load() {
		return nil, false
	}
	switch r := rec.(type) {
	case audit.InferenceRequested:
		if b.written.Load() >= b.maxBytes {
			b.journalFull()
			return nil, false
		}
		if h, ok := b.fwdHeaders.Load(r.RequestID); ok && len(h.(map[string]string)) > 0 {
			r.Headers = h.(map[string]string)
			rec = r
		}
	case audit.InferenceRefused:
		if b.written.Load() >= b.maxBytes {
			b.journalFull()
			return nil, false
		}
	case audit.InferenceFailed:
		r.Detail = wire.BoundTo(r.Detail, MaxDetailBytes)
		rec = r
	}
	line, err := b.cfg.Journal.Append(rec)
	if err != nil {
		b.journal.Store(false)
		b.fatal("audit_failure", err)
		return nil, false
	}
	if b.written.Add(int64(len(line))+1) >= b.maxBytes {
		b.journalFull()
	}
	return line, true
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
		req, err := readRequest(w.br, w, ch.take)
		c.SetReadDeadline(time.Time{})
		if err == nil && !st.enter(phaseReading, phaseBusy) {
			err = io.ErrUnexpectedEOF // evicted just as the request was complete
		}
		if err != nil {
			ch.release()
			if st.evicted() {
				b.refuse(w, "", newRequestID(), "", "", refuse(ReasonEvicted, 503,
					"the broker was at its connection or memory limit and this request was the slowest to arrive; it was dropped to admit another"))
				return
			}
			var fe *frontError
			if !errors.As(err, &fe) {
				return
			}
			b.refuse(w, "", newRequestID(), "", "", fe)
			return
		}
		w.charge = ch
		keep := b.handle(w, req)
		ch.release()
		if !keep || req.close || !st.enter(phaseBusy, phaseIdle) {
			return
		}
	}
}

// handle serves one framed request and reports whether the connection
// may be kept.
func (b *Broker) handle(w *conn, req *request) bool {
	id := newRequestID()
	rt, ok := b.routes[req.path]
	if !ok {
		b.refuse(w, "", id, "", req.path, refuse(ReasonPathNotAllowed, 404,
			"path %s is not served; moat serves %s", quote(req.path), strings.Join(b.endpoints(), ", ")))
		return false
	}
	if req.method != http.MethodPost {
		b.refuse(w, rt.api, id, "", rt.endpoint, refuse(ReasonMethod, 405, "method %s is not allowed on %s; use POST", quote(req.method), rt.endpoint))
		return false
	}
	if b.failed.Load() {
		b.refuse(w, rt.api, id, "", rt.endpoint, refuse(ReasonRunFailed, 503, "the run was stopped after a fatal event (%v); no further requests are possible", b.Failed()))
		return false
	}
	if len(rt.providers) == 0 {
		b.refuse(w, rt.api, id, "", rt.endpoint, refuse(ReasonAPINotConfigured, 404, "the policy configures no provider for the %s API (endpoint %s)", rt.api, rt.endpoint))
		return false
	}
	fwd, fe := checkHeaders(rt.api, req)
	if fe != nil {
		b.refuse(w, rt.api, id, "", rt.endpoint, fe)
		return false
	}
	adm, rf := wire.Admit(rt.api, rt.endpoint, req.body, wire.Limits{Models: rt.models, MaxOutputTokens: b.cfg.Policy.Inference.MaxOutputTokens})
	if rf != nil {
		b.refuse(w, rt.api, id, "", rt.endpoint, &frontError{Code: rf.Code, Status: 400, Msg: rf.Message})
		return false
	}
	if adm == nil {
		b.refuse(w, rt.api, id, "", rt.endpoint, refuse(ReasonInternal, 500, "BUG: admission returned neither a request nor a refusal"))
		return false
	}
	p := rt.pick(adm.Model)
	if p == nil {
		b.refuse(w, rt.api, id, "", rt.endpoint, refuse(ReasonInternal, 500, "BUG: admitted model %q has no provider", adm.Model))
		return false
	}
	if p.cred == "" {
		b.refuse(w, rt.api, id, p.name, rt.endpoint, refuse(ReasonProviderUnconfigured, 503,
			"provider %q has no credential: the operator must set %s in moat's environment", p.name, p.credEnv))
		return false
	}
	att := b.attribute(w.c)
	if b.cfg.Policy.Inference.RequireAttribution && att.Status != boundary.AttributionResolved {
		b.refuse(w, rt.api, id, p.name, rt.endpoint, refuse(ReasonUnattributed, 403,
			"the policy requires every request to be attributed to a process, and this connection could not be (%s)", wire.Bound(att.Reason)))
		return false
	}
	if !b.reserve() {
		b.refuse(w, rt.api, id, p.name, rt.endpoint, refuse(ReasonAllowanceExhausted, 429,
			"the run's request allowance (max_requests %d) is used up; no further model requests are possible in this run", b.maxReq))
		return false
	}
	b.log.Debug("moat.broker admitted", "request_id", id, "provider", p.name, "endpoint", rt.endpoint,
		"model", adm.Model, "stream", adm.Stream, "attribution", att.Status)
	// forward builds the pre-effect record; append adds these headers to
	// it, so the record shows exactly the worker headers that are sent.
	b.fwdHeaders.Store(id, fwd)
	defer b.fwdHeaders.Delete(id)
	hdr := http.Header{}
	for name, v := range fwd {
		hdr.Set(name, v)
	}
	return b.forward(w, rt, p, req, adm, hdr, id, att)
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

// Reasons decided by the broker after framing.
const (
	ReasonPathNotAllowed       = "path_not_allowed"
	ReasonMethod               = "method_not_allowed"
	ReasonAPINotConfigured     = "api_not_configured"
	ReasonProviderUnconfigured = "provider_unconfigured"
	ReasonAllowanceExhausted   = "allowance_exhausted"
	ReasonRunFailed            = "run_failed"
	ReasonUnattributed         = "unattributed" // require_attribution and the connection's process is unknown
	ReasonInternal             = "internal_error"
)

// refuse journals an inference.refused record, logs one line and answers
// in the API's shape; the connection is then closed. The refusal past
// inference.max_refusals ends the run; later ones are only answered.
func (b *Broker) refuse(w *conn, api, id, provider, endpoint string, fe *frontError) {
	// Messages from broker/wire already say "moat: refused: "; say it once.
	// The journal takes valid UTF-8 only, and a bounded detail.
	msg := wire.BoundTo("moat: refused: "+strings.TrimPrefix(fe.Msg, "moat: refused: "), MaxDetailBytes)
	switch n := b.refusals.Add(1); {
	case n <= b.maxRefusals+1:
		b.log.Warn("moat.broker refused", "request_id", id, "reason", fe.Code, "provider", provider, "endpoint", endpoint, "detail", msg)
		b.append(audit.InferenceRefused{RequestID: id, Reason: fe.Code, Detail: msg,
			Provider: provider, Endpoint: endpoint, Attribution: b.attribute(w.c)}) // a no-op once the journal failed
		if n == b.maxRefusals+1 {
			b.fatal(ReasonRefusalLimit, fmt.Errorf("the broker refused %d requests, more than the policy's inference.max_refusals (%d); the run was ended so that refusals cannot fill the journal: read the refusals in the journal and fix the workload's requests, or raise inference.max_refusals",
				n, b.maxRefusals))
		}
	case n == b.maxRefusals+2:
		b.log.Warn("moat.broker refused", "request_id", id, "reason", fe.Code, "detail", "refusals past inference.max_refusals are answered but neither journaled nor logged")
	}
	writeError(w.bw, api, fe.Status, fe.Code, msg, id)
}

func newRequestID() string {
	var r [12]byte
	rand.Read(r[:])
	return "moatreq_" + hex.EncodeToString(r[:])
}
