package attrib

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// tcpRow is one socket line of /proc/<pid>/net/tcp or tcp6.
type tcpRow struct {
	Local, Remote netip.AddrPort // IPv4-mapped IPv6 addresses are unmapped
	State         uint8          // TCP_ESTABLISHED = 1, … TCP_LISTEN = 10
	Inode         uint64         // 0 once no process holds the socket
}

// tcpListen is the kernel's TCP_LISTEN state.
const tcpListen = 10

var errHeader = errors.New("header line")

// parseTCPLine parses one line of /proc/net/tcp or /proc/net/tcp6:
//
//	sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode …
//	0: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000  1000        0 12345 …
//
// Addresses are the kernel's in-memory words printed as host-order hex
// (%08X per 32-bit word), ports are host-order hex. The header line returns
// errHeader.
func parseTCPLine(line string) (tcpRow, error) {
	f := strings.Fields(line)
	if len(f) > 0 && f[0] == "sl" {
		return tcpRow{}, errHeader
	}
	if len(f) < 10 {
		return tcpRow{}, fmt.Errorf("attrib: %d fields in %q, want at least 10", len(f), line)
	}
	if !strings.HasSuffix(f[0], ":") {
		return tcpRow{}, fmt.Errorf("attrib: bad slot %q", f[0])
	}
	var r tcpRow
	var err error
	if r.Local, err = parseHexAddrPort(f[1]); err != nil {
		return tcpRow{}, err
	}
	if r.Remote, err = parseHexAddrPort(f[2]); err != nil {
		return tcpRow{}, err
	}
	st, err := strconv.ParseUint(f[3], 16, 8)
	if err != nil || len(f[3]) != 2 {
		return tcpRow{}, fmt.Errorf("attrib: bad state %q", f[3])
	}
	r.State = uint8(st)
	if r.Inode, err = strconv.ParseUint(f[9], 10, 64); err != nil {
		return tcpRow{}, fmt.Errorf("attrib: bad inode %q", f[9])
	}
	return r, nil
}

// parseHexAddrPort parses "0100007F:1F90" (IPv4) or a 32-digit IPv6 form.
func parseHexAddrPort(s string) (netip.AddrPort, error) {
	a, p, ok := strings.Cut(s, ":")
	if !ok || len(p) != 4 || (len(a) != 8 && len(a) != 32) {
		return netip.AddrPort{}, fmt.Errorf("attrib: bad address %q", s)
	}
	port, err := strconv.ParseUint(p, 16, 16)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("attrib: bad port in %q", s)
	}
	raw, err := hex.DecodeString(a)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("attrib: bad address %q", s)
	}
	// Each 32-bit word was printed as a host-order integer; undo that.
	b := make([]byte, len(raw))
	for i := 0; i < len(raw); i += 4 {
		binary.NativeEndian.PutUint32(b[i:], binary.BigEndian.Uint32(raw[i:]))
	}
	ip, _ := netip.AddrFromSlice(b)
	return netip.AddrPortFrom(ip.Unmap(), uint16(port)), nil
}
