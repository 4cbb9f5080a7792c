package measure

import (
	"net"
	"net/netip"
	"strings"
)

// probeIPv6Usable looks for an IPv6 address on a non-loopback interface
// that a socket can bind: then IPv6 traffic can leave through that
// interface. A Pod's interface has a link-local address, which reaches
// the node and every Pod on the same bridge, and a NetworkPolicy that
// the network plugin enforces for IPv4 alone does not confine it. It
// binds a UDP socket and sends nothing. Succeeded is the violation.
func probeIPv6Usable() (string, string) {
	ifs, err := net.Interfaces()
	if err != nil {
		return OutcomeError, "listing interfaces: " + err.Error()
	}
	var notes []string
	for _, ifc := range ifs {
		if ifc.Flags&net.FlagLoopback != 0 || ifc.Flags&net.FlagUp == 0 {
			continue
		}
		addrs, err := ifc.Addrs()
		if err != nil {
			notes = append(notes, ifc.Name+": "+err.Error())
			continue
		}
		for _, a := range addrs {
			pfx, err := netip.ParsePrefix(a.String())
			if err != nil || !pfx.Addr().Is6() || pfx.Addr().Is4In6() {
				continue
			}
			ip := pfx.Addr()
			if ip.IsLinkLocalUnicast() {
				ip = ip.WithZone(ifc.Name)
			}
			c, err := net.ListenUDP("udp6", net.UDPAddrFromAddrPort(netip.AddrPortFrom(ip, 0)))
			if err != nil {
				notes = append(notes, ip.String()+": "+err.Error())
				continue
			}
			c.Close()
			return OutcomeSucceeded, "IPv6 address " + ip.String() + " on " + ifc.Name + " is usable (a UDP socket bound to it)"
		}
	}
	if len(notes) == 0 {
		return OutcomeFailed, "no IPv6 address on an interface besides loopback"
	}
	return OutcomeFailed, strings.Join(notes, "; ")
}
