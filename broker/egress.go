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
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/internal/netguard"
	"github.com/moat-sandbox/moat/policy"
)

// The egress port (issue 13, egress.hosts): a second listener on the
// sandbox's loopback that takes only "CONNECT host:port" for a granted
// host and then relays TLS end to end. The inference port keeps refusing
// CONNECT. For each connection the broker:
//
//  1. reads the CONNECT head strictly (readConnect): nothing may follow it
//     before the answer (no data before the 200, no pipelined CONNECT);
//  2. finds the egress.hosts grant that covers host:port (netguard.Match:
//     the IDNA ASCII name case-insensitively, one label for "*.", IP
//     literals only when granted as such), checks the grant's
//     max_connections and the run's max_tunnels (reserved, never given
//     back);
//  3. resolves the name once with the guard and refuses any address that
//     is not global unicast;
//  4. answers 200, reads the TLS ClientHello and requires its server name
//     to equal the CONNECT host (an IP-literal grant takes a ClientHello
//     without one, as TLS clients send none for addresses) and refuses
//     one with Encrypted Client Hello or ESNI, whose server name is only
//     the CDN's public name, the one that counts being encrypted;
//  5. journals egress.opened (host, port, grant, address, SNI,
//     attribution) durably, then dials exactly the checked address and
//     relays, the ClientHello first;
//  6. closes the tunnel when either side ends it, after the run's
//     idle_timeout without a byte, after max_duration, when the grant's
//     max_bytes is reached, or when the run ends, and journals
//     egress.closed with the bytes each way and the duration.
//
// A refusal before the 200 is answered "403 Forbidden" with a body that
// says why and, for a host that is not granted, the grant to add; after
// the 200 (a ClientHello that is not TLS or names another host) the
// connection is closed. Each refusal is journaled as egress.refused with
// a reason code and counts in inference.max_refusals, as every refusal of
// the run does.

// Reasons of egress.refused and egress.closed records (the guard's
// address_* and resolve_* codes are used as they are).
const (
	ReasonEgressBadRequest = "egress_bad_request"
	ReasonEgressNotGranted = "egress_not_granted"
	ReasonEgressTLS        = "egress_tls_required"
	ReasonEgressSNI        = "egress_sni_mismatch"
	ReasonEgressConnBudget = "egress_connection_budget"
	ReasonEgressTunnelCap  = "egress_tunnel_cap"
	ReasonEgressRunFailed  = "run_failed"

	CloseClosed      = "closed"
	CloseIdle        = "idle_timeout"
	CloseMaxDuration = "max_duration"
	CloseByteBudget  = "byte_budget"
	CloseDialFailed  = "dial_failed"
	CloseRunEnded    = "run_ended"
)

// Egress limits that the policy does not set.
const (
	// EgressHeadTimeout bounds reading the CONNECT head and, after the
	// 200, the ClientHello.
	EgressHeadTimeout = 10 * time.Second
	// EgressResolveTimeout bounds the one resolution of a name.
	EgressResolveTimeout = 10 * time.Second
	// MaxEgressConns caps concurrent connections on the egress port.
	MaxEgressConns = 256
	egressRelayBuf = 32 << 10
)

// EgressConfig configures the egress port.
type EgressConfig struct {
	// Policy is the policy's egress section (validated).
	Policy *policy.Egress
	// Guard resolves, checks and dials. Required.
	Guard *netguard.Guard
}

// Egress is the egress port's state for one run (Config.Egress).
type Egress struct {
	pol     *policy.Egress
	guard   *netguard.Guard
	grants  []egressGrant
	tunnels atomic.Int64 // opened or reserved in the run
	tick    time.Duration
}

type egressGrant struct {
	*policy.EgressHost
	host  netguard.Host
	conns atomic.Int64
	bytes atomic.Int64
}

// NewEgress checks cfg and builds the egress state.
func NewEgress(cfg EgressConfig) (*Egress, error) {
	if cfg.Guard == nil {
		return nil, errors.New("moat: broker: egress: no guard (the SSRF guard is required)")
	}
	if cfg.Policy == nil {
		return nil, errors.New("moat: broker: egress: no policy")
	}
	e := &Egress{pol: cfg.Policy, guard: cfg.Guard, grants: make([]egressGrant, len(cfg.Policy.Hosts)), tick: 250 * time.Millisecond}
	for i := range cfg.Policy.Hosts {
		h := &cfg.Policy.Hosts[i]
		g, err := netguard.ParseGrant(h.Host)
		if err != nil {
			return nil, fmt.Errorf("moat: broker: egress.hosts[%d]: %w", i, err)
		}
		e.grants[i].EgressHost, e.grants[i].host = h, g
	}
	return e, nil
}

// match returns the first grant covering host:port.
func (e *Egress) match(h netguard.Host, port int) *egressGrant {
	for i := range e.grants {
		g := &e.grants[i]
		if g.Port == port && netguard.Match(g.host, h) {
			return g
		}
	}
	return nil
}

func newTunnelID() string {
	var r [12]byte
	rand.Read(r[:])
	return "moattun_" + hex.EncodeToString(r[:])
}

// ServeEgress accepts connections on the egress port l until Close.
// Without Config.Egress every connection is refused (nothing granted).
func (b *Broker) ServeEgress(l net.Listener) error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		l.Close()
		return net.ErrClosed
	}
	b.lns = append(b.lns, l)
	b.mu.Unlock()
	var active atomic.Int64
	// Connections still reading a head when the run ends are closed with
	// it (established tunnels watch b.ctx themselves).
	var mu sync.Mutex
	conns := map[net.Conn]bool{}
	go func() {
		<-b.ctx.Done()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		conns = nil
		mu.Unlock()
	}()
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
				time.Sleep(5 * time.Millisecond)
				continue
			}
			return fmt.Errorf("moat: broker: egress accept: %w", err)
		}
		b.mu.Lock()
		if b.closed || active.Load() >= MaxEgressConns {
			b.mu.Unlock()
			c.Close()
			continue
		}
		mu.Lock()
		if conns == nil {
			mu.Unlock()
			b.mu.Unlock()
			c.Close()
			continue
		}
		conns[c] = true
		mu.Unlock()
		active.Add(1)
		b.wg.Add(1)
		b.mu.Unlock()
		go func() {
			defer b.wg.Done()
			defer active.Add(-1)
			defer func() {
				mu.Lock()
				delete(conns, c)
				mu.Unlock()
				c.Close()
			}()
			b.serveTunnel(c)
		}()
	}
}

// tunnel is one egress connection's decision, made once.
type tunnel struct {
	id    string
	c     net.Conn
	attr  audit.Attribution
	req   *connectRequest
	grant *egressGrant
	addr  netip.Addr
	sni   string
	start time.Time
}

// egressRefusal is a refusal with its code; pre200 says whether the
// workload can still be answered 403.
type egressRefusal struct {
	reason string
	msg    string
	addr   netip.Addr
}

func (b *Broker) serveTunnel(c net.Conn) {
	t := &tunnel{id: newTunnelID(), c: c, attr: b.attribute(c)}
	br := bufio.NewReaderSize(c, 4096)
	c.SetReadDeadline(time.Now().Add(EgressHeadTimeout))
	req, err := readConnect(br)
	if err != nil {
		var ce *errConnect
		if errors.As(err, &ce) {
			b.refuseTunnel(t, egressRefusal{reason: ReasonEgressBadRequest, msg: ce.Msg}, true)
		}
		return // nothing sent (a closed or silent connection): not a request
	}
	t.req = req
	if r := b.admitTunnel(t); r != nil {
		b.refuseTunnel(t, *r, true)
		return
	}
	c.SetWriteDeadline(time.Now().Add(WriteTimeout))
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	c.SetReadDeadline(time.Now().Add(EgressHeadTimeout))
	hello, sni, err := readClientHello(br)
	if err != nil {
		reason := ReasonEgressTLS
		if errors.Is(err, errHiddenSNI) {
			reason = ReasonEgressSNI
		}
		b.refuseTunnel(t, egressRefusal{reason: reason, msg: err.Error()}, false)
		return
	}
	t.sni = strings.ToLower(sni)
	if r := checkSNI(t); r != nil {
		b.refuseTunnel(t, *r, false)
		return
	}
	if b.failed.Load() {
		// The run's fatal event came while the ClientHello was awaited:
		// no effect after it.
		b.refuseTunnel(t, egressRefusal{reason: ReasonEgressRunFailed, msg: "the run was stopped after a fatal event; the tunnel is not opened"}, false)
		return
	}
	c.SetReadDeadline(time.Time{})
	b.relay(t, br, hello)
}

// admitTunnel checks the grant, the budgets and the address; nil admits.
func (b *Broker) admitTunnel(t *tunnel) *egressRefusal {
	e, h, port := b.cfg.Egress, t.req.host, t.req.port
	if b.failed.Load() {
		return &egressRefusal{reason: ReasonEgressRunFailed, msg: "the run has ended; no further tunnel is opened"}
	}
	if e == nil || e.match(h, port) == nil {
		return &egressRefusal{reason: ReasonEgressNotGranted, msg: fmt.Sprintf("%s:%d is not granted; to allow TLS tunnels to it, add to the policy: egress: {hosts: [{host: %s, port: %d}]}", h, port, grantText(h), port)}
	}
	g := e.match(h, port)
	t.grant = g
	if max := int64(g.MaxConnections); g.conns.Add(1) > max {
		return &egressRefusal{reason: ReasonEgressConnBudget, msg: fmt.Sprintf("the grant %s:%d allows %d tunnels in a run (max_connections), all used", g.Host, g.Port, max)}
	}
	if max := int64(e.pol.MaxTunnels); e.tunnels.Add(1) > max {
		return &egressRefusal{reason: ReasonEgressTunnelCap, msg: fmt.Sprintf("the run allows %d tunnels (egress.max_tunnels), all used", max)}
	}
	if g.bytes.Load() >= int64(g.MaxBytes) {
		return &egressRefusal{reason: CloseByteBudget, msg: fmt.Sprintf("the grant %s:%d has used its %d bytes (max_bytes)", g.Host, g.Port, int64(g.MaxBytes))}
	}
	ctx, cancel := context.WithTimeout(b.ctx, EgressResolveTimeout)
	defer cancel()
	name := h.Name
	if h.IP.IsValid() {
		name = h.IP.String()
	}
	a, err := e.guard.Resolve(ctx, name)
	if err != nil {
		var r *netguard.Refusal
		if errors.As(err, &r) {
			msg := fmt.Sprintf("%s resolves to %s, which is not a global unicast address (%s); moat dials only global unicast addresses", h, r.Addr, r.Reason)
			if !r.Addr.IsValid() {
				msg = fmt.Sprintf("%s could not be resolved: %v", h, err)
			}
			return &egressRefusal{reason: r.Reason, msg: msg, addr: r.Addr}
		}
		return &egressRefusal{reason: netguard.ReasonResolveFailed, msg: fmt.Sprintf("%s could not be resolved: %v", h, err)}
	}
	t.addr = a
	return nil
}

// grantText is how a host is written in a policy.
func grantText(h netguard.Host) string {
	if h.IP.Is6() || h.Wildcard {
		return strconv.Quote(h.String())
	}
	return h.String()
}

func checkSNI(t *tunnel) *egressRefusal {
	h := t.req.host
	if t.sni == "" {
		if h.IP.IsValid() {
			return nil // TLS clients send no server name for an address
		}
		return &egressRefusal{reason: ReasonEgressTLS, msg: fmt.Sprintf("the ClientHello has no server name; it must name %s", h)}
	}
	if h.IP.IsValid() || t.sni != h.Name {
		return &egressRefusal{reason: ReasonEgressSNI, msg: fmt.Sprintf("the ClientHello names %s, not the CONNECT host %s", quote(t.sni), h)}
	}
	return nil
}

// refuseTunnel journals an egress.refused, counts it, logs it and, before
// the 200, answers 403 with the reason.
func (b *Broker) refuseTunnel(t *tunnel, r egressRefusal, pre200 bool) {
	msg := boundDetail(refusalPrefix + r.reason + ": " + r.msg)
	rec := audit.EgressRefused{TunnelID: t.id, Reason: r.reason, Detail: msg, Attribution: t.attr}
	if t.req != nil {
		rec.Host, rec.Port = quoteHost(t.req.host.String()), t.req.port
	}
	if t.sni != "" {
		rec.SNI = quoteHost(t.sni)
	}
	if r.addr.IsValid() {
		rec.Address = r.addr.String()
	}
	switch n, limit := b.countRefusal(); {
	case n <= limit+1:
		b.log.LogAttrs(context.Background(), slog.LevelWarn, "moat.broker egress refused",
			slog.String("tunnel_id", t.id), slog.String("reason", r.reason), slog.String("host", rec.Host),
			slog.Int("port", rec.Port), slog.String("detail", msg))
		b.append(rec)
		if n == limit+1 {
			b.fatal(ReasonRefusalLimit, fmt.Errorf("the broker refused %d requests and tunnels, more than the policy's inference.max_refusals (%d); the run was ended so that refusals cannot fill the journal", n, limit))
		}
	}
	if !pre200 {
		return
	}
	t.c.SetWriteDeadline(time.Now().Add(WriteTimeout))
	body := msg + "\n"
	fmt.Fprintf(t.c, "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\nMoat-Reason: %s\r\n\r\n%s", len(body), r.reason, body)
	lingerClose(t.c)
}

func boundDetail(s string) string {
	if len(s) > MaxDetailBytes {
		s = s[:MaxDetailBytes]
	}
	return strings.ToValidUTF8(s, "?")
}

func quoteHost(s string) string {
	q := quote(s)
	if uq, err := strconv.Unquote(q); err == nil && uq == s {
		return s
	}
	return q
}

// relay journals egress.opened, dials the checked address and copies both
// ways until the tunnel ends, then journals egress.closed.
func (b *Broker) relay(t *tunnel, br *bufio.Reader, hello []byte) {
	e, g := b.cfg.Egress, t.grant
	t.start = time.Now()
	rec := audit.EgressOpened{TunnelID: t.id, Host: t.req.host.String(), Port: t.req.port,
		Grant: g.Host + ":" + strconv.Itoa(g.Port), Address: t.addr.String(), SNI: t.sni, Attribution: t.attr}
	if _, ok := b.append(rec); !ok {
		return // no durable record, no tunnel
	}
	closed := func(reason, detail string, up, down int64) {
		b.append(audit.EgressClosed{TunnelID: t.id, BytesToHost: up, BytesToWorkload: down,
			DurationMS: time.Since(t.start).Milliseconds(), Reason: reason, Detail: boundDetail(detail)})
		b.log.LogAttrs(context.Background(), slog.LevelInfo, "moat.broker egress closed",
			slog.String("tunnel_id", t.id), slog.String("reason", reason), slog.String("host", rec.Host),
			slog.Int64("bytes_to_host", up), slog.Int64("bytes_to_workload", down))
	}
	if b.failed.Load() { // a fatal event while the record was written
		closed(CloseRunEnded, "the run was stopped after a fatal event; not dialled", 0, 0)
		return
	}
	ctx, cancel := context.WithTimeout(b.ctx, netguard.DialTimeout)
	up, err := e.guard.DialAddr(ctx, netip.AddrPortFrom(t.addr, uint16(t.req.port)))
	cancel()
	if err != nil {
		closed(CloseDialFailed, err.Error(), 0, 0)
		return
	}
	defer up.Close()
	var (
		once     sync.Once
		reason   = CloseClosed
		last     atomic.Int64 // unix nanos of the last byte either way
		toHost   atomic.Int64
		toWork   atomic.Int64
		done     = make(chan struct{})
		stopOnce = func(r string) {
			once.Do(func() {
				reason = r
				close(done)
				t.c.Close()
				up.Close()
			})
		}
	)
	last.Store(time.Now().UnixNano())
	count := func(n int, ctr *atomic.Int64) bool {
		last.Store(time.Now().UnixNano())
		if b.failed.Load() {
			stopOnce(CloseRunEnded) // no byte after the run's fatal event
			return false
		}
		if g.bytes.Add(int64(n)) > int64(g.MaxBytes) {
			stopOnce(CloseByteBudget) // the chunk past the budget is not relayed
			return false
		}
		ctr.Add(int64(n))
		return true
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // workload → host, the ClientHello first
		defer wg.Done()
		if count(len(hello), &toHost) {
			if _, err := up.Write(hello); err == nil {
				copyCounted(up, br, func(n int) bool { return count(n, &toHost) })
			}
		}
		closeWrite(up)
	}()
	go func() { // host → workload
		defer wg.Done()
		copyCounted(t.c, up, func(n int) bool { return count(n, &toWork) })
		closeWrite(t.c)
	}()
	go func() {
		wg.Wait()
		stopOnce(CloseClosed)
	}()
	idle, maxDur := time.Duration(e.pol.IdleTimeout), time.Duration(e.pol.MaxDuration)
	tk := time.NewTicker(e.tick)
	defer tk.Stop()
	for {
		select {
		case <-done:
			wg.Wait()
			closed(reason, "", toHost.Load(), toWork.Load())
			return
		case <-b.ctx.Done():
			stopOnce(CloseRunEnded)
		case now := <-tk.C:
			switch {
			case b.failed.Load():
				stopOnce(CloseRunEnded)
			case now.Sub(t.start) >= maxDur:
				stopOnce(CloseMaxDuration)
			case now.Sub(time.Unix(0, last.Load())) >= idle:
				stopOnce(CloseIdle)
			}
		}
	}
}

// copyCounted copies src to dst, asking ok before each chunk is written;
// it stops at the first error or refusal.
func copyCounted(dst io.Writer, src io.Reader, ok func(int) bool) {
	buf := make([]byte, egressRelayBuf)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !ok(n) {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
}
