package broker

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/internal/fakeprovider"
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

// fakeProvider is the upstream in tests: internal/fakeprovider's server,
// whose every request's Moat-Pre-Effect line this package's tests check as
// it arrives (fakeprovider.VerifyPreEffect: through verify, the test
// journal's own check that the line is signed and in the journal, then
// the record's type and the body's hash), reporting a failure as a test
// error.
type fakeProvider struct {
	t      testing.TB
	srv    *fakeprovider.Server
	verify func(line []byte) error // nil: structure and hash only
	bare   bool                    // benchmarks (newBareProvider): no checks, no recording

	mu      sync.Mutex
	respond func(w http.ResponseWriter, r *http.Request, body []byte) // nil: fakeprovider.Respond
}

func newFakeProvider(t testing.TB, tlsOn bool) *fakeProvider {
	return startFakeProvider(t, fakeprovider.Options{TLS: tlsOn})
}

// newBareProvider is the benchmarks' provider: it checks and keeps nothing.
func newBareProvider(b testing.TB) *fakeProvider {
	fp := startFakeProvider(b, fakeprovider.Options{NoRecord: true})
	fp.bare = true
	return fp
}

func startFakeProvider(t testing.TB, o fakeprovider.Options) *fakeProvider {
	srv, err := fakeprovider.Start(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	fp := &fakeProvider{t: t, srv: srv}
	srv.SetRespond(fp.serve)
	return fp
}

func (fp *fakeProvider) serve(w http.ResponseWriter, r *http.Request, body []byte) {
	if !fp.bare {
		verify := fp.verify
		if verify == nil {
			verify = func([]byte) error { return nil }
		}
		if err := fakeprovider.VerifyPreEffect(r.Header.Values("Moat-Pre-Effect"), body, verify); err != nil {
			fp.t.Errorf("provider: %s %s: %v", r.Method, r.URL.Path, err)
		}
	}
	fp.mu.Lock()
	respond := fp.respond
	fp.mu.Unlock()
	if respond == nil {
		respond = fakeprovider.Respond
	}
	respond(w, r, body)
}

// seen is one request as the fake provider observed it.
type seen struct {
	path      string
	header    http.Header
	body      []byte
	preEffect []byte // the decoded Moat-Pre-Effect line
}

func (fp *fakeProvider) count() int { return fp.srv.Count() }

func (fp *fakeProvider) last() seen { return seenOf(fp.srv.Last()) }

// requests is every request so far, in order.
func (fp *fakeProvider) requests() []seen {
	var out []seen
	for _, r := range fp.srv.Requests() {
		out = append(out, seenOf(r))
	}
	return out
}

func seenOf(r fakeprovider.Request) seen {
	return seen{path: r.Path, header: r.Header, body: r.Body, preEffect: r.PreEffect}
}

func (fp *fakeProvider) setRespond(f func(w http.ResponseWriter, r *http.Request, body []byte)) {
	fp.mu.Lock()
	fp.respond = f
	fp.mu.Unlock()
}

// The provider's answers and its stream, for the tests that build their
// own from them.
var (
	defaultRespond  = fakeprovider.Respond
	anthropicStream = fakeprovider.AnthropicStream
)

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

// send writes in on a fresh connection to the broker, whose whole
// exchange has 20 s; the error is the write's.
func (h *harness) send(in string) (net.Conn, error) {
	h.t.Helper()
	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		h.t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(20 * time.Second))
	_, err = io.WriteString(c, in)
	return c, err
}

// raw writes raw bytes on a fresh connection and reads one response.
func (h *harness) raw(in string) result {
	h.t.Helper()
	c, err := h.send(in)
	defer c.Close()
	if err != nil {
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

// errRecorder keeps what a fake provider reports instead of failing.
type errRecorder struct {
	testing.TB
	mu   sync.Mutex
	errs []string
}

func (e *errRecorder) Errorf(format string, args ...any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.errs = append(e.errs, fmt.Sprintf(format, args...))
}

// The fake provider reports a request that does not carry a pre-effect
// line from the journal, and not one through the broker (the control).
func TestFakeProviderChecksPreEffect(t *testing.T) {
	rec := &errRecorder{TB: t}
	fp := newFakeProvider(rec, false)
	h := startBroker(t, fp, testPolicy(fp.srv.URL, 10), nil)
	h.mustSucceed()
	if len(rec.errs) != 0 {
		t.Fatalf("control: a request through the broker was reported: %q", rec.errs)
	}
	resp, err := http.Post(fp.srv.URL+"/v1/messages", "application/json", strings.NewReader(anthropicBody))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	other := newTestJournal(t)
	line, err := other.w.Append(audit.InferenceRequested{RequestID: "r", Provider: "anthropic", Model: "claude-test", BodySHA256: fmt.Sprintf("%064x", 0)})
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("POST", fp.srv.URL+"/v1/messages", strings.NewReader(anthropicBody))
	req.Header.Set("Moat-Pre-Effect", base64.StdEncoding.EncodeToString(line))
	if resp, err = http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if len(rec.errs) != 2 || !strings.Contains(rec.errs[0], "0 Moat-Pre-Effect headers") || !strings.Contains(rec.errs[1], "provider: POST /v1/messages") {
		t.Errorf("reported %q, want the missing line and the other journal's line", rec.errs)
	}
}
