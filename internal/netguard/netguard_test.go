package netguard

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
)

func TestClassify(t *testing.T) {
	for _, c := range []struct {
		addr, reason string
	}{
		// Global unicast: allowed (the positive controls).
		{"93.184.215.14", ""},
		{"1.1.1.1", ""},
		{"2606:4700::1111", ""},
		{"2a00:1450:4001:80b::200e", ""},
		// Refused.
		{"0.0.0.0", ReasonUnspecified},
		{"0.1.2.3", ReasonNotGlobal},
		{"127.0.0.1", ReasonLoopback},
		{"127.255.0.9", ReasonLoopback},
		{"10.1.2.3", ReasonPrivate},
		{"172.16.0.1", ReasonPrivate},
		{"172.31.255.255", ReasonPrivate},
		{"192.168.1.1", ReasonPrivate},
		{"100.64.0.1", ReasonCGNAT},
		{"100.127.255.254", ReasonCGNAT},
		{"100.100.100.200", ReasonMetadata},
		{"169.254.169.254", ReasonMetadata},
		{"169.254.1.1", ReasonLinkLocal},
		{"168.63.129.16", ReasonMetadata},
		{"192.0.0.192", ReasonMetadata},
		{"192.0.2.1", ReasonNotGlobal},
		{"198.18.0.1", ReasonNotGlobal},
		{"224.0.0.1", ReasonMulticast},
		{"255.255.255.255", ReasonNotGlobal},
		{"::", ReasonUnspecified},
		{"::1", ReasonLoopback},
		{"::ffff:127.0.0.1", ReasonEmbedsIPv4},
		{"::ffff:93.184.215.14", ReasonEmbedsIPv4},
		{"::127.0.0.1", ReasonEmbedsIPv4},
		{"64:ff9b::7f00:1", ReasonEmbedsIPv4},
		{"64:ff9b::a9fe:a9fe", ReasonEmbedsIPv4},
		{"64:ff9b:1::1", ReasonEmbedsIPv4},
		{"2002:7f00:1::1", ReasonEmbedsIPv4},
		{"2002:a9fe:a9fe::1", ReasonEmbedsIPv4},
		{"2001:0:4136:e378:8000:63bf:3fff:fdd2", ReasonEmbedsIPv4},
		{"2001:db8::1", ReasonNotGlobal},
		{"2001:2::1", ReasonNotGlobal},
		{"fd00:ec2::254", ReasonMetadata},
		{"fd12:3456::1", ReasonPrivate},
		{"fc00::1", ReasonPrivate},
		{"fe80::1", ReasonLinkLocal},
		{"fe80::1%lo", ReasonZone},
		{"fec0::1", ReasonNotGlobal},
		{"ff02::1", ReasonMulticast},
		{"100::1", ReasonNotGlobal},
		{"4000::1", ReasonNotGlobal},
		{"3fff::1", ReasonNotGlobal},
	} {
		a := netip.MustParseAddr(c.addr)
		if got := classify(a); got != c.reason {
			t.Errorf("classify(%s) = %q, want %q", c.addr, got, c.reason)
		}
	}
}

func TestCheckHostOwnAndTestGlobal(t *testing.T) {
	own := netip.MustParseAddr("93.184.215.14")
	other := netip.MustParseAddr("93.184.215.15")
	g := New(withHostAddrs(func() []netip.Addr { return []netip.Addr{own} }))
	if ReasonOf(g.Check(own)) != ReasonHostOwn {
		t.Errorf("the host's own address was not refused: %v", g.Check(own))
	}
	if ReasonOf(g.Check(netip.AddrFrom16(own.As16()))) != ReasonEmbedsIPv4 {
		t.Errorf("the host's own address, IPv4-mapped, was not refused")
	}
	if err := g.Check(other); err != nil {
		t.Errorf("another global address refused: %v", err)
	}
	lo := netip.MustParseAddr("127.0.0.1")
	g = New(WithTestGlobal(lo), withHostAddrs(func() []netip.Addr { return nil }))
	if err := g.Check(lo); err != nil {
		t.Errorf("the test-global address refused: %v", err)
	}
	if ReasonOf(g.Check(netip.MustParseAddr("127.0.0.2"))) != ReasonLoopback {
		t.Errorf("another loopback address passed with a test-global one set")
	}
	if ReasonOf(g.Check(netip.MustParseAddr("::ffff:127.0.0.1"))) != ReasonEmbedsIPv4 {
		t.Errorf("the test-global address, IPv4-mapped, passed")
	}
}

// rebinder answers a global address first and loopback after: a name
// whose resolution changes between two lookups.
type rebinder struct{ calls atomic.Int32 }

func (r *rebinder) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	if r.calls.Add(1) == 1 {
		return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil // the test's "global" address
	}
	return []netip.Addr{netip.MustParseAddr("127.0.0.2")}, nil
}

type staticResolver map[string][]netip.Addr

func (s staticResolver) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	if as, ok := s[host]; ok {
		return as, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// recordingDialer records where it was asked to dial.
type recordingDialer struct {
	addrs []string
	d     net.Dialer
}

func (r *recordingDialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	r.addrs = append(r.addrs, address)
	return r.d.DialContext(ctx, network, address)
}

func TestDialResolvesOnce(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	lo := netip.MustParseAddr("127.0.0.1")
	rb := &rebinder{}
	rd := &recordingDialer{}
	g := New(WithResolver(rb), WithDialer(rd), WithTestGlobal(lo), withHostAddrs(func() []netip.Addr { return nil }))
	c, err := g.DialContext(context.Background(), "tcp", net.JoinHostPort("rebind.test", itoa(port)))
	if err != nil {
		t.Fatalf("first dial of the rebinding name (positive control): %v", err)
	}
	c.Close()
	if rb.calls.Load() != 1 || len(rd.addrs) != 1 || rd.addrs[0] != "127.0.0.1:"+itoa(port) {
		t.Fatalf("lookups %d, dials %v: want one lookup and the checked address dialled", rb.calls.Load(), rd.addrs)
	}
	// The second resolution answers 127.0.0.2: refused, never dialled.
	_, err = g.DialContext(context.Background(), "tcp", net.JoinHostPort("rebind.test", itoa(port)))
	if ReasonOf(err) != ReasonLoopback || len(rd.addrs) != 1 {
		t.Fatalf("rebound answer: err %v, dials %v; want address_loopback and no dial", err, rd.addrs)
	}
	// A mixed answer is refused as a whole.
	g = New(WithResolver(staticResolver{"mixed.test": {lo, netip.MustParseAddr("10.0.0.1")}}), WithDialer(rd), WithTestGlobal(lo), withHostAddrs(func() []netip.Addr { return nil }))
	if _, err := g.DialContext(context.Background(), "tcp", "mixed.test:"+itoa(port)); ReasonOf(err) != ReasonPrivate {
		t.Errorf("mixed answer: %v, want address_private", err)
	}
	if _, err := g.DialContext(context.Background(), "tcp", "missing.test:"+itoa(port)); ReasonOf(err) != ReasonResolveFailed {
		t.Errorf("unknown name: %v, want resolve_failed", err)
	}
	if _, err := g.DialContext(context.Background(), "udp", "mixed.test:53"); err == nil {
		t.Errorf("udp dial allowed")
	}
	for _, bad := range []string{"x.test:0", "x.test:65536", "x.test:08", "x.test:+1", "x.test"} {
		if _, err := g.DialContext(context.Background(), "tcp", bad); err == nil || ReasonOf(err) != "" {
			t.Errorf("DialContext(%q) = %v, want a port error", bad, err)
		}
	}
	if len(rd.addrs) != 1 {
		t.Errorf("dials %v after refusals", rd.addrs)
	}
}

func itoa(n int) string {
	return netip.AddrPortFrom(netip.IPv4Unspecified(), uint16(n)).String()[len("0.0.0.0:"):]
}

func TestParseGrantAndMatch(t *testing.T) {
	for _, c := range []struct{ in, canon string }{
		{"PyPI.org", "pypi.org"},
		{"*.pythonhosted.org", "*.pythonhosted.org"},
		{"xn--bcher-kva.example", "xn--bcher-kva.example"},
		{"93.184.215.14", "93.184.215.14"},
		{"[2606:4700::1111]", "[2606:4700::1111]"},
		{"2606:4700::1111", "[2606:4700::1111]"},
	} {
		h, err := ParseGrant(c.in)
		if err != nil || h.String() != c.canon {
			t.Errorf("ParseGrant(%q) = %v, %v; want %q", c.in, h, err, c.canon)
		}
	}
	for _, bad := range []string{"", "*.org", "*", "*.", "a..b", ".a.b", "a.b.", "-a.b", "a-.b", "a_b.c", "bücher.example", "127.1", "0x7f.1", "2130706433", "a.b:443", "[::1", "[1.2.3.4]", "fe80::1%eth0", "*.*.a.b", "a b.c", "a.b/c", string(make([]byte, 254))} {
		if h, err := ParseGrant(bad); err == nil {
			t.Errorf("ParseGrant(%q) = %v, want an error", bad, h)
		}
	}
	m := func(g, tg string) bool {
		gh, err := ParseGrant(g)
		if err != nil {
			t.Fatal(err)
		}
		th, err := ParseTarget(tg)
		if err != nil {
			return false
		}
		return Match(gh, th)
	}
	for _, c := range []struct {
		grant, target string
		want          bool
	}{
		{"pypi.org", "pypi.org", true},
		{"pypi.org", "PYPI.ORG", true},
		{"pypi.org", "evil-pypi.org", false},
		{"pypi.org", "pypi.org.evil.test", false},
		{"pypi.org", "x.pypi.org", false},
		{"*.pythonhosted.org", "files.pythonhosted.org", true},
		{"*.pythonhosted.org", "FILES.PythonHosted.org", true},
		{"*.pythonhosted.org", "pythonhosted.org", false},
		{"*.pythonhosted.org", "a.b.pythonhosted.org", false},
		{"*.pythonhosted.org", "*.pythonhosted.org", false},
		{"*.pythonhosted.org", "xpythonhosted.org", false},
		{"93.184.215.14", "93.184.215.14", true},
		{"93.184.215.14", "::ffff:93.184.215.14", false},
		{"pypi.org", "151.101.0.223", false},
		{"[2606:4700::1111]", "2606:4700::1111", true},
	} {
		if got := m(c.grant, c.target); got != c.want {
			t.Errorf("Match(%q, %q) = %v, want %v", c.grant, c.target, got, c.want)
		}
	}
}

func TestRefusalError(t *testing.T) {
	err := error(&Refusal{Reason: ReasonDialFailed, Host: "x.test", Addr: netip.MustParseAddr("1.1.1.1"), Err: errors.New("boom")})
	if err.Error() != "dial_failed: x.test (1.1.1.1): boom" || ReasonOf(err) != ReasonDialFailed || ReasonOf(errors.New("x")) != "" {
		t.Errorf("Error() = %q", err.Error())
	}
}
