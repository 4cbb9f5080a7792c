package broker

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/moat-sandbox/moat/internal/netguard"
)

// Limits of a CONNECT head on the egress port.
const (
	maxConnectHead    = 8 << 10
	maxConnectHeaders = 32
)

// connectRequest is a strictly parsed CONNECT head.
type connectRequest struct {
	host   netguard.Host // canonical
	port   int
	rawTgt string // the authority as sent (for refusals)
}

// errConnect is a CONNECT head that is refused; Msg says why.
type errConnect struct{ Msg string }

func (e *errConnect) Error() string { return e.Msg }

func connectErr(format string, a ...any) error { return &errConnect{Msg: fmt.Sprintf(format, a...)} }

// readConnect reads one CONNECT head from br: the request line
// "CONNECT host:port HTTP/1.1" (or HTTP/1.0) with single spaces, then
// header lines "Name: value" each ending in CRLF, then an empty line. The
// head is at most maxConnectHead bytes. Refused: any other method or
// target form, userinfo, a missing or zero-padded port, bare CR or LF,
// NUL and control bytes, obsolete folding, header names that are not
// tokens, more than maxConnectHeaders headers, a Host that differs from
// the target or appears twice, Content-Length and Transfer-Encoding (a
// CONNECT has no body), and any byte after the head before the broker has
// answered (data before the 200, a pipelined second CONNECT).
func readConnect(br *bufio.Reader) (*connectRequest, error) {
	head, err := readHead(br)
	if err != nil {
		return nil, err
	}
	if br.Buffered() > 0 {
		return nil, connectErr("%d bytes arrived after the CONNECT head before the answer (data before the 200 and pipelined requests are refused)", br.Buffered())
	}
	return parseConnect(head)
}

// readHead reads up to and including the CRLF CRLF that ends a head.
func readHead(br *bufio.Reader) ([]byte, error) {
	var head []byte
	for {
		line, err := br.ReadSlice('\n')
		head = append(head, line...)
		if len(head) > maxConnectHead {
			return nil, connectErr("the CONNECT head is longer than %d bytes", maxConnectHead)
		}
		if err != nil {
			if errors.Is(err, bufio.ErrBufferFull) {
				continue
			}
			if len(head) == 0 {
				return nil, err
			}
			return nil, connectErr("the connection ended inside the CONNECT head: %v", err)
		}
		if bytes.Equal(line, []byte("\r\n")) {
			return head, nil
		}
	}
}

// parseConnect parses a whole head (ending in CRLF CRLF).
func parseConnect(head []byte) (*connectRequest, error) {
	if !bytes.HasSuffix(head, []byte("\r\n\r\n")) {
		return nil, connectErr("the CONNECT head does not end with an empty line")
	}
	lines := strings.Split(string(head[:len(head)-4]), "\r\n")
	for _, l := range lines {
		for i := 0; i < len(l); i++ {
			if c := l[i]; c < 0x20 && c != '\t' || c == 0x7f {
				return nil, connectErr("the CONNECT head holds a control byte 0x%02x (bare CR or LF, NUL, ...)", c)
			}
		}
	}
	method, rest, ok1 := strings.Cut(lines[0], " ")
	target, version, ok2 := strings.Cut(rest, " ")
	switch {
	case !ok1 || !ok2 || strings.Contains(version, " "):
		return nil, connectErr("the request line %s is not \"CONNECT host:port HTTP/1.1\"", quote(lines[0]))
	case method != "CONNECT":
		return nil, connectErr("method %s: the egress port takes CONNECT only (a TLS tunnel to a granted host)", quote(method))
	case version != "HTTP/1.1" && version != "HTTP/1.0":
		return nil, connectErr("version %s: want HTTP/1.1", quote(version))
	}
	req, err := parseAuthority(target)
	if err != nil {
		return nil, err
	}
	hosts := 0
	if len(lines)-1 > maxConnectHeaders {
		return nil, connectErr("more than %d header lines", maxConnectHeaders)
	}
	for _, l := range lines[1:] {
		if l == "" || l[0] == ' ' || l[0] == '\t' {
			return nil, connectErr("an empty or folded header line")
		}
		name, value, ok := strings.Cut(l, ":")
		if !ok || !isToken(name) {
			return nil, connectErr("header line %s is not \"Name: value\"", quote(l))
		}
		value = strings.Trim(value, " \t")
		switch strings.ToLower(name) {
		case "host":
			hosts++
			if hosts > 1 {
				return nil, connectErr("Host appears twice")
			}
			if !strings.EqualFold(value, target) {
				return nil, connectErr("Host %s differs from the CONNECT target %s", quote(value), quote(target))
			}
		case "content-length", "transfer-encoding":
			return nil, connectErr("%s on a CONNECT: a CONNECT has no body", name)
		}
	}
	return req, nil
}

// parseAuthority reads host:port, host a DNS name, an IPv4 address or a
// bracketed IPv6 address.
func parseAuthority(t string) (*connectRequest, error) {
	i := strings.LastIndexByte(t, ':')
	if i <= 0 {
		return nil, connectErr("target %s is not host:port", quote(t))
	}
	host, port := t[:i], t[i+1:]
	if strings.ContainsAny(host, "@/?#%\\") {
		return nil, connectErr("target %s is not host:port (userinfo, paths and escapes are refused)", quote(t))
	}
	if strings.Contains(host, ":") && !strings.HasPrefix(host, "[") {
		return nil, connectErr("target %s: an IPv6 address must be in brackets", quote(t))
	}
	p := 0
	if port == "" || len(port) > 5 || port[0] == '0' {
		return nil, connectErr("target %s has a bad port", quote(t))
	}
	for _, c := range []byte(port) {
		if c < '0' || c > '9' {
			return nil, connectErr("target %s has a bad port", quote(t))
		}
		p = p*10 + int(c-'0')
	}
	if p > 65535 {
		return nil, connectErr("target %s has a bad port", quote(t))
	}
	h, err := netguard.ParseTarget(host)
	if err != nil {
		return nil, connectErr("target %s: %v", quote(t), err)
	}
	return &connectRequest{host: h, port: p, rawTgt: t}, nil
}

// TLS ClientHello peeking.
const (
	maxClientHello   = 64 << 10
	tlsRecordHandsh  = 0x16
	tlsHandshakeHelo = 0x01
)

// errNotTLS: the first bytes after the 200 are not a TLS ClientHello.
type errNotTLS struct{ Msg string }

func (e *errNotTLS) Error() string { return e.Msg }

// readClientHello reads TLS records from br until they hold one whole
// handshake message, which must be a ClientHello, and returns the raw
// record bytes (to be relayed unchanged) and its server name ("" when it
// has no server_name extension). At most maxClientHello bytes are read.
func readClientHello(br *bufio.Reader) (raw []byte, sni string, err error) {
	var hs []byte
	for {
		hdr, err := br.Peek(5)
		if err != nil {
			return nil, "", &errNotTLS{"the connection ended before a TLS ClientHello"}
		}
		if hdr[0] != tlsRecordHandsh || hdr[1] != 3 || hdr[2] > 4 {
			return nil, "", &errNotTLS{fmt.Sprintf("the first bytes after the 200 are not a TLS handshake record (0x%02x 0x%02x 0x%02x): the egress port carries TLS only", hdr[0], hdr[1], hdr[2])}
		}
		n := int(hdr[3])<<8 | int(hdr[4])
		if n == 0 || n > 1<<14+256 || len(raw)+5+n > maxClientHello {
			return nil, "", &errNotTLS{fmt.Sprintf("a TLS record of %d bytes (ClientHello limit %d)", n, maxClientHello)}
		}
		rec := make([]byte, 5+n)
		if _, err := io.ReadFull(br, rec); err != nil {
			return nil, "", &errNotTLS{"the connection ended inside a TLS record"}
		}
		raw = append(raw, rec...)
		hs = append(hs, rec[5:]...)
		if len(hs) >= 4 {
			if hs[0] != tlsHandshakeHelo {
				return nil, "", &errNotTLS{fmt.Sprintf("the first handshake message is of type %d, not a ClientHello", hs[0])}
			}
			m := int(hs[1])<<16 | int(hs[2])<<8 | int(hs[3])
			if m+4 > maxClientHello {
				return nil, "", &errNotTLS{"the ClientHello is too large"}
			}
			if len(hs) >= m+4 {
				sni, err := parseClientHelloSNI(hs[4 : 4+m])
				if errors.Is(err, errHiddenSNI) {
					return nil, "", err
				}
				if err != nil {
					return nil, "", &errNotTLS{err.Error()}
				}
				return raw, sni, nil
			}
		}
	}
}

// TLS extensions that hide the server name the server routes by: with
// Encrypted Client Hello the server_name moat reads is only the outer
// (public) name, which a CDN shares across every site behind it, and the
// name that selects the site is encrypted; ESNI (its draft predecessor)
// the same. Neither curl, git, pip, npm nor Go's crypto/tls sends them
// unless configured to.
const (
	tlsExtECH  = 0xfe0d // encrypted_client_hello
	tlsExtESNI = 0xffce // encrypted_server_name (draft)
)

// errHiddenSNI: the ClientHello hides its real server name (ECH, ESNI).
var errHiddenSNI = errors.New("the ClientHello carries Encrypted Client Hello (or ESNI): the server name it is sent to is encrypted, so moat cannot check it against the grant; turn ECH off for tunnels through moat")

// parseClientHelloSNI returns the host_name of the server_name
// extension of a ClientHello body, "" when there is none. More than one
// server_name extension or host_name is refused, and so is a ClientHello
// that hides its name (errHiddenSNI).
func parseClientHelloSNI(b []byte) (string, error) {
	bad := errors.New("malformed TLS ClientHello")
	s := cursor(b)
	if !s.skip(2+32) || !s.skipVec(1) || !s.skipVec(2) || !s.skipVec(1) {
		return "", bad
	}
	if len(s) == 0 {
		return "", nil // no extensions
	}
	exts, ok := s.vec(2)
	if !ok || len(s) != 0 {
		return "", bad
	}
	sni, seen := "", false
	for len(exts) > 0 {
		typ, ok1 := exts.u16()
		body, ok2 := exts.vec(2)
		if !ok1 || !ok2 {
			return "", bad
		}
		if typ == tlsExtECH || typ == tlsExtESNI {
			return "", errHiddenSNI
		}
		if typ != 0 {
			continue
		}
		if seen {
			return "", errors.New("two server_name extensions in the ClientHello")
		}
		seen = true
		list, ok := body.vec(2)
		if !ok || len(body) != 0 {
			return "", bad
		}
		for len(list) > 0 {
			nt, ok1 := list.u8()
			name, ok2 := list.vec(2)
			if !ok1 || !ok2 {
				return "", bad
			}
			if nt != 0 {
				continue
			}
			if sni != "" {
				return "", errors.New("two host names in the ClientHello's server_name")
			}
			if len(name) == 0 {
				return "", bad
			}
			sni = string(name)
		}
	}
	return sni, nil
}

type cursor []byte

func (c *cursor) skip(n int) bool {
	if len(*c) < n {
		return false
	}
	*c = (*c)[n:]
	return true
}

func (c *cursor) u8() (int, bool) {
	if len(*c) < 1 {
		return 0, false
	}
	v := int((*c)[0])
	*c = (*c)[1:]
	return v, true
}

func (c *cursor) u16() (int, bool) {
	if len(*c) < 2 {
		return 0, false
	}
	v := int((*c)[0])<<8 | int((*c)[1])
	*c = (*c)[2:]
	return v, true
}

func (c *cursor) vec(lenBytes int) (cursor, bool) {
	n := 0
	for range lenBytes {
		v, ok := c.u8()
		if !ok {
			return nil, false
		}
		n = n<<8 | v
	}
	if len(*c) < n {
		return nil, false
	}
	v := (*c)[:n]
	*c = (*c)[n:]
	return v, true
}

func (c *cursor) skipVec(lenBytes int) bool { _, ok := c.vec(lenBytes); return ok }
