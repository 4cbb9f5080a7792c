package netguard

import (
	"fmt"
	"net/netip"
	"strings"
)

// MaxHostLen is the longest DNS name (RFC 1035), without a trailing dot.
const MaxHostLen = 253

// Host is a granted host in canonical form.
type Host struct {
	// Name is the lower-case IDNA ASCII form; for a wildcard it is the
	// part after "*.". Empty for an IP literal.
	Name     string
	Wildcard bool
	// IP is set for an IP literal grant.
	IP netip.Addr
}

// String is the canonical text of h: "*.name", "name", an IPv4 literal or
// a bracketed IPv6 literal.
func (h Host) String() string {
	switch {
	case h.IP.Is6():
		return "[" + h.IP.String() + "]"
	case h.IP.IsValid():
		return h.IP.String()
	case h.Wildcard:
		return "*." + h.Name
	}
	return h.Name
}

// ParseGrant reads a host as a policy writes it: a DNS name in its IDNA
// ASCII form (any case; stored lower case), optionally "*." and a name of
// at least two labels, or an IP literal (IPv6 with or without brackets).
// Non-ASCII names are refused with the hint to write their xn-- form.
func ParseGrant(s string) (Host, error) {
	if s == "" {
		return Host{}, fmt.Errorf("empty host")
	}
	if inner, ok := strings.CutPrefix(s, "["); ok {
		inner, ok = strings.CutSuffix(inner, "]")
		a, err := netip.ParseAddr(inner)
		if !ok || err != nil || !a.Is6() || a.Zone() != "" {
			return Host{}, fmt.Errorf("%q is not a bracketed IPv6 address", s)
		}
		return Host{IP: a}, nil
	}
	if a, err := netip.ParseAddr(s); err == nil {
		if a.Zone() != "" {
			return Host{}, fmt.Errorf("%q has a zone; grant an address without one", s)
		}
		return Host{IP: a}, nil
	}
	rest, wild := strings.CutPrefix(s, "*.")
	name, err := canonicalName(rest)
	if err != nil {
		return Host{}, err
	}
	if wild && strings.Count(name, ".") < 1 {
		return Host{}, fmt.Errorf("wildcard %q covers a whole top-level domain; name at least two labels after \"*.\"", s)
	}
	if looksNumeric(name) {
		return Host{}, fmt.Errorf("%q looks like an IP address in a form other than dotted quad; write the address as a.b.c.d", s)
	}
	return Host{Name: name, Wildcard: wild}, nil
}

// canonicalName checks an LDH name and lower-cases it.
func canonicalName(s string) (string, error) {
	if s == "" || len(s) > MaxHostLen {
		return "", fmt.Errorf("host name must be 1-%d characters", MaxHostLen)
	}
	for _, r := range s {
		if r >= 0x80 {
			return "", fmt.Errorf("host %q is not ASCII; write its IDNA form (xn--...)", s)
		}
	}
	s = strings.ToLower(s)
	for _, l := range strings.Split(s, ".") {
		if l == "" || len(l) > 63 {
			return "", fmt.Errorf("host %q has an empty label or one longer than 63 characters", s)
		}
		if l[0] == '-' || l[len(l)-1] == '-' {
			return "", fmt.Errorf("host %q has a label that starts or ends with '-'", s)
		}
		for _, c := range []byte(l) {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return "", fmt.Errorf("host %q has %q; a host name is letters, digits, '-' and '.'", s, string(rune(c)))
			}
		}
	}
	return s, nil
}

// looksNumeric reports whether the last label is all digits (or 0x...):
// resolvers and libcs read such names as IPv4 addresses in odd forms
// (127.1, 0x7f.1, 2130706433).
func looksNumeric(name string) bool {
	last := name[strings.LastIndexByte(name, '.')+1:]
	if strings.HasPrefix(last, "0x") {
		return true
	}
	for _, c := range []byte(last) {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// ParseTarget reads the host of a request (a CONNECT authority's host,
// an SNI): the same forms as ParseGrant without the wildcard. A name is
// returned lower case; an IP literal as IP.
func ParseTarget(s string) (Host, error) {
	if strings.HasPrefix(s, "*") {
		return Host{}, fmt.Errorf("%q: a target cannot be a wildcard", s)
	}
	return ParseGrant(s)
}

// Match reports whether target is covered by grant: the same IP literal,
// the same name, or for a wildcard exactly one more label.
func Match(grant, target Host) bool {
	if grant.IP.IsValid() || target.IP.IsValid() {
		return grant.IP.IsValid() && target.IP.IsValid() && grant.IP == target.IP
	}
	if target.Wildcard {
		return false
	}
	if !grant.Wildcard {
		return grant.Name == target.Name
	}
	label, rest, ok := strings.Cut(target.Name, ".")
	return ok && label != "" && rest == grant.Name
}
