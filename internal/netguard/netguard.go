// Package netguard is the one guard for everything moat dials on a
// workload's behalf (egress tunnels, brokered services, remote tool
// servers): it normalizes and matches granted host names, resolves a name
// once, refuses every address that is not global unicast, and dials
// exactly the address it checked, so that a second lookup (DNS rebinding)
// cannot change where a connection goes.
//
// # Names
//
// A granted host is a DNS name in its IDNA ASCII form, lower case
// (CanonicalHost): letters, digits and '-' in labels of 1 to 63
// characters, at most 253 characters, optionally behind one leading "*."
// that stands for exactly one more label (Match: "*.example.org" matches
// "a.example.org", not "example.org" nor "a.b.example.org"). A wildcard
// needs at least two labels after it. An IP literal is a grant only when
// it is written as one (in brackets or not for IPv6); a name never
// matches an IP literal grant, nor an IP literal a name grant.
//
// # Addresses
//
// Allowed (Check) is global unicast only. Refused, each with a reason
// code: unspecified, loopback, private (10/8, 172.16/12, 192.168/16),
// CGNAT (100.64/10), link-local (169.254/16, fe80::/10, including the
// cloud metadata address 169.254.169.254), unique local (fc00::/7,
// including fd00:ec2::254), multicast, broadcast and the IANA special
// ranges (0/8, 192.0.0/24, the documentation and benchmarking ranges,
// 240/4, site-local fec0::/10, discard 100::/64), every IPv6 form that
// embeds or tunnels to an IPv4 address (IPv4-mapped ::ffff:0:0/96,
// IPv4-compatible ::/96, NAT64 64:ff9b::/96 and 64:ff9b:1::/48, 6to4
// 2002::/16, Teredo and the rest of 2001::/23), IPv6 outside 2000::/3,
// addresses with a zone, known metadata addresses that are otherwise
// global (Azure's 168.63.129.16), and the host's own addresses (read
// from its interfaces at each check).
//
// A test may mark one address as global (WithTestGlobal), so that a real
// client can be tested against a server on loopback; nothing in the
// policy or the CLI can set it.
package netguard

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// Reason codes of refusals. They are journaled; keep them stable.
const (
	ReasonNotGlobal     = "address_not_global" // a special-purpose or embedding range
	ReasonLoopback      = "address_loopback"
	ReasonPrivate       = "address_private"     // RFC 1918, ULA
	ReasonCGNAT         = "address_cgnat"       // 100.64/10
	ReasonLinkLocal     = "address_link_local"  // 169.254/16, fe80::/10
	ReasonMetadata      = "address_metadata"    // cloud metadata services
	ReasonMulticast     = "address_multicast"   // 224/4, ff00::/8
	ReasonUnspecified   = "address_unspecified" // 0.0.0.0, ::
	ReasonEmbedsIPv4    = "address_embeds_ipv4" // mapped, compatible, NAT64, 6to4, Teredo
	ReasonZone          = "address_zone"
	ReasonHostOwn       = "address_host_own" // one of the host's own addresses
	ReasonResolveFailed = "resolve_failed"
	ReasonNoAddress     = "resolve_no_address"
	ReasonDialFailed    = "dial_failed"
)

// Refusal is the error of a refused address or a failed resolution or
// dial.
type Refusal struct {
	Reason string
	Host   string     // the name looked up ("" when an address was given)
	Addr   netip.Addr // the address refused (zero when none)
	Err    error      // the underlying error, if any
}

func (r *Refusal) Error() string {
	var b strings.Builder
	b.WriteString(r.Reason)
	if r.Host != "" {
		fmt.Fprintf(&b, ": %s", r.Host)
	}
	if r.Addr.IsValid() {
		fmt.Fprintf(&b, " (%s)", r.Addr)
	}
	if r.Err != nil {
		fmt.Fprintf(&b, ": %v", r.Err)
	}
	return b.String()
}

func (r *Refusal) Unwrap() error { return r.Err }

// ReasonOf returns the reason code of a *Refusal in err's chain, or "".
func ReasonOf(err error) string {
	var r *Refusal
	if errors.As(err, &r) {
		return r.Reason
	}
	return ""
}

type prefixReason struct {
	p      netip.Prefix
	reason string
}

func mp(s, reason string) prefixReason { return prefixReason{netip.MustParsePrefix(s), reason} }

// Order matters: the first prefix that contains an address names its
// reason (metadata before link-local, the embedding forms before the
// 2000::/3 rule).
var refused = []prefixReason{
	mp("169.254.169.254/32", ReasonMetadata),
	mp("168.63.129.16/32", ReasonMetadata), // Azure wireserver: a global address
	mp("100.100.100.200/32", ReasonMetadata),
	mp("192.0.0.192/32", ReasonMetadata),
	mp("fd00:ec2::254/128", ReasonMetadata),
	mp("0.0.0.0/32", ReasonUnspecified),
	mp("0.0.0.0/8", ReasonNotGlobal),
	mp("10.0.0.0/8", ReasonPrivate),
	mp("100.64.0.0/10", ReasonCGNAT),
	mp("127.0.0.0/8", ReasonLoopback),
	mp("169.254.0.0/16", ReasonLinkLocal),
	mp("172.16.0.0/12", ReasonPrivate),
	mp("192.0.0.0/24", ReasonNotGlobal),
	mp("192.0.2.0/24", ReasonNotGlobal),
	mp("192.88.99.0/24", ReasonEmbedsIPv4), // 6to4 relay anycast
	mp("192.168.0.0/16", ReasonPrivate),
	mp("198.18.0.0/15", ReasonNotGlobal),
	mp("198.51.100.0/24", ReasonNotGlobal),
	mp("203.0.113.0/24", ReasonNotGlobal),
	mp("224.0.0.0/4", ReasonMulticast),
	mp("240.0.0.0/4", ReasonNotGlobal), // and 255.255.255.255
	mp("::/128", ReasonUnspecified),
	mp("::1/128", ReasonLoopback),
	mp("::ffff:0:0/96", ReasonEmbedsIPv4),
	mp("::ffff:0:0:0/96", ReasonEmbedsIPv4), // SIIT
	mp("::/96", ReasonEmbedsIPv4),           // IPv4-compatible
	mp("64:ff9b::/96", ReasonEmbedsIPv4),
	mp("64:ff9b:1::/48", ReasonEmbedsIPv4),
	mp("100::/64", ReasonNotGlobal),
	mp("2001::/32", ReasonEmbedsIPv4), // Teredo
	mp("2001::/23", ReasonNotGlobal),
	mp("2001:db8::/32", ReasonNotGlobal),
	mp("2002::/16", ReasonEmbedsIPv4), // 6to4
	mp("3fff::/20", ReasonNotGlobal),
	mp("fc00::/7", ReasonPrivate),
	mp("fe80::/10", ReasonLinkLocal),
	mp("fec0::/10", ReasonNotGlobal),
	mp("ff00::/8", ReasonMulticast),
}

var global6 = netip.MustParsePrefix("2000::/3")

// classify returns "" for a global unicast address, else the reason it is
// refused (the host's own addresses aside).
func classify(a netip.Addr) string {
	switch {
	case !a.IsValid():
		return ReasonUnspecified
	case a.Zone() != "":
		return ReasonZone
	}
	for _, r := range refused {
		if r.p.Contains(a) {
			return r.reason
		}
	}
	if a.Is6() && !global6.Contains(a) {
		return ReasonNotGlobal
	}
	return ""
}

// Resolver looks names up; *net.Resolver implements it. Tests give one
// whose answers change between calls (a rebinding name).
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Dialer dials one checked address; *net.Dialer implements it.
type Dialer interface {
	DialContext(ctx context.Context, network, address string) (net.Conn, error)
}

// Guard resolves, checks and dials. The zero value is not usable: use New.
type Guard struct {
	resolver   Resolver
	dialer     Dialer
	testGlobal netip.Addr
	hostAddrs  func() []netip.Addr
}

// Option configures a Guard.
type Option func(*Guard)

// WithResolver replaces the system resolver.
func WithResolver(r Resolver) Option { return func(g *Guard) { g.resolver = r } }

// WithDialer replaces the dialer (a *net.Dialer with a 10 s timeout).
func WithDialer(d Dialer) Option { return func(g *Guard) { g.dialer = d } }

// WithTestGlobal makes the guard treat a, and only a, as a global address
// even though it is loopback or private: for tests that run a real client
// against a server on the test's own address. The policy and the CLI
// never set it.
func WithTestGlobal(a netip.Addr) Option { return func(g *Guard) { g.testGlobal = a } }

// withHostAddrs replaces the host address reader (tests).
func withHostAddrs(f func() []netip.Addr) Option { return func(g *Guard) { g.hostAddrs = f } }

// DialTimeout bounds one dial of a checked address.
const DialTimeout = 10 * time.Second

// New returns a guard with the system resolver and dialer unless options
// replace them.
func New(opts ...Option) *Guard {
	g := &Guard{resolver: net.DefaultResolver, dialer: &net.Dialer{Timeout: DialTimeout}, hostAddrs: interfaceAddrs}
	for _, o := range opts {
		o(g)
	}
	return g
}

// interfaceAddrs lists the host's own addresses; on error it returns
// none (every such address is also refused by its range, or global and
// then not reachable as "own" through a route that matters less than
// failing every dial).
func interfaceAddrs() []netip.Addr {
	as, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var out []netip.Addr
	for _, a := range as {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			out = append(out, p.Addr())
		}
	}
	return out
}

// Check returns nil when a may be dialled, else a *Refusal.
func (g *Guard) Check(a netip.Addr) error {
	if g.testGlobal.IsValid() && a == g.testGlobal {
		return nil
	}
	if r := classify(a); r != "" {
		return &Refusal{Reason: r, Addr: a}
	}
	if slices.Contains(g.hostAddrs(), a.Unmap()) {
		return &Refusal{Reason: ReasonHostOwn, Addr: a}
	}
	return nil
}

// MaxAddrs caps how many addresses of one name are looked at.
const MaxAddrs = 32

// Resolve looks host up once (an IP literal is not looked up) and returns
// the first address, after checking every address of the answer: a name
// with any refused address is refused (a mixed answer is how a rebinding
// attack hedges).
func (g *Guard) Resolve(ctx context.Context, host string) (netip.Addr, error) {
	h := strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if a, err := netip.ParseAddr(h); err == nil {
		if err := g.Check(a); err != nil {
			return netip.Addr{}, err
		}
		return a, nil
	}
	as, err := g.resolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return netip.Addr{}, &Refusal{Reason: ReasonResolveFailed, Host: host, Err: err}
	}
	if len(as) == 0 {
		return netip.Addr{}, &Refusal{Reason: ReasonNoAddress, Host: host}
	}
	if len(as) > MaxAddrs {
		as = as[:MaxAddrs]
	}
	for _, a := range as {
		if err := g.Check(a); err != nil {
			err.(*Refusal).Host = host
			return netip.Addr{}, err
		}
	}
	return as[0], nil
}

// DialAddr checks a again and dials exactly it.
func (g *Guard) DialAddr(ctx context.Context, a netip.AddrPort) (net.Conn, error) {
	if err := g.Check(a.Addr()); err != nil {
		return nil, err
	}
	c, err := g.dialer.DialContext(ctx, "tcp", a.String())
	if err != nil {
		return nil, &Refusal{Reason: ReasonDialFailed, Addr: a.Addr(), Err: err}
	}
	return c, nil
}

// DialContext resolves the host of address ("host:port") once, checks it
// and dials the checked address: a drop-in http.Transport.DialContext for
// routes that talk to a granted service. network must be tcp, tcp4 or
// tcp6.
func (g *Guard) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	if network != "tcp" && network != "tcp4" && network != "tcp6" {
		return nil, fmt.Errorf("netguard: network %q is not tcp", network)
	}
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return nil, fmt.Errorf("netguard: %w", err)
	}
	p, err := parsePort(port)
	if err != nil {
		return nil, err
	}
	a, err := g.Resolve(ctx, host)
	if err != nil {
		return nil, err
	}
	return g.DialAddr(ctx, netip.AddrPortFrom(a, p))
}

func parsePort(s string) (uint16, error) {
	if s == "" || len(s) > 5 || s[0] == '0' {
		return 0, fmt.Errorf("netguard: bad port %q", s)
	}
	n := 0
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("netguard: bad port %q", s)
		}
		n = n*10 + int(c-'0')
	}
	if n < 1 || n > 65535 {
		return 0, fmt.Errorf("netguard: bad port %q", s)
	}
	return uint16(n), nil
}
