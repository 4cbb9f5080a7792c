// Package fakeprovider is the one fake model provider of moat's tests and
// of the conformance suite: an HTTP server on 127.0.0.1, in the way of
// net/http/httptest, that answers the three APIs the broker speaks
// (Anthropic Messages, plain and streamed; OpenAI Chat Completions; OpenAI
// Responses) well enough for the official SDKs, records every request, and
// can check each request's Moat-Pre-Effect line against the run key.
//
// The answers are fixed (Text, StreamText and the usage numbers below), so
// that a test can look for them in what the workload received. The
// evidence suite's provider (evidence.Provider) is not this one: it is a
// product, with its own persisted events and openssl check.
package fakeprovider

import (
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"time"

	"github.com/moat-sandbox/moat/audit"
)

// What the provider answers.
const (
	// Text is the assistant's text of every non-streamed answer.
	Text = "hello from fake"
	// StreamText is the text of a streamed Anthropic answer, sent in two
	// deltas ("hello ", "stream").
	StreamText = "hello stream"
	// MaxBody caps the request body read; a larger one is answered 413
	// and recorded with its first MaxBody bytes.
	MaxBody = 4 << 20
)

// Request is one request as it reached the provider.
type Request struct {
	Method, Path, Query string
	Header              http.Header
	Body                []byte
	// PreEffect is the decoded Moat-Pre-Effect line (nil when absent or
	// not base64).
	PreEffect []byte
	// PreEffectErr is the verdict on it when Options.CheckPreEffect is set:
	// nil when it verified against the pinned key, is an
	// inference.requested record and its body_sha256 is the hash of Body.
	PreEffectErr error
}

// Options configure a Server.
type Options struct {
	TLS bool // serve HTTPS with httptest's certificate (Certificate)
	// CheckPreEffect checks every request's Moat-Pre-Effect line (see
	// Request.PreEffectErr); until Pin is called it is an error.
	CheckPreEffect bool
	// NoRecord keeps no Request (Requests, Count and Last see none) and
	// checks nothing: for benchmarks, whose requests would otherwise pile
	// up and whose allocations would be the provider's.
	NoRecord bool
}

// Server is a running fake provider.
type Server struct {
	URL string // base URL, http://127.0.0.1:PORT (https with TLS)

	srv  *httptest.Server
	opts Options

	mu      sync.Mutex
	reqs    []Request
	pub     ed25519.PublicKey
	respond func(w http.ResponseWriter, r *http.Request, body []byte) // nil: Respond
}

// Start starts a provider on 127.0.0.1 (IPv4 only: sandboxes reach the host
// through it). Close stops it.
func Start(o Options) (s *Server, err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("fake provider: %w", err)
	}
	s = &Server{opts: o}
	s.srv = &httptest.Server{Listener: ln, Config: &http.Server{
		Handler:           http.HandlerFunc(s.serve),
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          log.New(io.Discard, "", 0), // refused TLS handshakes are expected
	}}
	if o.TLS {
		s.srv.StartTLS()
	} else {
		s.srv.Start()
	}
	s.URL = s.srv.URL
	return s, nil
}

// Close stops the provider and waits for the requests in flight.
func (s *Server) Close() { s.srv.Close() }

// CloseClientConnections ends the connections open now, mid-answer if so.
func (s *Server) CloseClientConnections() { s.srv.CloseClientConnections() }

// Port is the provider's TCP port.
func (s *Server) Port() int { return s.srv.Listener.Addr().(*net.TCPAddr).Port }

// Certificate is the TLS server's certificate (nil without TLS).
func (s *Server) Certificate() *x509.Certificate {
	if !s.opts.TLS {
		return nil
	}
	return s.srv.Certificate()
}

// Client is an http.Client that trusts the provider.
func (s *Server) Client() *http.Client { return s.srv.Client() }

// Pin sets the run key that Moat-Pre-Effect lines must verify against.
func (s *Server) Pin(pub ed25519.PublicKey) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pub = pub
}

// PinPEM is Pin with the key in PEM, as run info and journals carry it.
func (s *Server) PinPEM(pemText string) error {
	pub, err := audit.ParsePublicKeyPEM([]byte(pemText))
	if err != nil {
		return err
	}
	s.Pin(pub)
	return nil
}

// SetRespond replaces how the provider answers (nil: Respond). The request
// is recorded first either way.
func (s *Server) SetRespond(f func(w http.ResponseWriter, r *http.Request, body []byte)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.respond = f
}

// Requests returns what reached the provider so far, in order.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.reqs...)
}

// Count is the number of requests so far.
func (s *Server) Count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.reqs)
}

// Last is the last request (the zero Request before any).
func (s *Server) Last() Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.reqs) == 0 {
		return Request{}
	}
	return s.reqs[len(s.reqs)-1]
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxBody+1))
	tooLarge := len(body) > MaxBody
	if tooLarge {
		body = body[:MaxBody]
	}
	s.mu.Lock()
	pub, respond := s.pub, s.respond
	s.mu.Unlock()
	if !s.opts.NoRecord {
		req := Request{Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Header: r.Header.Clone(), Body: body}
		if line, err := base64.StdEncoding.Strict().DecodeString(r.Header.Get("Moat-Pre-Effect")); err == nil && len(line) > 0 {
			req.PreEffect = line
		}
		if s.opts.CheckPreEffect {
			req.PreEffectErr = VerifyPreEffect(r.Header.Values("Moat-Pre-Effect"), body, func(line []byte) error {
				if pub == nil {
					return errors.New("no run key pinned yet")
				}
				_, err := audit.VerifyLine(line, pub)
				return err
			})
		}
		s.mu.Lock()
		s.reqs = append(s.reqs, req)
		s.mu.Unlock()
	}
	switch {
	case err != nil:
		http.Error(w, "reading the body: "+err.Error(), http.StatusBadRequest)
	case tooLarge:
		http.Error(w, "body larger than "+strconv.Itoa(MaxBody)+" bytes", http.StatusRequestEntityTooLarge)
	case respond != nil:
		respond(w, r, body)
	default:
		Respond(w, r, body)
	}
}

// VerifyPreEffect is the check of one request's Moat-Pre-Effect header
// values (hdr) that Options.CheckPreEffect makes with the pinned key: one
// value, the strict base64 of a journal line that verify accepts (its
// signature; a test may add its own checks, as that the line is in its
// journal), whose record is inference.requested with the body_sha256 of
// exactly body.
func VerifyPreEffect(hdr []string, body []byte, verify func(line []byte) error) error {
	if len(hdr) != 1 {
		return fmt.Errorf("%d Moat-Pre-Effect headers, want 1", len(hdr))
	}
	line, err := base64.StdEncoding.Strict().DecodeString(hdr[0])
	if err != nil {
		return fmt.Errorf("Moat-Pre-Effect: %w", err)
	}
	if err := verify(line); err != nil {
		return err
	}
	e, err := audit.ParseLine(line)
	if err != nil {
		return err
	}
	rec, ok := e.Record.(audit.InferenceRequested)
	if !ok {
		return fmt.Errorf("pre-effect record is %T, want inference.requested", e.Record)
	}
	if sum := sha256.Sum256(body); rec.BodySHA256 != hex.EncodeToString(sum[:]) {
		return fmt.Errorf("body_sha256 %s, but the body received hashes to %x", rec.BodySHA256, sum)
	}
	return nil
}

// Respond answers as the real API at r's path does, enough for the SDKs:
// the model is the request's, the text Text (StreamText when an Anthropic
// request asks for a stream). Any other path is 404.
func Respond(w http.ResponseWriter, r *http.Request, body []byte) {
	var req struct {
		Model  string `json:"model"`
		Stream bool   `json:"stream"`
	}
	json.Unmarshal(body, &req) // a body that is not JSON gets an empty model
	model, _ := json.Marshal(req.Model)
	switch {
	case r.URL.Path == "/v1/messages" && req.Stream:
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Request-Id", "req_fake")
		fl, _ := w.(http.Flusher)
		for _, ev := range AnthropicStream(req.Model) {
			io.WriteString(w, ev)
			if fl != nil {
				fl.Flush()
			}
		}
	case r.URL.Path == "/v1/messages":
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Request-Id", "req_fake")
		fmt.Fprintf(w, `{"id":"msg_1","type":"message","role":"assistant","model":%s,"content":[{"type":"text","text":%q}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":3,"output_tokens":5}}`, model, Text)
	case r.URL.Path == "/v1/chat/completions":
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":%s,"choices":[{"index":0,"message":{"role":"assistant","content":%q},"finish_reason":"stop","logprobs":null}],"usage":{"prompt_tokens":4,"completion_tokens":6,"total_tokens":10}}`, model, Text)
	case r.URL.Path == "/v1/responses":
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"resp_1","object":"response","created_at":1700000000,"status":"completed","model":%s,"output":[{"type":"message","id":"msg_1","status":"completed","role":"assistant","content":[{"type":"output_text","text":%q,"annotations":[]}]}],"usage":{"input_tokens":7,"output_tokens":8,"total_tokens":15,"input_tokens_details":{"cached_tokens":0},"output_tokens_details":{"reasoning_tokens":0}}}`, model, Text)
	default:
		http.Error(w, "no such path", http.StatusNotFound)
	}
}

// AnthropicStream is a streamed Messages answer, one server-sent event a
// string, whose text deltas make StreamText.
func AnthropicStream(model string) []string {
	m, _ := json.Marshal(model)
	return []string{
		`event: message_start` + "\n" + `data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":` + string(m) + `,"content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":11,"output_tokens":1}}}` + "\n\n",
		`event: content_block_start` + "\n" + `data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}` + "\n\n",
		`event: content_block_delta` + "\n" + `data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hello "}}` + "\n\n",
		`event: content_block_delta` + "\n" + `data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"stream"}}` + "\n\n",
		`event: content_block_stop` + "\n" + `data: {"type":"content_block_stop","index":0}` + "\n\n",
		`event: message_delta` + "\n" + `data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":12}}` + "\n\n",
		`event: message_stop` + "\n" + `data: {"type":"message_stop"}` + "\n\n",
	}
}
