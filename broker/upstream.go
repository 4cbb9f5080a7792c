package broker

import (
	"bufio"
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/broker/wire"
)

// Reasons of inference.failed records (and of the worker's error).
const (
	ReasonAuditFailure        Reason = "audit_failure"        // the pre-effect record could not be made durable
	ReasonUpstreamError       Reason = "upstream_error"       // transport error, or the stream broke
	ReasonUpstreamRedirect    Reason = "upstream_redirect"    // a 3xx; never followed
	ReasonUpstreamEncoding    Reason = "upstream_encoding"    // a content coding other than identity, gzip, deflate
	ReasonResponseTooLarge    Reason = "response_too_large"   // over MaxResponseBytes after decoding
	ReasonCredentialReflect   Reason = "credential_reflected" // the response carried the credential
	ReasonResponseUnscannable Reason = "response_unscannable" // more distinct blocks than the guard follows
	ReasonClientClosed        Reason = "client_closed"        // the worker went away mid-stream
	preEffectHeader                  = "Moat-Pre-Effect"
	brokerUserAgent                  = "moat-broker/1"
	streamReadBytes                  = 32 << 10
)

// forward sends one admitted request: pre-effect record first, then the
// request, then the scanned response. It reports whether the connection may
// be kept.
func (b *Broker) forward(x *exchange, req *request, adm *wire.Request, fwd map[string]string) bool {
	p := x.provider
	if fe := b.reserveBudget(x, adm.MaxTokens); fe != nil {
		return b.refuse(x, fe)
	}
	sum := sha256.Sum256(adm.Canonical)
	rec := audit.InferenceRequested{
		RequestID: x.id, Provider: p.name, API: x.api, Endpoint: x.endpoint, Model: adm.Model,
		BodySHA256: hexString(sum[:]), ReservedTokens: adm.MaxTokens, Stream: adm.Stream,
		Attribution: b.attribution(x),
	}
	if len(fwd) > 0 {
		// The record shows exactly the worker headers that are sent.
		rec.Headers = fwd
	}
	faultPoint(FaultPreDurable) // test builds only (faulthook_hooks.go)
	line, ok := b.append(rec)
	if !ok {
		// No durable record, no request.
		return b.answerFailure(x, ReasonAuditFailure, 503, "the run's audit journal failed, so this request was not sent and no further requests are possible; the run is ending")
	}
	if b.failed.Load() {
		return b.failRequest(x, ReasonRunFailed, 503, fmt.Sprintf("the run was stopped after a fatal event (%s); the request was not sent", b.fatalReason()))
	}
	hreq := p.newRequest(b.ctx, x.endpoint, adm.Canonical, fwd, adm.Stream, line)
	faultPoint(FaultPreSend)
	resp, err := p.do(hreq)
	if err != nil {
		return b.upstreamFailed(x, err, ReasonUpstreamError, fmt.Sprintf("provider %q could not be reached", p.name))
	}
	defer resp.Body.Close()
	if headReflects(p.pat, resp.Status, resp.Header) {
		return b.withhold(x, "the response head")
	}
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		return b.failRequest(x, ReasonUpstreamRedirect, 502, fmt.Sprintf("provider %q answered with a redirect (HTTP %d); moat never follows redirects", p.name, resp.StatusCode))
	}
	body, layers, err := decodeBody(resp)
	if err != nil {
		return b.upstreamFailed(x, err, ReasonUpstreamEncoding, fmt.Sprintf("provider %q sent a response moat cannot inspect", p.name))
	}
	hdr := make([][2]string, 1, 2+len(returnedHeaders)+3)
	hdr[0] = [2]string{"Moat-Request-Id", x.id}
	for _, name := range returnedHeaders {
		if v := resp.Header.Get(name); v != "" {
			hdr = append(hdr, [2]string{name, v})
		}
	}
	x.w.charge.deadline = time.Now().Add(b.readTimeout)
	if isEventStream(resp.Header.Get("Content-Type")) {
		// A stream that starts with a compression header is read whole:
		// its layers are decoded and scanned before anything is released.
		br := bufio.NewReaderSize(body, 16)
		if start, _ := br.Peek(2); !looksCompressed(start) {
			return b.stream(x, resp.StatusCode, hdr, br, req.close)
		}
		body = br
	}
	data, err := b.readResponse(x.w, body)
	var fe *frontError
	switch {
	case errors.As(err, &fe):
		return b.failRequest(x, fe.Code, 502, fe.Msg)
	case err != nil:
		return b.upstreamFailed(x, err, ReasonUpstreamError, fmt.Sprintf("reading the response of provider %q failed", p.name))
	}
	hit, nested, err := inspectLayers(p.pat, data, maxCompressionDepth-layers)
	switch {
	case hit:
		return b.withhold(x, "the response body")
	case errors.As(err, &fe):
		return b.failRequest(x, fe.Code, 502, fe.Msg)
	case errors.Is(err, errUnscannable):
		return b.failRequest(x, ReasonResponseUnscannable, 502, err.Error())
	case err != nil || nested:
		return b.failRequest(x, ReasonUpstreamEncoding, 502, fmt.Sprintf("provider %q sent a body that is compressed underneath its declared content coding; moat does not pass on compressed layers", p.name))
	}
	// The answer is released before its completion record is durable
	// (doc.go says why that is safe): the record is written in its place
	// first, and made durable off the request's path (syncSoon).
	faultPoint(FaultPreComplete)
	rsum := sha256.Sum256(data)
	u := usageOf(data)
	b.closeBudget(x, &u)
	_, wait, ok := b.appendAsync(audit.InferenceCompleted{RequestID: x.id, Status: resp.StatusCode,
		ResponseSHA256: hexString(rsum[:]), ResponseBytes: int64(len(data)), Usage: u}, true)
	if !ok {
		return b.answerFailure(x, ReasonAuditFailure, 503, "the run's audit journal failed; the response is withheld and the run is ending")
	}
	x.status = resp.StatusCode
	werr := writeFull(x.w.bw, resp.StatusCode, hdr, data, req.close)
	b.syncSoon(wait)
	b.logDecision(x, slog.LevelInfo, decisionCompleted, "", "")
	return werr == nil
}

// newRequest builds the upstream request of an admitted body: the
// worker headers forwarded (fwd, lower-case names, canonical values), then
// the broker's own, the pre-effect record (line) and the credential. Its
// header values share one array (each a slice of capacity one).
func (p *provider) newRequest(ctx context.Context, endpoint string, body []byte, fwd map[string]string, stream bool, line []byte) *http.Request {
	u := *p.urls[endpoint]
	vals := make([]string, 0, len(fwd)+7)
	h := make(http.Header, len(fwd)+7)
	set := func(name, v string) {
		vals = append(vals, v)
		h[name] = vals[len(vals)-1 : len(vals) : len(vals)]
	}
	for name, v := range fwd {
		set(canonicalHeaderName(name), v)
	}
	set("Content-Type", "application/json")
	set("Accept-Encoding", "gzip, deflate")
	set("User-Agent", brokerUserAgent)
	if stream {
		set("Accept", "text/event-stream")
	} else {
		set("Accept", "application/json")
	}
	set(preEffectHeader, base64String(line))
	set(p.credHeader, p.credValue)
	r := &http.Request{
		Method:        http.MethodPost,
		URL:           &u,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        h,
		Body:          io.NopCloser(bytes.NewReader(body)),
		GetBody:       func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil },
		ContentLength: int64(len(body)),
		Host:          strings.TrimSuffix(u.Host, ":"), // as http.NewRequest: an empty port dropped
	}
	return r.WithContext(ctx)
}

// do sends r on the provider's transport as http.Client.Do would with
// this client (no jar, no timeout, redirects returned unfollowed), without
// the client's copy of every header kept for redirects that are never
// followed. Its error is the client's *url.Error.
func (p *provider) do(r *http.Request) (*http.Response, error) {
	resp, err := p.transport.RoundTrip(r)
	if err != nil {
		return nil, &url.Error{Op: "Post", URL: r.URL.String(), Err: err}
	}
	return resp, nil
}

// base64String is base64.StdEncoding.EncodeToString with one allocation
// instead of two.
func base64String(b []byte) string {
	const in = 768 // a multiple of 3: no padding inside
	var chunk [in / 3 * 4]byte
	var sb strings.Builder
	sb.Grow(base64.StdEncoding.EncodedLen(len(b)))
	for len(b) > 0 {
		n := min(len(b), in)
		m := base64.StdEncoding.EncodedLen(n)
		base64.StdEncoding.Encode(chunk[:m], b[:n])
		sb.Write(chunk[:m])
		b = b[n:]
	}
	return sb.String()
}

// hexString is hex.EncodeToString of a sha256 sum with one allocation.
func hexString(sum []byte) string {
	var buf [2 * sha256.Size]byte
	if len(sum) > sha256.Size {
		return hex.EncodeToString(sum)
	}
	n := hex.Encode(buf[:], sum)
	return string(buf[:n])
}

// isEventStream reports whether a Content-Type names text/event-stream,
// as mime.ParseMediaType reads it; the common JSON answer is recognised
// without parsing.
func isEventStream(ct string) bool {
	if ct == "application/json" {
		return false
	}
	mt, _, _ := mime.ParseMediaType(ct)
	return mt == "text/event-stream"
}

// readBufs holds readResponse's scratch buffers: one of streamReadBytes
// per answer was half of all the bytes the broker allocated (bench/README).
var readBufs = sync.Pool{New: func() any { b := make([]byte, streamReadBytes); return &b }}

// readResponse buffers a decoded response, charging it to the memory
// budget as it grows.
func (b *Broker) readResponse(w *conn, body io.Reader) ([]byte, error) {
	var data []byte
	bp := readBufs.Get().(*[]byte)
	defer readBufs.Put(bp)
	buf := *bp
	for {
		n, err := body.Read(buf)
		if n > 0 {
			if len(data)+n > MaxResponseBytes {
				return nil, refuse(ReasonResponseTooLarge, 502, "the response is larger than %d bytes", MaxResponseBytes)
			}
			if cerr := w.charge.takeRaw(int64(n)); cerr != nil {
				return nil, cerr
			}
			data = append(data, buf[:n]...)
		}
		if err == io.EOF {
			return data, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// stream passes an SSE response through as it arrives. Every byte is
// scanned before release, and bytes are released only up to the end of the
// last complete event (see scan.go), so the event in progress is held back.
func (b *Broker) stream(x *exchange, status int, hdr [][2]string, body io.Reader, closeAfter bool) bool {
	w, p := x.w, x.provider
	hdr = append(hdr, [2]string{"Transfer-Encoding", "chunked"}, [2]string{"Cache-Control", "no-cache"})
	if closeAfter {
		hdr = append(hdr, [2]string{"Connection", "close"})
	}
	x.status = status
	writeHead(w.bw, status, hdr)
	if err := w.bw.Flush(); err != nil {
		return b.failStream(x, ReasonClientClosed, "the worker closed the connection")
	}
	var (
		sc       = newScanner(p.pat)
		cw       = chunkWriter{w.bw}
		sum      = sha256.New()
		usage    sseUsage
		total    int64 // bytes read
		released int64 // bytes released
		pending  []byte
		buf      = make([]byte, streamReadBytes)
		charged  int64
	)
	release := func(q []byte) error {
		sum.Write(q)
		usage.feed(q)
		released += int64(len(q))
		return cw.write(q)
	}
	reflected := func() bool {
		b.fatal(ReasonCredentialReflect, fmt.Errorf("%w (in the stream)", errReflected))
		b.abortStream(x, ReasonCredentialReflect, "the provider's response was withheld from here on: it contained the run's credential; the run is being cancelled")
		return false
	}
	for {
		n, rerr := body.Read(buf)
		if n > 0 {
			total += int64(n)
			if total > MaxResponseBytes {
				b.abortStream(x, ReasonResponseTooLarge, fmt.Sprintf("the streamed response is larger than %d bytes", MaxResponseBytes))
				return false
			}
			if sc.Write(buf[:n]) {
				return reflected()
			}
			if sc.err != nil {
				b.abortStream(x, ReasonResponseUnscannable, sc.err.Error())
				return false
			}
			pending = append(pending, buf[:n]...)
			if cut := sc.safe - released; cut > 0 {
				if err := release(pending[:cut]); err != nil {
					return b.failStream(x, ReasonClientClosed, "the worker closed the connection mid-stream")
				}
				pending = append(pending[:0], pending[cut:]...)
			}
			if len(pending) > maxStreamEventBytes {
				b.abortStream(x, ReasonResponseTooLarge, fmt.Sprintf("an SSE event is larger than %d bytes; moat holds each event until it is complete to scan it", maxStreamEventBytes))
				return false
			}
			if c := int64(cap(pending)); c > charged {
				if err := w.charge.takeRaw(c - charged); err != nil {
					fe := err.(*frontError)
					b.abortStream(x, fe.Code, fe.Msg)
					return false
				}
				charged = c
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			if containsCredential(p.pat, []byte(rerr.Error())) {
				return reflected()
			}
			b.abortStream(x, ReasonUpstreamError, "the provider's stream broke: "+upstreamErrText(rerr))
			return false
		}
	}
	if sc.Close() {
		return reflected()
	}
	if sc.err != nil {
		b.abortStream(x, ReasonResponseUnscannable, sc.err.Error())
		return false
	}
	if err := release(pending); err != nil {
		return b.failStream(x, ReasonClientClosed, "the worker closed the connection mid-stream")
	}
	b.closeBudget(x, &usage.u)
	_, wait, ok := b.appendAsync(audit.InferenceCompleted{RequestID: x.id, Status: status,
		ResponseSHA256: hexString(sum.Sum(nil)), ResponseBytes: total, Usage: usage.u}, true)
	if !ok {
		return false // the stream is cut short without its terminating chunk
	}
	werr := cw.end()
	b.syncSoon(wait)
	b.logDecision(x, slog.LevelInfo, decisionCompleted, "", "")
	return werr == nil
}

// failurePrefix is the edge's prefix of a failure's detail: "moat:
// <reason>: ". Messages inside moat carry none.
func failurePrefix(reason Reason) string { return "moat: " + string(reason) + ": " }

// abortStream ends a stream the worker already started to read: an error
// event in the API's shape, then the connection is closed without the
// terminating chunk, so SDKs report an error.
func (b *Broker) abortStream(x *exchange, reason Reason, msg string) {
	detail := b.failStreamDetail(x, reason, msg)
	ev := "event: error\ndata: " + string(errorBody(x.api, 502, reason, detail)) + "\n\n"
	chunkWriter{x.w.bw}.write([]byte(ev))
}

// failStream journals inference.failed for a request that had its
// pre-effect record and logs its canonical line; it reports false.
func (b *Broker) failStream(x *exchange, reason Reason, msg string) bool {
	b.failStreamDetail(x, reason, msg)
	return false
}

func (b *Broker) failStreamDetail(x *exchange, reason Reason, msg string) string {
	detail := wire.BoundTo(failurePrefix(reason)+strings.ToValidUTF8(msg, "\uFFFD"), MaxDetailBytes)
	b.logDecision(x, slog.LevelWarn, decisionFailed, reason, detail)
	b.closeBudget(x, nil)
	b.append(audit.InferenceFailed{RequestID: x.id, Reason: string(reason), Detail: detail})
	return detail
}

// failRequest journals inference.failed for a request that had its
// pre-effect record, and answers the worker with an error.
func (b *Broker) failRequest(x *exchange, reason Reason, status int, msg string) bool {
	x.status = status
	detail := b.failStreamDetail(x, reason, msg)
	writeError(x.w.bw, x.api, status, reason, detail, x.id)
	return false
}

// answerFailure answers a request whose record could not be made (the
// journal failed): nothing more can be journaled, so only the log line
// and the answer say so.
func (b *Broker) answerFailure(x *exchange, reason Reason, status int, msg string) bool {
	x.status = status
	detail := failurePrefix(reason) + msg
	b.closeBudget(x, nil)
	b.logDecision(x, slog.LevelWarn, decisionFailed, reason, detail)
	writeError(x.w.bw, x.api, status, reason, detail, x.id)
	return false
}

// withhold handles a response that carried the credential: the run is
// stopped first (so no other request leaves), then the failure journaled.
func (b *Broker) withhold(x *exchange, where string) bool {
	b.fatal(ReasonCredentialReflect, fmt.Errorf("%w (in %s)", errReflected, where))
	return b.failRequest(x, ReasonCredentialReflect, 502,
		"the provider's response was withheld: it contained the run's credential; the run is being cancelled")
}

// upstreamFailed handles a transport or decoding error. Its text may quote
// provider bytes (net/http quotes malformed status lines and headers), so
// it is scanned, and what the worker and the journal get is only
// upstreamErrText's fixed description.
func (b *Broker) upstreamFailed(x *exchange, err error, reason Reason, what string) bool {
	if containsCredential(x.provider.pat, []byte(err.Error())) {
		return b.withhold(x, "an upstream error")
	}
	return b.failRequest(x, reason, 502, what+": "+upstreamErrText(err))
}

// upstreamErrText describes an upstream error without any of its text:
// from its type and the standard sentinels only.
func upstreamErrText(err error) string {
	var (
		ne   net.Error
		op   *net.OpError
		cve  *tls.CertificateVerificationError
		rhe  tls.RecordHeaderError
		uae  x509.UnknownAuthorityError
		hne  x509.HostnameError
		cie  x509.CertificateInvalidError
		flt  flate.CorruptInputError
		cerr *codingError
	)
	switch {
	case errors.Is(err, context.Canceled):
		return "the request was cancelled (the run is ending)"
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timed out"
	case errors.As(err, &cve), errors.As(err, &uae), errors.As(err, &hne), errors.As(err, &cie):
		return "the provider's TLS certificate did not verify"
	case errors.As(err, &rhe):
		return "the TLS handshake failed (the endpoint does not speak TLS)"
	case errors.As(err, &op) && op.Op == "dial":
		return "the connection could not be made"
	case errors.As(err, &cerr):
		return cerr.msg
	case errors.Is(err, gzip.ErrHeader), errors.Is(err, gzip.ErrChecksum), errors.Is(err, zlib.ErrHeader),
		errors.Is(err, zlib.ErrChecksum), errors.Is(err, zlib.ErrDictionary), errors.As(err, &flt):
		return "the compressed body is corrupt"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "the connection closed before the response was complete"
	}
	return fmt.Sprintf("the response is not valid HTTP or the transport failed (%T; the text is withheld because it may quote provider bytes)", err)
}

// codingError is decodeBody's own refusal, with a text that quotes no
// provider bytes.
type codingError struct{ msg string }

func (e *codingError) Error() string { return e.msg }

// knownCodings are content codings moat names in its refusal; any other
// value is not quoted.
var knownCodings = []string{"br", "zstd", "compress", "x-compress", "dcb", "dcz", "aes128gcm"}

// decodeBody undoes the response's content codings, in the reverse order of
// the list (several headers are one list): identity, gzip or deflate
// (zlib-wrapped or raw), at most maxCompressionDepth of them. It returns the
// number of layers undone.
func decodeBody(resp *http.Response) (io.Reader, int, error) {
	var codings []string
	for _, v := range resp.Header.Values("Content-Encoding") {
		for _, c := range strings.Split(v, ",") {
			c = strings.ToLower(strings.TrimSpace(c))
			if c != "" && c != "identity" {
				codings = append(codings, c)
			}
		}
	}
	if len(codings) > maxCompressionDepth {
		return nil, 0, &codingError{fmt.Sprintf("%d content codings are declared; moat decodes at most %d", len(codings), maxCompressionDepth)}
	}
	var r io.Reader = resp.Body
	for i := len(codings) - 1; i >= 0; i-- {
		switch codings[i] {
		case "gzip", "x-gzip":
			zr, err := gzip.NewReader(r)
			if err != nil {
				return nil, 0, err
			}
			r = zr
		case "deflate":
			br := bufio.NewReader(r)
			hdr, _ := br.Peek(2)
			if len(hdr) == 2 && hdr[0]&0x0f == 8 && (uint16(hdr[0])<<8|uint16(hdr[1]))%31 == 0 {
				zr, err := zlib.NewReader(br)
				if err != nil {
					return nil, 0, err
				}
				r = zr
			} else {
				r = flate.NewReader(br)
			}
		default:
			name := "an unknown content coding"
			if slices.Contains(knownCodings, codings[i]) {
				name = "content coding " + codings[i]
			}
			return nil, 0, &codingError{name + " is not supported (identity, gzip, deflate are)"}
		}
	}
	return r, len(codings), nil
}
