package broker

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/moat-sandbox/moat/broker/wire"
)

// Limits of the front. A request that exceeds one is refused and its
// connection closed.
const (
	// MaxLineBytes caps the request line and each header field line.
	MaxLineBytes = 8 << 10
	// MaxHeaderBytes caps the request line plus all header lines.
	MaxHeaderBytes = 32 << 10
	// MaxHeaderFields caps the number of header fields.
	MaxHeaderFields = 64
	// MaxBodyBytes caps a request body after de-chunking (Anthropic's own
	// request limit is 32 MB).
	MaxBodyBytes = 32 << 20
	// maxChunkSizeDigits caps the hex digits of one chunk size.
	maxChunkSizeDigits = 8
	// frontBufferBytes is the bufio size; it must exceed MaxLineBytes.
	frontBufferBytes = MaxLineBytes + 2
)

// Front reason codes: why the front refused a request before any API
// check. They are the Reason of the inference.refused record.
const (
	ReasonBadFraming      Reason = "bad_framing"       // malformed request line or header syntax
	ReasonBareCRLF        Reason = "bare_cr_lf"        // CR or LF outside a CRLF pair
	ReasonNUL             Reason = "nul_byte"          // NUL or other control byte in the head
	ReasonObsFold         Reason = "obsolete_folding"  // header continuation line
	ReasonHeaderTooLarge  Reason = "header_too_large"  // a line, the head or the field count over a limit
	ReasonBodyTooLarge    Reason = "body_too_large"    // body over MaxBodyBytes
	ReasonVersion         Reason = "http_version"      // not HTTP/1.1 (HTTP/2 preface included)
	ReasonConnect         Reason = "connect_refused"   // CONNECT method
	ReasonTargetForm      Reason = "target_form"       // absolute-form, authority-form or asterisk-form target
	ReasonUpgrade         Reason = "upgrade_refused"   // Upgrade, h2c, HTTP2-Settings
	ReasonDuplicateHeader Reason = "duplicate_header"  // any header field given twice
	ReasonContentLength   Reason = "content_length"    // malformed Content-Length
	ReasonCLWithTE        Reason = "cl_with_te"        // both Content-Length and Transfer-Encoding
	ReasonTransferCoding  Reason = "transfer_coding"   // anything but one "chunked"
	ReasonChunked         Reason = "bad_chunked"       // malformed chunked body (extensions and trailers included)
	ReasonCompressedBody  Reason = "compressed_body"   // Content-Encoding on a request
	ReasonExpect          Reason = "expect_refused"    // Expect other than 100-continue
	ReasonConnection      Reason = "connection_header" // Connection option other than close/keep-alive
	ReasonMissingHost     Reason = "missing_host"      // no Host header
	ReasonPathTrick       Reason = "path_trick"        // dot segments, encoded or doubled slashes, backslashes
	ReasonQuery           Reason = "query_refused"     // any query string or fragment
	ReasonTimeout         Reason = "read_timeout"      // the client was too slow
	ReasonTruncated       Reason = "truncated"         // connection ended inside a request
)

// frontError is a request the front refused. Msg is written for a human and
// a model; it never quotes more than a short prefix of hostile input.
type frontError struct {
	Code   Reason
	Status int
	Msg    string // without the "moat: refused: " prefix, which the edge adds once
}

func (e *frontError) Error() string { return "moat: refused: " + e.Msg }

func refuse(code Reason, status int, format string, args ...any) *frontError {
	return &frontError{Code: code, Status: status, Msg: fmt.Sprintf(format, args...)}
}

// field is one header field; name is lower-cased.
type field struct{ name, value string }

// request is one request as the front accepted it: framing is settled and
// the body is de-chunked.
type request struct {
	method string
	path   string
	header []field
	body   []byte
	close  bool // the client asked to close after this request
	// Only under ServicesPathPrefix (service.go): the query, which the
	// service's grant checks, and the body's content coding (gzip).
	query    string
	encoding string
}

// get returns the value of the header named name (lower case).
func (r *request) get(name string) (string, bool) {
	for _, f := range r.header {
		if f.name == name {
			return f.value, true
		}
	}
	return "", false
}

// readRequest reads one request from br in stages, like net/http's
// readRequest and fixLength, but refusing every ambiguity instead of
// resolving it. When the client sent "Expect: 100-continue", the interim
// response is written to cont before the body is read. The error is a
// *frontError, or io.EOF when the connection ended before a request began.
//
// charge, when not nil, is called with the number of body bytes about to
// be buffered, before they are read; its error refuses the request.
func readRequest(br *bufio.Reader, cont io.Writer, charge func(n int64) error) (*request, error) {
	budget := MaxHeaderBytes
	line, err := readLine(br, &budget)
	if err != nil {
		return nil, err
	}
	req, err := parseRequestLine(line)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for {
		line, err := readLine(br, &budget)
		if err != nil {
			return nil, err
		}
		if len(line) == 0 {
			break
		}
		if line[0] == ' ' || line[0] == '\t' {
			return nil, refuse(ReasonObsFold, 400, "obsolete header line folding is not allowed; send each header on one line")
		}
		f, err := parseField(line)
		if err != nil {
			return nil, err
		}
		if seen[f.name] {
			return nil, refuse(ReasonDuplicateHeader, 400, "header %q appears more than once; send it once", f.name)
		}
		seen[f.name] = true
		if len(req.header) == MaxHeaderFields {
			return nil, refuse(ReasonHeaderTooLarge, 431, "more than %d header fields", MaxHeaderFields)
		}
		req.header = append(req.header, f)
	}
	length, chunked, expect, err := req.framing()
	if err != nil {
		return nil, err
	}
	if charge == nil {
		charge = func(int64) error { return nil }
	}
	if !chunked && length > 0 {
		if err := charge(int64(length)); err != nil {
			return nil, err
		}
	}
	if expect && (chunked || length > 0) {
		if _, err := io.WriteString(cont, "HTTP/1.1 100 Continue\r\n\r\n"); err != nil {
			return nil, refuse(ReasonTruncated, 400, "connection failed: %v", err)
		}
	}
	if chunked {
		req.body, err = readChunked(br, charge)
	} else {
		req.body, err = readFixed(br, length)
	}
	if err != nil {
		return nil, err
	}
	return req, nil
}

// readLine reads one CRLF-terminated line without its CRLF, charging it
// against budget. Bare CR, bare LF and NUL or other control bytes (other
// than HTAB) are refused.
func readLine(br *bufio.Reader, budget *int) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) || len(line) > MaxLineBytes {
		return nil, refuse(ReasonHeaderTooLarge, 431, "a request or header line is longer than %d bytes", MaxLineBytes)
	}
	if err != nil {
		return nil, ioRefusal(err, *budget == MaxHeaderBytes && len(line) == 0)
	}
	*budget -= len(line)
	if *budget < 0 {
		return nil, refuse(ReasonHeaderTooLarge, 431, "the request head is longer than %d bytes", MaxHeaderBytes)
	}
	if len(line) < 2 || line[len(line)-2] != '\r' {
		return nil, refuse(ReasonBareCRLF, 400, "a line ends in a bare LF; lines must end in CRLF")
	}
	line = line[:len(line)-2]
	for _, c := range line {
		switch {
		case c == '\r':
			return nil, refuse(ReasonBareCRLF, 400, "bare CR inside a request line or header")
		case c == 0:
			return nil, refuse(ReasonNUL, 400, "NUL byte in the request head")
		case c < 0x20 && c != '\t', c == 0x7f:
			return nil, refuse(ReasonNUL, 400, "control byte 0x%02x in the request head", c)
		}
	}
	return line, nil
}

// ioRefusal maps a read error inside a request to a refusal; atStart is
// true when nothing of the request had been read, which is a clean end.
func ioRefusal(err error, atStart bool) error {
	var ne interface{ Timeout() bool }
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		return refuse(ReasonTimeout, 408, "the request was not received in time")
	case atStart && errors.Is(err, io.EOF):
		return io.EOF
	default:
		return refuse(ReasonTruncated, 400, "the connection ended inside the request")
	}
}

func parseRequestLine(line []byte) (*request, error) {
	parts := strings.Split(string(line), " ")
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" {
		return nil, refuse(ReasonBadFraming, 400, "malformed request line; want METHOD SP /path SP HTTP/1.1")
	}
	method, target, version := parts[0], parts[1], parts[2]
	if version != "HTTP/1.1" {
		if strings.HasPrefix(version, "HTTP/2") || method == "PRI" {
			return nil, refuse(ReasonVersion, 505, "HTTP/2 is not supported; use HTTP/1.1 over plain TCP")
		}
		return nil, refuse(ReasonVersion, 505, "only HTTP/1.1 is supported, got %s", quote(version))
	}
	if !isToken(method) {
		return nil, refuse(ReasonBadFraming, 400, "malformed method %s", quote(method))
	}
	if method == "CONNECT" {
		return nil, refuse(ReasonConnect, 405, "CONNECT is not allowed: there is no tunnel out of the sandbox; send API requests to the broker directly")
	}
	if target[0] != '/' {
		return nil, refuse(ReasonTargetForm, 400, "request target must be a path like /v1/messages (absolute, authority and asterisk forms are refused)")
	}
	path, query := target, ""
	if strings.HasPrefix(target, ServicesPathPrefix) {
		path, query = splitServiceTarget(target)
	}
	if strings.HasPrefix(target, PackagesPathPrefix) {
		path = packageTarget(path)
	}
	if err := checkPath(path); err != nil {
		return nil, err
	}
	return &request{method: method, path: path, query: query}, nil
}

// checkPath refuses anything but a plain path: no query, no fragment, no
// percent-encoding (so no %2f or %5c), no empty or dot segments, no
// backslashes. Every endpoint moat serves is a fixed ASCII path.
func checkPath(p string) error {
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case c == '?' || c == '#':
			return refuse(ReasonQuery, 400, "query strings and fragments are not allowed (credentials such as ?key= are added by moat, not by the client)")
		case c == '%':
			return refuse(ReasonPathTrick, 400, "percent-encoded bytes are not allowed in the path")
		case c == '\\':
			return refuse(ReasonPathTrick, 400, "backslashes are not allowed in the path")
		case !isPathChar(c):
			return refuse(ReasonPathTrick, 400, "byte 0x%02x is not allowed in the path", c)
		}
	}
	segs := strings.Split(p[1:], "/")
	for i, s := range segs {
		switch {
		case s == "." || s == "..":
			return refuse(ReasonPathTrick, 400, "dot segments are not allowed in the path")
		case s == "" && i != len(segs)-1:
			return refuse(ReasonPathTrick, 400, "empty path segments (//) are not allowed")
		}
	}
	return nil
}

// isPathChar reports RFC 3986 pchar minus pct-encoded, plus "/".
func isPathChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("-._~!$&'()*+,;=:@/", c) >= 0
}

func parseField(line []byte) (field, error) {
	i := bytes.IndexByte(line, ':')
	if i <= 0 {
		return field{}, refuse(ReasonBadFraming, 400, "malformed header line %s", quote(string(line)))
	}
	name := string(line[:i])
	if !isToken(name) {
		return field{}, refuse(ReasonBadFraming, 400, "malformed header name %s (no spaces before the colon)", quote(name))
	}
	value := strings.Trim(string(line[i+1:]), " \t")
	for j := 0; j < len(value); j++ {
		if value[j] >= 0x80 {
			return field{}, refuse(ReasonBadFraming, 400, "header %s holds a non-ASCII byte", quote(name))
		}
	}
	return field{name: strings.ToLower(name), value: value}, nil
}

// framing settles how the body is delimited, like net/http's fixLength,
// and checks the headers that change the connection's protocol.
func (r *request) framing() (length int, chunked, expect bool, err error) {
	if _, ok := r.get("host"); !ok {
		return 0, false, false, refuse(ReasonMissingHost, 400, "HTTP/1.1 requires a Host header")
	}
	if _, ok := r.get("upgrade"); ok {
		return 0, false, false, refuse(ReasonUpgrade, 400, "protocol upgrades (h2c, websocket) are not allowed; use plain HTTP/1.1")
	}
	if _, ok := r.get("http2-settings"); ok {
		return 0, false, false, refuse(ReasonUpgrade, 400, "HTTP/2 upgrade is not allowed; use plain HTTP/1.1")
	}
	if v, ok := r.get("connection"); ok {
		for _, opt := range strings.Split(v, ",") {
			switch strings.ToLower(strings.Trim(opt, " \t")) {
			case "close":
				r.close = true
			case "keep-alive":
			case "upgrade":
				return 0, false, false, refuse(ReasonUpgrade, 400, "protocol upgrades are not allowed; use plain HTTP/1.1")
			default:
				return 0, false, false, refuse(ReasonConnection, 400, "Connection option %s is not allowed (only close or keep-alive)", quote(opt))
			}
		}
	}
	if v, ok := r.get("content-encoding"); ok && !r.serviceCoding(v) {
		return 0, false, false, refuse(ReasonCompressedBody, 415, "compressed request bodies are not accepted; send the JSON body uncompressed, without Content-Encoding")
	}
	if v, ok := r.get("expect"); ok {
		if !strings.EqualFold(v, "100-continue") {
			return 0, false, false, refuse(ReasonExpect, 417, "Expect %s is not supported", quote(v))
		}
		expect = true
	}
	cl, hasCL := r.get("content-length")
	te, hasTE := r.get("transfer-encoding")
	switch {
	case hasCL && hasTE:
		return 0, false, false, refuse(ReasonCLWithTE, 400, "Content-Length together with Transfer-Encoding is ambiguous; send one")
	case hasTE:
		if !strings.EqualFold(te, "chunked") {
			return 0, false, false, refuse(ReasonTransferCoding, 501, "transfer coding %s is not supported; only a single chunked is", quote(te))
		}
		return 0, true, expect, nil
	case hasCL:
		n, ok := parseLength(cl)
		if !ok {
			return 0, false, false, refuse(ReasonContentLength, 400, "malformed Content-Length %s; want one decimal number", quote(cl))
		}
		if n > MaxBodyBytes {
			return 0, false, false, refuse(ReasonBodyTooLarge, 413, "request body of %d bytes is over the limit of %d", n, MaxBodyBytes)
		}
		return int(n), false, expect, nil
	}
	return 0, false, expect, nil
}

// parseLength accepts 1 to 10 decimal digits and nothing else (no sign, no
// list, no whitespace inside).
func parseLength(s string) (int64, bool) {
	if s == "" || len(s) > 10 {
		return 0, false
	}
	var n int64
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
		n = n*10 + int64(s[i]-'0')
	}
	return n, true
}

func readFixed(br *bufio.Reader, n int) ([]byte, error) {
	body := make([]byte, n)
	if _, err := io.ReadFull(br, body); err != nil {
		return nil, ioRefusal(err, false)
	}
	return body, nil
}

// readChunked de-chunks a body. Chunk extensions and trailer fields are
// refused: no client moat serves needs them, and both have been the seat of
// request-smuggling bugs.
func readChunked(br *bufio.Reader, charge func(int64) error) ([]byte, error) {
	var body []byte
	for {
		budget := MaxLineBytes
		line, err := readLine(br, &budget)
		if err != nil {
			if fe, ok := err.(*frontError); ok && fe.Code != ReasonTimeout && fe.Code != ReasonTruncated {
				fe.Code, fe.Status = ReasonChunked, 400
			}
			return nil, err
		}
		size, ok := parseChunkSize(line)
		if !ok {
			return nil, refuse(ReasonChunked, 400, "malformed chunk size line %s (chunk extensions are not accepted)", quote(string(line)))
		}
		if size == 0 {
			budget = MaxLineBytes
			end, err := readLine(br, &budget)
			if err != nil {
				return nil, err
			}
			if len(end) != 0 {
				return nil, refuse(ReasonChunked, 400, "chunked trailer fields are not accepted")
			}
			return body, nil
		}
		if int64(len(body))+size > MaxBodyBytes {
			return nil, refuse(ReasonBodyTooLarge, 413, "request body is over the limit of %d bytes", MaxBodyBytes)
		}
		if err := charge(size); err != nil {
			return nil, err
		}
		start := len(body)
		body = append(body, make([]byte, size)...)
		if _, err := io.ReadFull(br, body[start:]); err != nil {
			return nil, ioRefusal(err, false)
		}
		var crlf [2]byte
		if _, err := io.ReadFull(br, crlf[:]); err != nil {
			return nil, ioRefusal(err, false)
		}
		if crlf != [2]byte{'\r', '\n'} {
			return nil, refuse(ReasonChunked, 400, "chunk data is not followed by CRLF")
		}
	}
}

func parseChunkSize(line []byte) (int64, bool) {
	if len(line) == 0 || len(line) > maxChunkSizeDigits {
		return 0, false
	}
	var n int64
	for _, c := range line {
		var d byte
		switch {
		case '0' <= c && c <= '9':
			d = c - '0'
		case 'a' <= c && c <= 'f':
			d = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			d = c - 'A' + 10
		default:
			return 0, false
		}
		n = n<<4 | int64(d)
	}
	return n, true
}

// isToken reports an RFC 9110 token.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// clip shortens hostile input before it is quoted in a message.
func clip(s string) string {
	const max = 40
	if len(s) > max {
		return s[:max] + "…"
	}
	return s
}

// quote quotes a client-supplied value in a refusal: at most
// wire.MaxQuotedBytes of it, plus its length and sha256 when it is longer.
func quote(s string) string { return wire.Quote(s) }
