package measure

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// Network timeouts.
const (
	dialTimeout = 2 * time.Second
	dnsWait     = 750 * time.Millisecond
	// maxResolvConfBytes bounds /etc/resolv.conf.
	maxResolvConfBytes = 64 << 10
	// maxRouteFileBytes bounds /proc/net/route and ipv6_route.
	maxRouteFileBytes = 4 << 20
)

// dnsName is the name queried: RFC 6761 reserves .invalid, so a resolver
// that answers at all answers NXDOMAIN without asking anyone else.
const dnsName = "moat-measure.invalid."

// planHost is the plan's Host, the one non-loopback address the helper
// may send to (the broker's host address when the broker is outside the
// sandbox's network, a host address by construction); Main sets it once
// from the plan, before any probe runs.
var planHost netip.Addr

// loopbackAddr reports whether addr ("host:port") is a loopback address,
// or the plan's Host. Every network probe checks it first: the helper may
// run unconfined (a lying backend), and then it must still send nothing
// off the host.
func loopbackAddr(addr string) bool {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return false
	}
	a := ap.Addr().Unmap()
	return a.IsLoopback() || planHost.IsValid() && a == planHost
}

func probeTCP(addr string) (string, string) {
	if !loopbackAddr(addr) {
		return OutcomeError, "BUG: refusing a target that is neither loopback nor the plan's host " + addr
	}
	c, err := net.DialTimeout("tcp", addr, dialTimeout)
	if err != nil {
		return OutcomeFailed, err.Error()
	}
	c.Close()
	return OutcomeSucceeded, "connected to " + addr
}

// probeUnix connects to a Unix socket (abstract when addr starts with @).
func probeUnix(addr string) (string, string) {
	c, err := net.DialTimeout("unix", addr, dialTimeout)
	if err != nil {
		return OutcomeFailed, err.Error()
	}
	c.Close()
	return OutcomeSucceeded, "connected to " + addr
}

// probeBroker is the broker connection, a control: the whole exchange,
// the connect included, has connTimeout, not the violations' dialTimeout.
// A violation that times out has failed, as it should; a control that
// times out refuses the sandbox, and a loaded node (CI's
// TestKubernetesScale: 20 gVisor Pods measured at once on 2 cores) did
// not complete a Pod's connect to the broker in 2 s ('dial tcp ...: i/o
// timeout'), and the host accepted that connection after the helper had
// given up on it. (A lost SYN is sent again after 1 s, then 2 s later.)
func probeBroker(addr, nonce string) (string, string) {
	if !loopbackAddr(addr) {
		return OutcomeError, "BUG: refusing a target that is neither loopback nor the plan's host " + addr
	}
	deadline := time.Now().Add(connTimeout)
	c, err := (&net.Dialer{Deadline: deadline}).Dial("tcp", addr)
	if err != nil {
		return OutcomeFailed, err.Error()
	}
	defer c.Close()
	c.SetDeadline(deadline)
	if _, err := io.WriteString(c, greeting+nonce+"\n"); err != nil {
		return OutcomeFailed, "connected, but sending failed: " + err.Error()
	}
	line, err := bufio.NewReader(io.LimitReader(c, 16)).ReadString('\n')
	if err != nil || line != brokerAck {
		return OutcomeFailed, fmt.Sprintf("connected, but the host did not answer (%q, %v)", line, err)
	}
	return OutcomeSucceeded, "connected to " + addr + " and the host answered"
}

// dnsQuery builds a query for dnsName.
func dnsQuery() []byte {
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 0x6d6f, RecursionDesired: true})
	b.StartQuestions()
	b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(dnsName), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
	msg, _ := b.Finish() // cannot fail for this fixed question
	return msg
}

// probeDNS sends one DNS query over UDP to addr and waits for any datagram
// back: an answer of any kind means something listens there.
func probeDNS(addr string) (string, string) {
	if !loopbackAddr(addr) {
		return OutcomeError, "BUG: refusing a target that is neither loopback nor the plan's host " + addr
	}
	c, err := dialUDPNotSelf(addr)
	if err != nil {
		return OutcomeFailed, err.Error()
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(dnsWait))
	if _, err := c.Write(dnsQuery()); err != nil {
		return OutcomeFailed, "send: " + err.Error()
	}
	buf := make([]byte, 512)
	n, err := c.Read(buf)
	if err != nil {
		return OutcomeFailed, "no answer: " + err.Error()
	}
	return OutcomeSucceeded, fmt.Sprintf("%d-byte answer from %s", n, addr)
}

// dialUDP is net.Dial for UDP; tests replace it.
var dialUDP = func(addr string) (net.Conn, error) { return net.Dial("udp", addr) }

// selfDialTries bounds the redials of a UDP socket that was connected to
// itself.
const selfDialTries = 8

// dialUDPNotSelf connects a UDP socket to addr whose own address is not
// addr. A loopback target's port can be the one the kernel picks as the
// socket's source port; the socket is then connected to itself, reads its
// own query back, and the probe reported that as an answer (a violation
// that succeeded: a false refusal of the run, seen on gVisor with a
// receiver's random port). Such a socket is closed and another dialled.
func dialUDPNotSelf(addr string) (net.Conn, error) {
	for range selfDialTries {
		c, err := dialUDP(addr)
		if err != nil {
			return nil, err
		}
		if c.LocalAddr().String() != c.RemoteAddr().String() {
			return c, nil
		}
		c.Close()
	}
	return nil, fmt.Errorf("every UDP socket dialled to %s was connected to itself (%d tries)", addr, selfDialTries)
}

// probeResolvConf queries each loopback nameserver of /etc/resolv.conf.
// Others are not contacted (never a non-loopback target); the interface
// and route checks show they are unreachable.
func probeResolvConf() (string, string) {
	f, err := os.Open("/etc/resolv.conf")
	if err != nil {
		return OutcomeFailed, "no resolver configuration: " + err.Error()
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxResolvConfBytes))
	if err != nil {
		return OutcomeFailed, "reading /etc/resolv.conf: " + err.Error()
	}
	var notes []string
	for _, line := range strings.Split(string(b), "\n") {
		fl := strings.Fields(line)
		if len(fl) < 2 || fl[0] != "nameserver" {
			continue
		}
		ip, err := netip.ParseAddr(strings.SplitN(fl[1], "%", 2)[0])
		if err != nil {
			notes = append(notes, fmt.Sprintf("unparseable nameserver %q", fl[1]))
			continue
		}
		if !ip.Unmap().IsLoopback() {
			notes = append(notes, "non-loopback nameserver "+ip.String()+" not contacted")
			continue
		}
		a := netip.AddrPortFrom(ip.Unmap(), 53).String()
		out, d := probeDNS(a)
		if out != OutcomeFailed {
			return out, "nameserver " + a + ": " + d
		}
		notes = append(notes, "nameserver "+a+": "+d)
	}
	if len(notes) == 0 {
		return OutcomeFailed, "no nameserver configured"
	}
	return OutcomeFailed, strings.Join(notes, "; ")
}

// probeInterfaces lists network interfaces (netlink, or /proc/net/dev).
func probeInterfaces() (string, string) {
	var others, all []string
	ifs, err := net.Interfaces()
	if err == nil {
		for _, i := range ifs {
			all = append(all, i.Name)
			if i.Flags&net.FlagLoopback == 0 {
				others = append(others, i.Name)
			}
		}
	} else {
		names, err2 := procNetDev()
		if err2 != nil {
			return OutcomeError, fmt.Sprintf("listing interfaces: netlink: %v; /proc/net/dev: %v", err, err2)
		}
		for _, n := range names {
			all = append(all, n)
			if n != "lo" {
				others = append(others, n)
			}
		}
	}
	if len(others) > 0 {
		return OutcomeSucceeded, "interfaces besides loopback: " + strings.Join(others, ", ")
	}
	return OutcomeFailed, "only loopback: " + strings.Join(all, ", ")
}

func procNetDev() ([]string, error) {
	b, err := readBounded("/proc/net/dev", maxRouteFileBytes)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, line := range strings.Split(string(b), "\n") {
		name, _, ok := strings.Cut(line, ":")
		if ok && !strings.Contains(name, "|") {
			names = append(names, strings.TrimSpace(name))
		}
	}
	return names, nil
}

func readBounded(p string, limit int64) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err == nil && int64(len(b)) > limit {
		err = fmt.Errorf("%s is larger than %d bytes", p, limit)
	}
	return b, err
}

// probeRoutes looks for a route out: one through a non-loopback interface,
// or a default route. It reads the kernel's table (netlink, or /proc) and
// sends nothing.
func probeRoutes() (string, string) {
	out, err := netlinkRoutesOut()
	src := "netlink"
	if err != nil {
		var perr error
		out, perr = procRoutesOut()
		if perr != nil {
			return OutcomeError, fmt.Sprintf("reading routes: netlink: %v; /proc: %v", err, perr)
		}
		src = "/proc/net (netlink: " + err.Error() + ")"
	}
	if len(out) > 0 {
		return OutcomeSucceeded, src + ": " + strings.Join(out, "; ")
	}
	return OutcomeFailed, src + ": no default route and no route through a non-loopback interface"
}

// Route types that carry no traffic anywhere.
func deadRouteType(t uint8) bool {
	return t == syscall.RTN_BLACKHOLE || t == syscall.RTN_UNREACHABLE || t == syscall.RTN_PROHIBIT || t == syscall.RTN_THROW
}

func netlinkRoutesOut() ([]string, error) {
	names := map[uint32]string{}
	loop := map[uint32]bool{}
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	for _, i := range ifs {
		names[uint32(i.Index)] = i.Name
		loop[uint32(i.Index)] = i.Flags&net.FlagLoopback != 0
	}
	rib, err := syscall.NetlinkRIB(syscall.RTM_GETROUTE, syscall.AF_UNSPEC)
	if err != nil {
		return nil, err
	}
	msgs, err := syscall.ParseNetlinkMessage(rib)
	if err != nil {
		return nil, err
	}
	var out []string
	for i := range msgs {
		m := &msgs[i]
		if m.Header.Type != syscall.RTM_NEWROUTE {
			continue
		}
		if len(m.Data) < syscall.SizeofRtMsg {
			return nil, fmt.Errorf("short route message (%d bytes)", len(m.Data))
		}
		family, dstLen, typ := m.Data[0], m.Data[1], m.Data[7]
		if deadRouteType(typ) {
			continue
		}
		attrs, err := syscall.ParseNetlinkRouteAttr(m)
		if err != nil {
			return nil, err
		}
		var oif uint32
		hasOIF := false
		var dst []byte
		for _, a := range attrs {
			switch a.Attr.Type {
			case syscall.RTA_OIF:
				if len(a.Value) >= 4 {
					oif, hasOIF = binary.NativeEndian.Uint32(a.Value), true
				}
			case syscall.RTA_DST:
				dst = a.Value
			}
		}
		desc := routeDesc(family, dst, dstLen, names[oif], oif, typ)
		switch {
		case !hasOIF && typ == syscall.RTN_UNICAST:
			out = append(out, desc+" without a single output interface")
		case hasOIF && !loop[oif]:
			out = append(out, desc)
		case dstLen == 0 && typ == syscall.RTN_UNICAST:
			out = append(out, "default route "+desc)
		}
	}
	return out, nil
}

func routeDesc(family uint8, dst []byte, dstLen uint8, name string, oif uint32, typ uint8) string {
	d := "default"
	if ip, ok := netip.AddrFromSlice(dst); ok {
		d = netip.PrefixFrom(ip, int(dstLen)).String()
	}
	if name == "" {
		name = "ifindex " + strconv.Itoa(int(oif))
	}
	return fmt.Sprintf("%s dev %s (family %d, type %d)", d, name, family, typ)
}

// rtfReject is RTF_REJECT in /proc/net/route and ipv6_route flags.
const rtfReject = 0x0200

func procRoutesOut() ([]string, error) {
	b, err := readBounded("/proc/net/route", maxRouteFileBytes)
	if err != nil {
		return nil, err
	}
	out := parseRouteV4(b)
	b6, err := readBounded("/proc/net/ipv6_route", maxRouteFileBytes)
	if err == nil {
		out = append(out, parseRouteV6(b6)...)
	} else if _, serr := os.Stat("/proc/net/if_inet6"); serr == nil {
		return nil, fmt.Errorf("IPv6 is configured but its routes cannot be read: %w", err)
	}
	return out, nil
}

// parseRouteV4 reads /proc/net/route: Iface Destination Gateway Flags
// RefCnt Use Metric Mask …, hex fields.
func parseRouteV4(b []byte) []string {
	var out []string
	for i, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if i == 0 || len(f) < 8 {
			continue
		}
		flags, err := strconv.ParseUint(f[3], 16, 32)
		if err != nil {
			out = append(out, fmt.Sprintf("unparseable route %q", line))
			continue
		}
		if flags&rtfReject != 0 {
			continue
		}
		switch {
		case f[0] != "lo":
			out = append(out, fmt.Sprintf("IPv4 route to %s/%s dev %s", f[1], f[7], f[0]))
		case f[1] == "00000000" && f[7] == "00000000":
			out = append(out, "IPv4 default route dev lo")
		}
	}
	return out
}

// parseRouteV6 reads /proc/net/ipv6_route: dst dstlen src srclen nexthop
// metric refcnt use flags iface.
func parseRouteV6(b []byte) []string {
	var out []string
	for _, line := range bytes.Split(b, []byte("\n")) {
		f := strings.Fields(string(line))
		if len(f) < 10 {
			continue
		}
		flags, err := strconv.ParseUint(f[8], 16, 32)
		if err != nil {
			out = append(out, fmt.Sprintf("unparseable route %q", line))
			continue
		}
		if flags&rtfReject != 0 {
			continue
		}
		switch {
		case f[9] != "lo":
			out = append(out, fmt.Sprintf("IPv6 route to %s/%s dev %s", f[0], f[1], f[9]))
		case f[1] == "00":
			out = append(out, "IPv6 default route dev lo")
		}
	}
	return out
}
