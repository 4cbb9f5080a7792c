package broker

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/netguard"
	"github.com/moat-sandbox/moat/policy"
)

// The egress tests' upstream is a TLS server on 127.0.0.2 (its
// certificate names example.com), which the guard is told to count as
// global (netguard.WithTestGlobal); every other address keeps the guard's
// rules, 127.0.0.1 (the broker's own address) among them.
var egressTestAddr = netip.MustParseAddr("127.0.0.2")

// egressResolver answers from a table; a name with several answers gives
// them one per lookup (the last one again after), so a name can rebind.
type egressResolver struct {
	mu      sync.Mutex
	answers map[string][]string
	calls   map[string]int
}

func (r *egressResolver) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	as, ok := r.answers[host]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	i := min(r.calls[host], len(as)-1)
	r.calls[host]++
	return []netip.Addr{netip.MustParseAddr(as[i])}, nil
}

type egressHarness struct {
	*harness
	eaddr    string // the egress port
	upstream *httptest.Server
	port     int // the upstream's port
	accepted atomic.Int64
	res      *egressResolver
}

func newEgressHarness(t *testing.T, hosts []policy.EgressHost, tune func(*policy.Egress, *Egress)) *egressHarness {
	t.Helper()
	eh := &egressHarness{}
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n, err := strconv.Atoi(r.URL.Query().Get("n")); err == nil {
			w.Write([]byte(strings.Repeat("x", n)))
			return
		}
		fmt.Fprintf(w, "hello from %s", r.Host)
	}))
	l, err := net.Listen("tcp", egressTestAddr.String()+":0")
	if err != nil {
		t.Skipf("cannot listen on %s: %v", egressTestAddr, err)
	}
	up.Listener = l
	up.Config.ErrorLog = log.New(io.Discard, "", 0)
	up.Config.ConnState = func(c net.Conn, s http.ConnState) {
		if s == http.StateNew {
			eh.accepted.Add(1)
		}
	}
	up.StartTLS()
	t.Cleanup(up.Close)
	eh.upstream, eh.port = up, l.Addr().(*net.TCPAddr).Port
	eh.res = &egressResolver{calls: map[string]int{}, answers: map[string][]string{
		"example.com":        {"127.0.0.2"},
		"a.example.com":      {"127.0.0.2"},
		"a.example.org":      {"127.0.0.2"},
		"rebind.example.com": {"127.0.0.2", "127.0.0.1"},
		"loop.test":          {"127.0.0.1"},
		"private.test":       {"10.0.0.1"},
		"cgnat.test":         {"100.64.0.1"},
		"metadata.test":      {"169.254.169.254"},
		"metadata6.test":     {"fd00:ec2::254"},
		"mapped.test":        {"::ffff:127.0.0.2"},
		"nat64.test":         {"64:ff9b::7f00:2"},
		"broker-own.test":    {"127.0.0.1"},
	}}
	for i := range hosts {
		if hosts[i].Port == 0 {
			hosts[i].Port = eh.port
		}
		if hosts[i].MaxConnections == 0 {
			hosts[i].MaxConnections = policy.DefaultMaxConnections
		}
		if hosts[i].MaxBytes == 0 {
			hosts[i].MaxBytes = policy.DefaultEgressMaxBytes
		}
	}
	ep := &policy.Egress{Hosts: hosts, MaxTunnels: policy.DefaultMaxTunnels, IdleTimeout: policy.DefaultTunnelIdleTimeout, MaxDuration: policy.DefaultTunnelMaxDuration}
	eg, err := NewEgress(EgressConfig{Policy: ep, Guard: netguard.New(netguard.WithResolver(eh.res), netguard.WithTestGlobal(egressTestAddr))})
	if err != nil {
		t.Fatal(err)
	}
	eg.tick = 20 * time.Millisecond
	if tune != nil {
		tune(ep, eg)
	}
	fp := newFakeProvider(t, false)
	eh.harness = startBroker(t, fp, testPolicy(fp.srv.URL, 10), nil, func(c *Config) { c.Egress = eg })
	el, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	eh.eaddr = el.Addr().String()
	go eh.b.ServeEgress(el)
	return eh
}

// connect sends head on a new connection to the egress port and reads the
// answer's status line and head.
func (eh *egressHarness) connect(head string) (net.Conn, *bufio.Reader, *http.Response) {
	eh.t.Helper()
	c, err := net.Dial("tcp", eh.eaddr)
	if err != nil {
		eh.t.Fatal(err)
	}
	eh.t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.WriteString(c, head); err != nil {
		eh.t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: "CONNECT"})
	if err != nil {
		eh.t.Fatalf("reading the answer to %q: %v", head, err)
	}
	return c, br, resp
}

func connectHead(target string) string {
	return "CONNECT " + target + " HTTP/1.1\r\nHost: " + target + "\r\nUser-Agent: curl/8\r\nProxy-Connection: Keep-Alive\r\n\r\n"
}

// get opens a tunnel to name, speaks TLS with sni and GETs path. It
// returns the body, or the error of the first step that failed.
func (eh *egressHarness) get(name, sni, path string) (string, error) {
	eh.t.Helper()
	c, br, resp := eh.connect(connectHead(net.JoinHostPort(name, strconv.Itoa(eh.port))))
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		return "", fmt.Errorf("CONNECT: %d %s", resp.StatusCode, b)
	}
	if br.Buffered() > 0 {
		eh.t.Fatalf("%d bytes after the 200", br.Buffered())
	}
	cfg := &tls.Config{ServerName: sni, RootCAs: eh.upstream.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs}
	if sni == "" {
		cfg.InsecureSkipVerify = true
	}
	tc := tls.Client(c, cfg)
	if err := tc.Handshake(); err != nil {
		return "", fmt.Errorf("TLS: %w", err)
	}
	defer tc.Close()
	fmt.Fprintf(tc, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", path, name)
	r, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		return "", err
	}
	b, err := io.ReadAll(r.Body)
	return string(b), err
}

// waitRecord waits for the n-th record of typ and returns it.
func (eh *egressHarness) waitRecord(typ string, n int) map[string]any {
	eh.t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if rs := eh.records(typ); len(rs) >= n {
			return rs[n-1]
		}
	}
	eh.t.Fatalf("no %d-th %s record", n, typ)
	return nil
}

func TestEgressTunnel(t *testing.T) {
	eh := newEgressHarness(t, []policy.EgressHost{{Host: "example.com"}}, nil)
	body, err := eh.get("example.com", "example.com", "/")
	if err != nil || body != "hello from example.com" {
		t.Fatalf("granted tunnel: %q, %v", body, err)
	}
	op := eh.waitRecord("egress.opened", 1)
	cl := eh.waitRecord("egress.closed", 1)
	if op["host"] != "example.com" || op["address"] != "127.0.0.2" || op["sni"] != "example.com" ||
		op["grant"] != "example.com:"+strconv.Itoa(eh.port) || op["port"] != float64(eh.port) || op["tunnel_id"] != cl["tunnel_id"] {
		t.Errorf("egress.opened %v, egress.closed %v", op, cl)
	}
	if cl["reason"] != CloseClosed || cl["bytes_to_host"].(float64) < 200 || cl["bytes_to_workload"].(float64) < 200 {
		t.Errorf("egress.closed %v", cl)
	}
	// The opened record precedes the closed one, and nothing else was
	// journaled as refused.
	if len(eh.records("egress.refused")) != 0 {
		t.Errorf("refusals: %v", eh.records("egress.refused"))
	}
	if eh.res.calls["example.com"] != 1 {
		t.Errorf("example.com looked up %d times, want once", eh.res.calls["example.com"])
	}
}

// TestEgressRefusals: each attack is refused with its reason and never
// reaches the upstream; a granted tunnel in the same broker works after
// each (the positive control).
func TestEgressRefusals(t *testing.T) {
	eh := newEgressHarness(t, []policy.EgressHost{
		{Host: "example.com"}, {Host: "*.example.org"}, {Host: "rebind.example.com"}, {Host: "loop.test"}, {Host: "private.test"},
		{Host: "cgnat.test"}, {Host: "metadata.test"}, {Host: "metadata6.test"}, {Host: "mapped.test"}, {Host: "nat64.test"},
		{Host: "broker-own.test"}, {Host: "127.0.0.1"}, {Host: "[::ffff:127.0.0.2]"}, {Host: "[64:ff9b::7f00:2]"}, {Host: "[::1]"},
	}, nil)
	_, brokerPort, _ := net.SplitHostPort(eh.addr)
	bp, _ := strconv.Atoi(brokerPort)
	eh.b.cfg.Egress.grants = append(eh.b.cfg.Egress.grants, egressGrant{EgressHost: &policy.EgressHost{Host: "broker-own.test", Port: bp, MaxConnections: 8, MaxBytes: 1 << 20}, host: netguard.Host{Name: "broker-own.test"}})
	p := strconv.Itoa(eh.port)
	control := func(what string) {
		t.Helper()
		if body, err := eh.get("example.com", "example.com", "/"); err != nil || body != "hello from example.com" {
			t.Fatalf("after %s: the granted tunnel failed: %q, %v", what, body, err)
		}
	}
	// The rebinding name: the first lookup answers the test's global
	// address (the tunnel works), the second 127.0.0.1 (refused).
	if body, err := eh.get("rebind.example.com", "rebind.example.com", "/"); err != nil || body != "hello from rebind.example.com" {
		t.Fatalf("rebinding name, first lookup: %q, %v", body, err)
	}
	for _, c := range []struct {
		name, head, reason, body string
	}{
		{"ungranted name", connectHead("evil.test:" + p), ReasonEgressNotGranted, "add to the policy: egress: {hosts: [{host: evil.test, port: " + p + "}]}"},
		{"granted name, other port", connectHead("example.com:1"), ReasonEgressNotGranted, "{host: example.com, port: 1}"},
		{"wildcard, two labels", connectHead("a.b.example.org:" + p), ReasonEgressNotGranted, "a.b.example.org"},
		{"wildcard, bare domain", connectHead("example.org:" + p), ReasonEgressNotGranted, "example.org"},
		{"rebinding name, second lookup", connectHead("rebind.example.com:" + p), netguard.ReasonLoopback, "127.0.0.1"},
		{"loopback name", connectHead("loop.test:" + p), netguard.ReasonLoopback, "global unicast"},
		{"private name", connectHead("private.test:" + p), netguard.ReasonPrivate, "10.0.0.1"},
		{"CGNAT name", connectHead("cgnat.test:" + p), netguard.ReasonCGNAT, "100.64.0.1"},
		{"metadata name", connectHead("metadata.test:" + p), netguard.ReasonMetadata, "169.254.169.254"},
		{"metadata6 name", connectHead("metadata6.test:" + p), netguard.ReasonMetadata, "fd00:ec2::254"},
		{"IPv4-mapped answer", connectHead("mapped.test:" + p), netguard.ReasonEmbedsIPv4, "::ffff:127.0.0.2"},
		{"NAT64 answer", connectHead("nat64.test:" + p), netguard.ReasonEmbedsIPv4, "64:ff9b::7f00:2"},
		{"the broker's own address", connectHead("broker-own.test:" + brokerPort), netguard.ReasonLoopback, "127.0.0.1"},
		{"IP literal, not granted", connectHead("127.0.0.2:" + p), ReasonEgressNotGranted, "127.0.0.2"},
		{"IP literal, granted, loopback", connectHead("127.0.0.1:" + p), netguard.ReasonLoopback, "127.0.0.1"},
		{"IPv4-mapped literal", connectHead("[::ffff:127.0.0.2]:" + p), netguard.ReasonEmbedsIPv4, "::ffff:127.0.0.2"},
		{"NAT64 literal", connectHead("[64:ff9b::7f00:2]:" + p), netguard.ReasonEmbedsIPv4, "64:ff9b::7f00:2"},
		{"IPv6 loopback literal", connectHead("[::1]:" + p), netguard.ReasonLoopback, "::1"},
		{"numeric name", connectHead("2130706434:" + p), ReasonEgressBadRequest, "IP address"},
		{"data before the 200", connectHead("example.com:"+p) + "\x16\x03\x01\x00\x05hello", ReasonEgressBadRequest, "before the answer"},
		{"pipelined CONNECT", connectHead("example.com:"+p) + connectHead("evil.test:443"), ReasonEgressBadRequest, "before the answer"},
		{"GET", "GET / HTTP/1.1\r\nHost: example.com\r\n\r\n", ReasonEgressBadRequest, "CONNECT only"},
		{"absolute form", "GET https://example.com/ HTTP/1.1\r\nHost: example.com\r\n\r\n", ReasonEgressBadRequest, "CONNECT only"},
		{"Host differs", "CONNECT example.com:" + p + " HTTP/1.1\r\nHost: evil.test:443\r\n\r\n", ReasonEgressBadRequest, "differs"},
		{"body on CONNECT", "CONNECT example.com:" + p + " HTTP/1.1\r\nContent-Length: 5\r\n\r\n", ReasonEgressBadRequest, "no body"},
		{"bare LF", "CONNECT example.com:" + p + " HTTP/1.1\nHost: example.com\r\n\r\n", ReasonEgressBadRequest, "control byte"},
		{"userinfo", connectHead("user@example.com:" + p), ReasonEgressBadRequest, "userinfo"},
		{"no port", "CONNECT example.com HTTP/1.1\r\n\r\n", ReasonEgressBadRequest, "host:port"},
		{"padded port", connectHead("example.com:0" + p), ReasonEgressBadRequest, "bad port"},
	} {
		before := eh.accepted.Load()
		nref := len(eh.records("egress.refused"))
		_, _, resp := eh.connect(c.head)
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 403 || resp.Header.Get("Moat-Reason") != c.reason || !strings.Contains(string(b), c.body) {
			t.Errorf("%s: %d %s %q, want 403 %s with %q", c.name, resp.StatusCode, resp.Header.Get("Moat-Reason"), b, c.reason, c.body)
		}
		rec := eh.waitRecord("egress.refused", nref+1)
		if rec["reason"] != c.reason || rec["detail"] != strings.TrimSuffix(string(b), "\n") {
			t.Errorf("%s: record %v", c.name, rec)
		}
		if eh.accepted.Load() != before {
			t.Errorf("%s: the upstream accepted a connection", c.name)
		}
		control(c.name)
	}
	// After the 200: a ClientHello naming another host, none, or no TLS.
	for _, c := range []struct {
		name, sni, reason string
		notTLS            bool
	}{
		{"SNI mismatch", "evil.test", ReasonEgressSNI, false},
		{"SNI of another granted host", "a.example.org", ReasonEgressSNI, false},
		{"no SNI", "", ReasonEgressTLS, false},
		{"not TLS", "", ReasonEgressTLS, true},
	} {
		before := eh.accepted.Load()
		nref := len(eh.records("egress.refused"))
		if c.notTLS {
			conn, br, resp := eh.connect(connectHead("example.com:" + p))
			if resp.StatusCode != 200 {
				t.Fatalf("%s: CONNECT %d", c.name, resp.StatusCode)
			}
			io.WriteString(conn, "GET / HTTP/1.1\r\nHost: example.com\r\n\r\n")
			if n, err := br.Read(make([]byte, 1)); err == nil {
				t.Errorf("%s: %d bytes came back", c.name, n)
			}
		} else if body, err := eh.get("example.com", c.sni, "/"); err == nil {
			t.Errorf("%s: the tunnel worked: %q", c.name, body)
		}
		rec := eh.waitRecord("egress.refused", nref+1)
		if rec["reason"] != c.reason || (c.sni != "" && rec["sni"] != c.sni) {
			t.Errorf("%s: record %v", c.name, rec)
		}
		if eh.accepted.Load() != before {
			t.Errorf("%s: the upstream accepted a connection", c.name)
		}
		control(c.name)
	}
	// The inference port still refuses CONNECT.
	if r := eh.raw(connectHead("example.com:" + p)); r.status == 200 {
		t.Errorf("the inference port answered CONNECT with 200")
	}
	// Every opened tunnel dialled the test address, never 127.0.0.1.
	for _, r := range eh.records("egress.opened") {
		if r["address"] != "127.0.0.2" {
			t.Errorf("opened %v", r)
		}
	}
}

func TestEgressLimits(t *testing.T) {
	t.Run("max_connections", func(t *testing.T) {
		eh := newEgressHarness(t, []policy.EgressHost{{Host: "example.com", MaxConnections: 2}, {Host: "*.example.com"}}, nil)
		for i := range 2 {
			if _, err := eh.get("example.com", "example.com", "/"); err != nil {
				t.Fatalf("tunnel %d: %v", i, err)
			}
		}
		_, _, resp := eh.connect(connectHead("example.com:" + strconv.Itoa(eh.port)))
		if resp.StatusCode != 403 || resp.Header.Get("Moat-Reason") != ReasonEgressConnBudget {
			t.Errorf("third tunnel: %d %s", resp.StatusCode, resp.Header.Get("Moat-Reason"))
		}
		if _, err := eh.get("a.example.com", "a.example.com", "/"); err != nil {
			t.Errorf("another grant after one's budget (control): %v", err)
		}
	})
	t.Run("max_tunnels", func(t *testing.T) {
		eh := newEgressHarness(t, []policy.EgressHost{{Host: "example.com"}, {Host: "*.example.org"}}, func(p *policy.Egress, _ *Egress) { p.MaxTunnels = 1 })
		if _, err := eh.get("example.com", "example.com", "/"); err != nil {
			t.Fatal(err)
		}
		_, _, resp := eh.connect(connectHead("a.example.org:" + strconv.Itoa(eh.port)))
		if resp.StatusCode != 403 || resp.Header.Get("Moat-Reason") != ReasonEgressTunnelCap {
			t.Errorf("second tunnel: %d %s", resp.StatusCode, resp.Header.Get("Moat-Reason"))
		}
	})
	t.Run("max_bytes", func(t *testing.T) {
		eh := newEgressHarness(t, []policy.EgressHost{{Host: "example.com", MaxBytes: 64 << 10}}, nil)
		if body, err := eh.get("example.com", "example.com", "/?n=1000"); err != nil || len(body) != 1000 {
			t.Fatalf("small body within the budget (control): %d, %v", len(body), err)
		}
		if body, err := eh.get("example.com", "example.com", "/?n=200000"); err == nil && len(body) == 200000 {
			t.Fatalf("a body past the grant's max_bytes came through")
		}
		cl := eh.waitRecord("egress.closed", 2)
		if cl["reason"] != CloseByteBudget {
			t.Errorf("closed %v", cl)
		}
		if got := cl["bytes_to_host"].(float64) + cl["bytes_to_workload"].(float64); got > 64<<10 {
			t.Errorf("%v bytes relayed past a budget of %d", got, 64<<10)
		}
	})
	for _, c := range []struct {
		name   string
		tune   func(*policy.Egress, *Egress)
		reason string
	}{
		{"idle_timeout", func(p *policy.Egress, _ *Egress) { p.IdleTimeout = policy.Duration(300 * time.Millisecond) }, CloseIdle},
		{"max_duration", func(p *policy.Egress, _ *Egress) { p.MaxDuration = policy.Duration(300 * time.Millisecond) }, CloseMaxDuration},
	} {
		t.Run(c.name, func(t *testing.T) {
			eh := newEgressHarness(t, []policy.EgressHost{{Host: "example.com"}}, c.tune)
			conn, _, resp := eh.connect(connectHead("example.com:" + strconv.Itoa(eh.port)))
			if resp.StatusCode != 200 {
				t.Fatal(resp.Status)
			}
			tc := tls.Client(conn, &tls.Config{ServerName: "example.com", RootCAs: eh.upstream.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs})
			if err := tc.Handshake(); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			if c.reason == CloseMaxDuration { // keep it busy: only the age can end it
				go func() {
					for time.Since(start) < 5*time.Second {
						if _, err := fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: example.com\r\n\r\n"); err != nil {
							return
						}
						time.Sleep(50 * time.Millisecond)
					}
				}()
			}
			conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			io.Copy(io.Discard, tc)
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("tunnel lived %v", d)
			}
			if cl := eh.waitRecord("egress.closed", 1); cl["reason"] != c.reason {
				t.Errorf("closed %v, want %s", cl, c.reason)
			}
		})
	}
	t.Run("run_ended", func(t *testing.T) {
		eh := newEgressHarness(t, []policy.EgressHost{{Host: "example.com"}}, nil)
		conn, _, resp := eh.connect(connectHead("example.com:" + strconv.Itoa(eh.port)))
		if resp.StatusCode != 200 {
			t.Fatal(resp.Status)
		}
		tc := tls.Client(conn, &tls.Config{ServerName: "example.com", RootCAs: eh.upstream.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs})
		if err := tc.Handshake(); err != nil {
			t.Fatal(err)
		}
		eh.b.fatal(ReasonAuditFailure, fmt.Errorf("test"))
		if cl := eh.waitRecord("egress.closed", 1); cl["reason"] != CloseRunEnded {
			t.Errorf("closed %v", cl)
		}
		_, _, resp = eh.connect(connectHead("example.com:" + strconv.Itoa(eh.port)))
		if resp.StatusCode != 403 || resp.Header.Get("Moat-Reason") != ReasonEgressRunFailed {
			t.Errorf("after the run failed: %d %s", resp.StatusCode, resp.Header.Get("Moat-Reason"))
		}
	})
}

func TestEgressNoGrants(t *testing.T) {
	fp := newFakeProvider(t, false)
	h := startBroker(t, fp, testPolicy(fp.srv.URL, 10), nil)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go h.b.ServeEgress(l)
	eh := &egressHarness{harness: h, eaddr: l.Addr().String()}
	_, _, resp := eh.connect(connectHead("example.com:443"))
	if resp.StatusCode != 403 || resp.Header.Get("Moat-Reason") != ReasonEgressNotGranted {
		t.Errorf("without egress: %d %s", resp.StatusCode, resp.Header.Get("Moat-Reason"))
	}
	if _, err := NewEgress(EgressConfig{Policy: &policy.Egress{}}); err == nil {
		t.Error("NewEgress without a guard")
	}
}

// TestEgressIPLiteral: a granted IP address takes a ClientHello without
// a server name (TLS clients send none for an address), and refuses one
// that names a host.
func TestEgressIPLiteral(t *testing.T) {
	eh := newEgressHarness(t, []policy.EgressHost{{Host: "127.0.0.2"}}, nil)
	if body, err := eh.get("127.0.0.2", "", "/"); err != nil || body != "hello from 127.0.0.2" {
		t.Fatalf("granted address without SNI: %q, %v", body, err)
	}
	if op := eh.waitRecord("egress.opened", 1); op["sni"] != "" || op["host"] != "127.0.0.2" || op["address"] != "127.0.0.2" {
		t.Errorf("opened %v", op)
	}
	before := eh.accepted.Load()
	if _, err := eh.get("127.0.0.2", "example.com", "/"); err == nil {
		t.Error("a server name on a tunnel to an address was relayed")
	}
	if rec := eh.waitRecord("egress.refused", 1); rec["reason"] != ReasonEgressSNI || eh.accepted.Load() != before {
		t.Errorf("refused %v, upstream accepted %d more", rec, eh.accepted.Load()-before)
	}
}
