package broker

import (
	"bufio"
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/broker/wire"
)

// Reasons of inference.failed records (and of the worker's error).
const (
	ReasonAuditFailure       = "audit_failure"        // the pre-effect record could not be made durable
	ReasonUpstreamError      = "upstream_error"       // transport error, or the stream broke
	ReasonUpstreamRedirect   = "upstream_redirect"    // a 3xx; never followed
	ReasonUpstreamEncoding   = "upstream_encoding"    // a content coding other than identity, gzip, deflate
	ReasonResponseTooLarge   = "response_too_large"   // over MaxResponseBytes after decoding
	ReasonCredentialReflect  = "credential_reflected" // the response carried the credential
	ReasonClientClosed       = "client_closed"        // the worker went away mid-stream
	preEffectHeader          = "Moat-Pre-Effect"
	brokerUserAgent          = "moat-broker/1"
	streamReadBytes          = 32 << 10
	maxPendingWithoutNewline = 64 << 10
)

// forward sends one admitted request: pre-effect record first, then the
// request, then the scanned response. It reports whether the connection may
// be kept.
func (b *Broker) forward(w *conn, rt *route, p *provider, req *request, adm *wire.Request, fwd http.Header, id string, att audit.Attribution) bool {
	sum := sha256.Sum256(adm.Canonical)
	line, ok := b.append(audit.InferenceRequested{
		RequestID: id, Provider: p.name, API: rt.api, Endpoint: rt.endpoint, Model: adm.Model,
		BodySHA256: hex.EncodeToString(sum[:]), ReservedTokens: adm.MaxTokens, Stream: adm.Stream,
		Attribution: att,
	})
	if !ok {
		// No durable record, no request.
		b.log.Error("moat.broker failed", "request_id", id, "reason", ReasonAuditFailure, "provider", p.name, "endpoint", rt.endpoint)
		writeError(w.bw, rt.api, 503, ReasonAuditFailure, "moat: audit_failure: the run's audit journal failed, so this request was not sent and no further requests are possible; the run is ending", id)
		return false
	}
	if b.failed.Load() {
		return b.failRequest(w, rt.api, id, ReasonRunFailed, 503, fmt.Sprintf("the run was stopped after a fatal event (%v); the request was not sent", b.Failed()))
	}
	hreq, err := http.NewRequestWithContext(b.ctx, http.MethodPost, p.url(rt.endpoint), bytes.NewReader(adm.Canonical))
	if err != nil {
		return b.failRequest(w, rt.api, id, ReasonInternal, 500, "BUG: building the upstream request: "+err.Error())
	}
	hreq.Header = fwd.Clone()
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept-Encoding", "gzip, deflate")
	hreq.Header.Set("User-Agent", brokerUserAgent)
	if adm.Stream {
		hreq.Header.Set("Accept", "text/event-stream")
	} else {
		hreq.Header.Set("Accept", "application/json")
	}
	hreq.Header.Set(preEffectHeader, base64.StdEncoding.EncodeToString(line))
	p.setCredential(hreq.Header)
	resp, err := p.client.Do(hreq)
	if err != nil {
		return b.failRequest(w, rt.api, id, ReasonUpstreamError, 502, fmt.Sprintf("provider %q could not be reached: %v", p.name, scrub(err.Error(), p.cred)))
	}
	defer resp.Body.Close()
	var head bytes.Buffer
	for name, vals := range resp.Header {
		for _, v := range vals {
			fmt.Fprintf(&head, "%s: %s\n", name, v)
		}
	}
	if containsCredential(p.cred, head.Bytes()) {
		return b.withhold(w, rt.api, id, "a response header")
	}
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		return b.failRequest(w, rt.api, id, ReasonUpstreamRedirect, 502, fmt.Sprintf("provider %q answered with a redirect (HTTP %d); moat never follows redirects", p.name, resp.StatusCode))
	}
	body, err := decodeBody(resp)
	if err != nil {
		return b.failRequest(w, rt.api, id, ReasonUpstreamEncoding, 502, fmt.Sprintf("provider %q sent a response moat cannot inspect: %v", p.name, err))
	}
	hdr := [][2]string{{"Moat-Request-Id", id}}
	for _, name := range returnedHeaders {
		if v := resp.Header.Get(name); v != "" {
			hdr = append(hdr, [2]string{name, v})
		}
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt == "text/event-stream" {
		return b.stream(w, rt.api, id, p, resp.StatusCode, hdr, body, req.close)
	}
	w.charge.deadline = time.Now().Add(b.readTimeout)
	data, err := b.readResponse(w, body)
	var fe *frontError
	switch {
	case errors.As(err, &fe):
		return b.failRequest(w, rt.api, id, fe.Code, 502, fe.Msg)
	case err != nil:
		return b.failRequest(w, rt.api, id, ReasonUpstreamError, 502, fmt.Sprintf("reading the response of provider %q failed: %v", p.name, scrub(err.Error(), p.cred)))
	}
	if containsCredential(p.cred, data) {
		return b.withhold(w, rt.api, id, "the response body")
	}
	rsum := sha256.Sum256(data)
	if _, ok := b.append(audit.InferenceCompleted{RequestID: id, Status: resp.StatusCode,
		ResponseSHA256: hex.EncodeToString(rsum[:]), ResponseBytes: int64(len(data)), Usage: usageOf(data)}); !ok {
		writeError(w.bw, rt.api, 503, ReasonAuditFailure, "moat: audit_failure: the run's audit journal failed; the response is withheld and the run is ending", id)
		return false
	}
	b.log.Info("moat.broker completed", "request_id", id, "provider", p.name, "endpoint", rt.endpoint, "status", resp.StatusCode)
	return writeFull(w.bw, resp.StatusCode, hdr, data, req.close) == nil
}

// readResponse buffers a decoded response, charging it to the memory
// budget as it grows.
func (b *Broker) readResponse(w *conn, body io.Reader) ([]byte, error) {
	var data []byte
	buf := make([]byte, streamReadBytes)
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

// stream passes an SSE response through as it arrives. Bytes are released
// up to the last line feed (a credential cannot span one), or, on a long
// line, all but holdBack bytes; everything is scanned before release.
func (b *Broker) stream(w *conn, api, id string, p *provider, status int, hdr [][2]string, body io.Reader, closeAfter bool) bool {
	hdr = append(hdr, [2]string{"Transfer-Encoding", "chunked"}, [2]string{"Cache-Control", "no-cache"})
	if closeAfter {
		hdr = append(hdr, [2]string{"Connection", "close"})
	}
	writeHead(w.bw, status, hdr)
	if err := w.bw.Flush(); err != nil {
		return b.failStream(id, ReasonClientClosed, "the worker closed the connection")
	}
	var (
		sc      = newScanner(p.cred)
		hold    = holdBack(p.cred)
		cw      = chunkWriter{w.bw}
		sum     = sha256.New()
		usage   sseUsage
		total   int64
		pending []byte
		buf     = make([]byte, streamReadBytes)
	)
	release := func(q []byte) error {
		sum.Write(q)
		usage.feed(q)
		return cw.write(q)
	}
	for {
		n, rerr := body.Read(buf)
		if n > 0 {
			total += int64(n)
			if total > MaxResponseBytes {
				b.abortStream(w, api, id, ReasonResponseTooLarge, fmt.Sprintf("the streamed response is larger than %d bytes", MaxResponseBytes))
				return false
			}
			if sc.Write(buf[:n]) {
				b.fatal(ReasonCredentialReflect, errReflected)
				b.abortStream(w, api, id, ReasonCredentialReflect, "the provider's response was withheld: it contained the run's credential; the run is being cancelled")
				return false
			}
			pending = append(pending, buf[:n]...)
			cut := bytes.LastIndexByte(pending, '\n') + 1
			if cut == 0 && len(pending) > maxPendingWithoutNewline+hold {
				cut = len(pending) - hold
			}
			if cut > 0 {
				if err := release(pending[:cut]); err != nil {
					return b.failStream(id, ReasonClientClosed, "the worker closed the connection mid-stream")
				}
				pending = append(pending[:0], pending[cut:]...)
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			b.abortStream(w, api, id, ReasonUpstreamError, "the provider's stream broke: "+scrub(rerr.Error(), p.cred))
			return false
		}
	}
	if err := release(pending); err != nil {
		return b.failStream(id, ReasonClientClosed, "the worker closed the connection mid-stream")
	}
	if _, ok := b.append(audit.InferenceCompleted{RequestID: id, Status: status,
		ResponseSHA256: hex.EncodeToString(sum.Sum(nil)), ResponseBytes: total, Usage: usage.u}); !ok {
		return false // the stream is cut short without its terminating chunk
	}
	b.log.Info("moat.broker completed", "request_id", id, "provider", p.name, "status", status, "stream", true)
	return cw.end() == nil
}

// abortStream ends a stream the worker already started to read: an error
// event in the API's shape, then the connection is closed without the
// terminating chunk, so SDKs report an error.
func (b *Broker) abortStream(w *conn, api, id, reason, msg string) {
	b.failStream(id, reason, msg)
	ev := "event: error\ndata: " + string(errorBody(api, 502, reason, "moat: "+reason+": "+msg)) + "\n\n"
	chunkWriter{w.bw}.write([]byte(ev))
}

func (b *Broker) failStream(id, reason, msg string) bool {
	msg = strings.ToValidUTF8(msg, "\uFFFD")
	b.log.Warn("moat.broker failed", "request_id", id, "reason", reason, "detail", msg)
	b.append(audit.InferenceFailed{RequestID: id, Reason: reason, Detail: "moat: " + reason + ": " + msg})
	return false
}

// failRequest journals inference.failed for a request that had its
// pre-effect record, and answers the worker with an error.
func (b *Broker) failRequest(w *conn, api, id, reason string, status int, msg string) bool {
	b.failStream(id, reason, msg)
	writeError(w.bw, api, status, reason, "moat: "+reason+": "+msg, id)
	return false
}

// withhold handles a response that carried the credential: the run is
// stopped first (so no other request leaves), then the failure journaled.
func (b *Broker) withhold(w *conn, api, id, where string) bool {
	b.fatal(ReasonCredentialReflect, fmt.Errorf("%w (in %s)", errReflected, where))
	return b.failRequest(w, api, id, ReasonCredentialReflect, 502,
		"the provider's response was withheld: it contained the run's credential; the run is being cancelled")
}

// decodeBody undoes the response's content coding: identity, gzip or
// deflate (zlib-wrapped or raw). Anything else, or a list, is an error.
func decodeBody(resp *http.Response) (io.Reader, error) {
	ce := strings.ToLower(strings.TrimSpace(resp.Header.Get("Content-Encoding")))
	if len(resp.Header.Values("Content-Encoding")) > 1 {
		return nil, errors.New("more than one Content-Encoding header")
	}
	switch ce {
	case "", "identity":
		return resp.Body, nil
	case "gzip", "x-gzip":
		zr, err := gzip.NewReader(resp.Body)
		if err != nil {
			return nil, fmt.Errorf("gzip: %w", err)
		}
		return zr, nil
	case "deflate":
		br := bufio.NewReader(resp.Body)
		hdr, _ := br.Peek(2)
		if len(hdr) == 2 && hdr[0]&0x0f == 8 && (uint16(hdr[0])<<8|uint16(hdr[1]))%31 == 0 {
			zr, err := zlib.NewReader(br)
			if err != nil {
				return nil, fmt.Errorf("deflate: %w", err)
			}
			return zr, nil
		}
		return flate.NewReader(br), nil
	}
	return nil, fmt.Errorf("content coding %q is not supported (identity, gzip, deflate are)", clip(ce))
}

// scrub removes a credential from an error text before it is shown.
func scrub(s, cred string) string {
	if cred == "" {
		return s
	}
	return strings.ReplaceAll(s, cred, "[credential]")
}
