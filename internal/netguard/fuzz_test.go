package netguard

import (
	"net/netip"
	"strings"
	"testing"
)

// FuzzMatch: whatever the strings, ParseGrant and ParseTarget never
// panic; a parsed host's String parses back to itself; a match is only
// ever an equal name, an equal IP, or one label more than a wildcard's
// name.
func FuzzMatch(f *testing.F) {
	for _, s := range [][2]string{
		{"pypi.org", "pypi.org"},
		{"*.pythonhosted.org", "files.pythonhosted.org"},
		{"*.a.b", "x.y.a.b"},
		{"1.2.3.4", "::ffff:1.2.3.4"},
		{"[::1]", "::1"},
		{"xn--bcher-kva.example", "XN--BCHER-KVA.example"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, grant, target string) {
		g, err := ParseGrant(grant)
		if err != nil {
			return
		}
		if g2, err := ParseGrant(g.String()); err != nil || g2 != g {
			t.Fatalf("ParseGrant(%q).String() = %q reads back as %v, %v", grant, g.String(), g2, err)
		}
		tg, err := ParseTarget(target)
		if err != nil {
			return
		}
		if tg.Wildcard {
			t.Fatalf("target %q parsed as a wildcard", target)
		}
		if !Match(g, tg) {
			return
		}
		switch {
		case g.IP.IsValid():
			if tg.IP != g.IP {
				t.Fatalf("%q matched %q", grant, target)
			}
		case g.Wildcard:
			label, rest, ok := strings.Cut(tg.Name, ".")
			if !ok || label == "" || rest != g.Name || strings.Contains(label, "*") {
				t.Fatalf("%q matched %q", grant, target)
			}
		default:
			if tg.Name != g.Name || !strings.EqualFold(target, grant) {
				t.Fatalf("%q matched %q", grant, target)
			}
		}
	})
}

// FuzzCheck: Check never panics and never lets a non-global address
// through (cross-checked with the standard library's predicates).
func FuzzCheck(f *testing.F) {
	for _, s := range []string{"127.0.0.1", "::ffff:10.0.0.1", "2002::1", "93.184.215.14", "fe80::1%x"} {
		f.Add(s)
	}
	g := New(withHostAddrs(func() []netip.Addr { return nil }))
	f.Fuzz(func(t *testing.T, s string) {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return
		}
		if g.Check(a) == nil {
			if !a.IsGlobalUnicast() || a.IsPrivate() || a.Is4In6() || a.IsLoopback() || a.IsLinkLocalUnicast() || a.Zone() != "" {
				t.Fatalf("Check(%s) allowed a non-global address", a)
			}
		}
	})
}
