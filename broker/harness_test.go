package broker

import (
	"bufio"
	"bytes"
	"crypto/sha256"
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
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/policy"
)

// Test fixtures. The credential is synthetic; tests look for it in places
// it must never be.
const (
	testCred      = "sk-test-REALCRED-0123456789abcdef"
	testCredOA    = "sk-oa-test-REALCRED-fedcba9876543210"
	anthropicBody = `{"model":"claude-test","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`
	chatBody      = `{"model":"gpt-test","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`
)

// seen is one request as the fake provider observed it.
type seen struct {
	path      string
	header    http.Header
	body      []byte
	preEffect []byte // the decoded Moat-Pre-Effect line
}

// fakeProvider is the upstream in tests. It checks every request's
// Moat-Pre-Effect line (signature through verify, body_sha256 against the
// bytes it received) and records what it saw.
type fakeProvider struct {
	t      testing.TB
	srv    *httptest.Server
	verify func(line []byte) error // nil: structure and hash only
	bare   bool                    // benchmarks: no checks, no recording

	mu      sync.Mutex
	reqs    []seen
	respond func(w http.ResponseWriter, r *http.Request, body []byte) // nil: defaultRespond
}

func newFakeProvider(t testing.TB, tlsOn bool) *fakeProvider {
	fp := &fakeProvider{t: t}
	fp.srv = httptest.NewUnstartedServer(http.HandlerFunc(fp.serve))
	fp.srv.Config.ErrorLog = log.New(io.Discard, "", 0) // refused TLS handshakes are expected
	if tlsOn {
		fp.srv.StartTLS()
	} else {
		fp.srv.Start()
	}
	t.Cleanup(fp.srv.Close)
	return fp
}

func (fp *fakeProvider) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		fp.t.Errorf("provider: reading body: %v", err)
		return
	}
	if fp.bare {
		defaultRespond(w, r, body)
		return
	}
	line, err := base64.StdEncoding.DecodeString(r.Header.Get("Moat-Pre-Effect"))
	if err != nil || len(line) == 0 {
		fp.t.Errorf("provider: request without a valid Moat-Pre-Effect header (%v)", err)
	} else {
		if fp.verify != nil {
			if err := fp.verify(line); err != nil {
				fp.t.Errorf("provider: Moat-Pre-Effect does not verify: %v", err)
			}
		}
		p := payloadOf(fp.t, line)
		sum := sha256.Sum256(body)
		if got, want := p["body_sha256"], hex.EncodeToString(sum[:]); got != want {
			fp.t.Errorf("provider: body_sha256 = %v, want sha256 of received body %s", got, want)
		}
		if p["type"] != audit.TypeInferenceRequested {
			fp.t.Errorf("provider: pre-effect record type = %v, want %s", p["type"], audit.TypeInferenceRequested)
		}
	}
	fp.mu.Lock()
	fp.reqs = append(fp.reqs, seen{path: r.URL.Path, header: r.Header.Clone(), body: body, preEffect: line})
	respond := fp.respond
	fp.mu.Unlock()
	if respond == nil {
		respond = defaultRespond
	}
	respond(w, r, body)
}

func (fp *fakeProvider) count() int {
	fp.mu.Lock()
	defer fp.mu.Unlock()
	return len(fp.reqs)
}

func (fp *fakeProvider) last() seen {
	fp.mu.Lock()
	defer fp.mu.Unlock()
	if len(fp.reqs) == 0 {
		return seen{}
	}
	return fp.reqs[len(fp.reqs)-1]
}

func (fp *fakeProvider) setRespond(f func(w http.ResponseWriter, r *http.Request, body []byte)) {
	fp.mu.Lock()
	fp.respond = f
	fp.mu.Unlock()
}

// defaultRespond answers like the real APIs do, enough for the SDKs.
func defaultRespond(w http.ResponseWriter, r *http.Request, body []byte) {
	var req struct {
		Model  string `json:"model"`
		Stream bool   `json:"stream"`
	}
	json.Unmarshal(body, &req)
	switch {
	case r.URL.Path == "/v1/messages" && req.Stream:
		w.Header().Set("Content-Type", "text/event-stream")
		for _, ev := range anthropicStream(req.Model) {
			io.WriteString(w, ev)
			w.(http.Flusher).Flush()
		}
	case r.URL.Path == "/v1/messages":
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Request-Id", "req_fake")
		fmt.Fprintf(w, `{"id":"msg_1","type":"message","role":"assistant","model":%q,"content":[{"type":"text","text":"hello from fake"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":3,"output_tokens":5}}`, req.Model)
	case r.URL.Path == "/v1/chat/completions":
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":"hello from fake"},"finish_reason":"stop","logprobs":null}],"usage":{"prompt_tokens":4,"completion_tokens":6,"total_tokens":10}}`, req.Model)
	case r.URL.Path == "/v1/responses":
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"resp_1","object":"response","created_at":1700000000,"status":"completed","model":%q,"output":[{"type":"message","id":"msg_1","status":"completed","role":"assistant","content":[{"type":"output_text","text":"hello from fake","annotations":[]}]}],"usage":{"input_tokens":7,"output_tokens":8,"total_tokens":15,"input_tokens_details":{"cached_tokens":0},"output_tokens_details":{"reasoning_tokens":0}}}`, req.Model)
	default:
		http.Error(w, "no such path", 404)
	}
}

func anthropicStream(model string) []string {
	return []string{
		"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"" + model + "\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":11,\"output_tokens\":1}}}\n\n",
		"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hello \"}}\n\n",
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"stream\"}}\n\n",
		"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":12}}\n\n",
		"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
	}
}

// payloadOf decodes a journal line (a DSSE envelope) to its payload.
func payloadOf(t testing.TB, line []byte) map[string]any {
	t.Helper()
	var env struct {
		Payload string `json:"payload"`
	}
	if err := json.Unmarshal(line, &env); err != nil {
		t.Fatalf("journal line is not an envelope: %v: %q", err, line)
	}
	raw, err := base64.StdEncoding.DecodeString(env.Payload)
	if err != nil {
		t.Fatalf("journal payload is not base64: %v", err)
	}
	var p map[string]any
	if err := json.Unmarshal(raw, &p); err != nil {
		t.Fatalf("journal payload is not JSON: %v", err)
	}
	return p
}

// testPolicy has one provider per API, all served by fp.
func testPolicy(base string, maxReq int) *policy.Policy {
	return &policy.Policy{Version: 1, Audit: policy.Audit{MaxBytes: policy.DefaultAuditMaxBytes}, Inference: policy.Inference{
		MaxRequests: maxReq, MaxOutputTokens: 1024, MaxRefusals: policy.MaxRefusalsLimit, // tests refuse a lot; TestRefusalLimit sets its own
		Providers: []policy.Provider{
			{Name: "anthropic", API: "anthropic-messages", BaseURL: base, CredentialEnv: "ANTHROPIC_API_KEY", Models: []string{"claude-test"}},
			{Name: "openai", API: "openai-chat", BaseURL: base, CredentialEnv: "OPENAI_API_KEY", Models: []string{"gpt-test"}},
			{Name: "openai-r", API: "openai-responses", BaseURL: base, CredentialEnv: "OPENAI_API_KEY", Models: []string{"gpt-test"}},
		},
	}}
}

// harness is a broker on 127.0.0.1 in front of a fake provider.
type harness struct {
	t     testing.TB
	b     *Broker
	addr  string
	fp    *fakeProvider
	j     *testJournal
	fatal chan string
}

// harnessOpt is a func(*Config), applied before New, a func(*Broker),
// applied before Serve, or a *testJournal to use.
type harnessOpt any

func newHarness(t testing.TB, maxReq int, opts ...harnessOpt) *harness {
	t.Helper()
	fp := newFakeProvider(t, false)
	return startBroker(t, fp, testPolicy(fp.srv.URL, maxReq), nil, opts...)
}

func startBroker(t testing.TB, fp *fakeProvider, pol *policy.Policy, tr *http.Transport, opts ...harnessOpt) *harness {
	t.Helper()
	var j *testJournal
	for _, o := range opts {
		if oj, ok := o.(*testJournal); ok {
			j = oj
		}
	}
	if j == nil {
		j = newTestJournal(t)
	}
	fp.verify = j.verify
	h := &harness{t: t, fp: fp, j: j, fatal: make(chan string, 4)}
	cfg := Config{
		Policy: pol, Journal: j,
		Credentials: map[string]string{"anthropic": testCred, "openai": testCredOA, "openai-r": testCredOA},
		OnFatal:     func(reason string, err error) { h.fatal <- reason },
		Upstream:    tr,
	}
	for _, o := range opts {
		if f, ok := o.(func(*Config)); ok {
			f(&cfg)
		}
	}
	b, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	for _, o := range opts {
		if f, ok := o.(func(*Broker)); ok {
			f(b)
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h.b, h.addr = b, l.Addr().String()
	done := make(chan error, 1)
	go func() { done <- b.Serve(l) }()
	t.Cleanup(func() {
		b.Close()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return h
}

// result is one response read from the broker.
type result struct {
	status int
	header http.Header
	body   string
	closed bool // the broker closed the connection after the response
}

// raw writes raw bytes on a fresh connection and reads one response.
func (h *harness) raw(in string) result {
	h.t.Helper()
	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		h.t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.WriteString(c, in); err != nil {
		h.t.Fatalf("write: %v", err)
	}
	br := bufio.NewReader(c)
	return readResult(h.t, br, c)
}

func readResult(t testing.TB, br *bufio.Reader, c net.Conn) result {
	t.Helper()
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("reading response: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	r := result{status: resp.StatusCode, header: resp.Header, body: string(body)}
	if !resp.Close {
		return r // the broker announces every close; a kept connection is not probed
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = br.ReadByte()
	var ne net.Error
	r.closed = err != nil && !(errors.As(err, &ne) && ne.Timeout())
	return r
}

// post builds a well-formed request.
func post(path, body string, extra ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nX-Api-Key: %s\r\n", path, Placeholder)
	for _, e := range extra {
		b.WriteString(e + "\r\n")
	}
	fmt.Fprintf(&b, "Content-Length: %d\r\n\r\n%s", len(body), body)
	return b.String()
}

// mustSucceed sends a valid request on a new connection and checks that it
// reached the provider.
func (h *harness) mustSucceed() {
	h.t.Helper()
	before := h.fp.count()
	r := h.raw(post("/v1/messages", anthropicBody, "Connection: close"))
	if r.status != 200 {
		h.t.Fatalf("valid request after the refusal: status %d, want 200; body %s", r.status, r.body)
	}
	if got := h.fp.count(); got != before+1 {
		h.t.Fatalf("valid request: provider saw %d requests, want %d", got, before+1)
	}
}

// records returns the payloads of the journal's records of type typ.
func (h *harness) records(typ string) []map[string]any {
	var out []map[string]any
	for _, l := range h.j.lines() {
		if p := payloadOf(h.t, l); p["type"] == typ {
			out = append(out, p)
		}
	}
	return out
}

func (h *harness) lastRecord() map[string]any {
	ls := h.j.lines()
	if len(ls) == 0 {
		h.t.Fatal("journal is empty")
	}
	return payloadOf(h.t, ls[len(ls)-1])
}

var _ = bytes.Contains
