package broker

import (
	"bufio"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/policy"
)

// TestCredentialInjection: worker headers are dropped or refused, the real
// credential is added in each API's header, and the provider sees nothing
// else.
func TestCredentialInjection(t *testing.T) {
	h := newHarness(t, 10)
	allowed := []string{"Content-Type", "Content-Length", "Accept", "Accept-Encoding", "User-Agent", "Moat-Pre-Effect",
		"Anthropic-Version", "Anthropic-Beta", "X-Api-Key", "Authorization"}
	noise := []string{"Accept-Encoding: gzip", "User-Agent: Anthropic/Go 9.9", "X-Stainless-Os: Linux", "X-Stainless-Retry-Count: 0",
		"Traceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "X-Request-Id: leak", "Openai-Organization: org-x",
		"Openai-Beta: assistants=v2", "Helicone-Auth: Bearer x", "Idempotency-Key: free-text-channel"}

	t.Run("anthropic", func(t *testing.T) {
		extra := append([]string{"Anthropic-Version: 2023-06-01", "Anthropic-Beta: interleaved-thinking-2025-05-14"}, noise...)
		if r := h.raw(post("/v1/messages", anthropicBody, extra...)); r.status != 200 {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
		s := h.fp.last()
		checkOnly(t, s.header, allowed)
		if got := s.header.Get("X-Api-Key"); got != testCred {
			t.Errorf("provider X-Api-Key = %q, want the real credential", got)
		}
		if got := s.header.Get("Authorization"); got != "" {
			t.Errorf("provider Authorization = %q, want none", got)
		}
		if got := s.header.Get("Anthropic-Version"); got != "2023-06-01" {
			t.Errorf("anthropic-version = %q, want forwarded", got)
		}
		if got := s.header.Get("Anthropic-Beta"); got != "interleaved-thinking-2025-05-14" {
			t.Errorf("anthropic-beta = %q, want forwarded", got)
		}
		if got := s.header.Get("User-Agent"); got != brokerUserAgent {
			t.Errorf("User-Agent = %q, want the broker's", got)
		}
	})
	t.Run("openai", func(t *testing.T) {
		raw := "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer moat-placeholder\r\nContent-Type: application/json\r\n" +
			strings.Join(append(noise, "Anthropic-Version: 2023-06-01"), "\r\n") + fmt.Sprintf("\r\nContent-Length: %d\r\n\r\n%s", len(chatBody), chatBody)
		r := h.raw(raw)
		if r.status != 200 {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
		s := h.fp.last()
		checkOnly(t, s.header, allowed)
		if got := s.header.Get("Authorization"); got != "Bearer "+testCredOA {
			t.Errorf("provider Authorization = %q, want the real credential", got)
		}
		if got := s.header.Get("X-Api-Key") + s.header.Get("Anthropic-Version"); got != "" {
			t.Errorf("provider saw anthropic headers %q on an openai request", got)
		}
		if strings.Contains(r.body, testCredOA) || strings.Contains(fmt.Sprint(r.header), testCredOA) {
			t.Errorf("the worker saw the credential")
		}
	})
}

func checkOnly(t *testing.T, h http.Header, allowed []string) {
	t.Helper()
	for name := range h {
		if !slices.Contains(allowed, name) {
			t.Errorf("provider saw header %s: %q, want only %v", name, h.Get(name), allowed)
		}
	}
}

// TestAllowanceRace: 50 connections race for an allowance of 100. Exactly
// 100 requests reach the provider, with exactly 100 pre-effect records;
// exhaustion survives reconnects.
func TestAllowanceRace(t *testing.T) {
	const conns, allowance = 50, 100
	h := newHarness(t, allowance)
	var mu sync.Mutex
	ok, refused := 0, 0
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("tcp", h.addr)
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(60 * time.Second))
			br := bufio.NewReader(c)
			<-start
			for {
				if _, err := io.WriteString(c, post("/v1/messages", anthropicBody)); err != nil {
					t.Error(err)
					return
				}
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Error(err)
					return
				}
				io.ReadAll(resp.Body)
				mu.Lock()
				if resp.StatusCode == 200 {
					ok++
				} else {
					refused++
				}
				mu.Unlock()
				if resp.StatusCode != 200 {
					if resp.StatusCode != 429 {
						t.Errorf("status %d, want 200 or 429", resp.StatusCode)
					}
					return
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	if ok != allowance || refused != conns {
		t.Errorf("got %d successes and %d refusals, want %d and %d", ok, refused, allowance, conns)
	}
	if got := h.fp.count(); got != allowance {
		t.Errorf("provider saw %d requests, want %d", got, allowance)
	}
	if got := len(h.records(audit.TypeInferenceRequested)); got != allowance {
		t.Errorf("%d inference.requested records, want %d", got, allowance)
	}
	for _, r := range h.records(audit.TypeInferenceRefused) {
		if r["reason"] != string(ReasonAllowanceExhausted) {
			t.Errorf("refusal reason %v, want %s", r["reason"], ReasonAllowanceExhausted)
		}
	}
	if r := h.raw(post("/v1/messages", anthropicBody)); r.status != 429 {
		t.Errorf("after reconnecting: status %d, want 429 (allowance exhausted)", r.status)
	}
	h.j.verifyAll(t)
}

// TestAllowanceCountsFailures: a reservation is consumed even when the
// provider fails.
func TestAllowanceCountsFailures(t *testing.T) {
	h := newHarness(t, 2)
	h.fp.setRespond(func(w http.ResponseWriter, r *http.Request, body []byte) {
		hj, _ := w.(http.Hijacker)
		c, _, _ := hj.Hijack()
		c.Close()
	})
	if r := h.raw(post("/v1/messages", anthropicBody)); r.status != 502 {
		t.Fatalf("failing upstream: status %d, want 502", r.status)
	}
	if rec := h.lastRecord(); rec["type"] != audit.TypeInferenceFailed || rec["reason"] != string(ReasonUpstreamError) {
		t.Errorf("last record %v/%v, want inference.failed/%s", rec["type"], rec["reason"], ReasonUpstreamError)
	}
	h.fp.setRespond(nil)
	h.mustSucceed()
	if r := h.raw(post("/v1/messages", anthropicBody)); r.status != 429 {
		t.Errorf("third request with allowance 2: status %d, want 429", r.status)
	}
}

// TestZeroAllowanceDenies: the zero value of max_requests allows nothing.
func TestZeroAllowanceDenies(t *testing.T) {
	h := newHarness(t, 0)
	if r := h.raw(post("/v1/messages", anthropicBody)); r.status != 429 {
		t.Errorf("status %d, want 429", r.status)
	}
	if h.fp.count() != 0 {
		t.Errorf("provider reached with max_requests 0")
	}
}

// TestAuditFaultUnit: when the journal fails, the request is not sent, the
// run is failed through OnFatal, and nothing is sent afterwards.
func TestAuditFaultUnit(t *testing.T) {
	h := newHarness(t, 10)
	h.mustSucceed()
	h.j.setFail(errors.New("disk on fire"))
	r := h.raw(post("/v1/messages", anthropicBody))
	if r.status != 503 || !strings.Contains(r.body, string(ReasonAuditFailure)) {
		t.Errorf("faulted request: status %d body %s, want 503 %s", r.status, r.body, ReasonAuditFailure)
	}
	if got := h.fp.count(); got != 1 {
		t.Errorf("provider saw %d requests, want 1 (the one before the fault)", got)
	}
	expectFatal(t, h, "audit_failure")
	h.j.setFail(nil) // even if storage recovers, the run stays failed
	if r := h.raw(post("/v1/messages", anthropicBody)); r.status != 503 {
		t.Errorf("after the fault: status %d, want 503", r.status)
	}
	if got := h.fp.count(); got != 1 {
		t.Errorf("provider saw %d requests after the fault, want 1", got)
	}
	if h.b.Failed() == nil {
		t.Errorf("Failed() = nil after an audit fault")
	}
}

func expectFatal(t *testing.T, h *harness, reason Reason) {
	t.Helper()
	select {
	case got := <-h.fatal:
		if got != string(reason) {
			t.Errorf("OnFatal(%q), want %q", got, reason)
		}
	case <-time.After(5 * time.Second):
		t.Errorf("OnFatal not called, want %q", reason)
	}
}

// TestErrorShapes: refusals come in the API's own error shape.
func TestErrorShapes(t *testing.T) {
	h := newHarness(t, 10)
	bad := strings.Replace(anthropicBody, "claude-test", "claude-other", 1)
	r := h.raw(post("/v1/messages", bad))
	var a struct {
		Type  string `json:"type"`
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(r.body), &a); err != nil || r.status != 400 || a.Type != "error" || a.Error.Type != "invalid_request_error" || !strings.HasPrefix(a.Error.Message, "moat: refused: ") {
		t.Errorf("anthropic refusal: status %d body %s, want Anthropic's error shape", r.status, r.body)
	}
	bad = strings.Replace(chatBody, "gpt-test", "gpt-other", 1)
	r = h.raw(post("/v1/chat/completions", bad, "Authorization: Bearer moat-placeholder"))
	var o struct {
		Error struct {
			Type    string `json:"type"`
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(r.body), &o); err != nil || r.status != 400 || o.Error.Type != "invalid_request_error" || o.Error.Code == "" || !strings.HasPrefix(o.Error.Message, "moat: refused: ") {
		t.Errorf("openai refusal: status %d body %s, want OpenAI's error shape", r.status, r.body)
	}
	if rec := h.lastRecord(); rec["type"] != audit.TypeInferenceRefused || rec["reason"] != o.Error.Code {
		t.Errorf("journal %v/%v, want inference.refused with the code the worker got (%s)", rec["type"], rec["reason"], o.Error.Code)
	}
	if h.fp.count() != 0 {
		t.Errorf("provider reached by a refused request")
	}
	h.mustSucceed()
}

// TestRouting: with two providers of one API, the model picks the provider;
// a provider without a credential is refused.
func TestRouting(t *testing.T) {
	a, b := newFakeProvider(t, false), newFakeProvider(t, false)
	pol := &policy.Policy{Audit: policy.Audit{MaxBytes: policy.DefaultAuditMaxBytes}, Inference: policy.Inference{MaxRequests: 10, MaxOutputTokens: 100, MaxRefusals: policy.DefaultMaxRefusals, Providers: []policy.Provider{
		{Name: "a", API: "anthropic-messages", BaseURL: a.srv.URL, Models: []string{"claude-test"}},
		{Name: "b", API: "anthropic-messages", BaseURL: b.srv.URL + "/prefix/", Models: []string{"claude-b"}},
		{Name: "c", API: "anthropic-messages", BaseURL: b.srv.URL, CredentialEnv: "C_KEY", Models: []string{"claude-c"}},
	}}}
	h := startBroker(t, a, pol, nil, func(c *Config) { c.Credentials = map[string]string{"a": testCred, "b": testCred + "b"} })
	b.verify = h.j.verify
	if r := h.raw(post("/v1/messages", anthropicBody)); r.status != 200 || a.count() != 1 || b.count() != 0 {
		t.Errorf("claude-test: status %d, a %d b %d, want 200 via a", r.status, a.count(), b.count())
	}
	r := h.raw(post("/v1/messages", strings.Replace(anthropicBody, "claude-test", "claude-b", 1)))
	if r.status != 404 || b.count() != 1 || b.last().path != "/prefix/v1/messages" || b.last().header.Get("X-Api-Key") != testCred+"b" {
		t.Errorf("claude-b: status %d, b %d path %q, want b at /prefix/v1/messages with b's key", r.status, b.count(), b.last().path)
	}
	r = h.raw(post("/v1/messages", strings.Replace(anthropicBody, "claude-test", "claude-c", 1)))
	if r.status != 503 || !strings.Contains(r.body, "C_KEY") || b.count() != 1 {
		t.Errorf("provider without credential: status %d body %s, want 503 naming C_KEY", r.status, r.body)
	}
	r = h.raw(post("/v1/responses", `{"model":"gpt-test","input":"hi"}`, "Authorization: Bearer moat-placeholder"))
	if r.status != 404 || !strings.Contains(r.body, string(ReasonAPINotConfigured)) {
		t.Errorf("API without provider: status %d body %s, want 404 %s", r.status, r.body, ReasonAPINotConfigured)
	}
}

// TestTLSProvider: an HTTPS provider is trusted through its ca_file, and
// not without it.
func TestTLSProvider(t *testing.T) {
	fp := newFakeProvider(t, true)
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	cert := fp.srv.Certificate()
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	pol := testPolicy(fp.srv.URL, 10)
	pol.Inference.Providers[0].CAFile = caFile
	h := startBroker(t, fp, pol, nil)
	h.mustSucceed()
	if !strings.HasPrefix(fp.srv.URL, "https://127.0.0.1:") {
		t.Fatalf("fake provider at %s, want https on 127.0.0.1", fp.srv.URL)
	}

	pol2 := testPolicy(fp.srv.URL, 10) // same provider, no ca_file
	h2 := startBroker(t, fp, pol2, nil)
	n := fp.count()
	r := h2.raw(post("/v1/messages", anthropicBody))
	if r.status != 502 || !strings.Contains(r.body, string(ReasonUpstreamError)) || fp.count() != n {
		t.Errorf("without ca_file: status %d body %s, want 502 %s and no request", r.status, r.body, ReasonUpstreamError)
	}
}

// TestNewRefusesBadUpstreams: plain http to a non-loopback host, odd
// schemes, credentials in URLs and weak credentials are refused by New,
// and the loopback and https forms are accepted.
func TestNewRefusesBadUpstreams(t *testing.T) {
	tests := []struct {
		base, cred string
		ok         bool
	}{
		{"https://api.anthropic.com", testCred, true},
		{"http://127.0.0.1:1", testCred, true},
		{"http://[::1]:1", testCred, true},
		{"http://localhost:1", testCred, true},
		{"http://api.anthropic.com", testCred, false},
		{"http://10.0.0.1", testCred, false},
		{"ftp://127.0.0.1", testCred, false},
		{"https://user:pw@api.anthropic.com", testCred, false},
		{"https://api.anthropic.com?key=x", testCred, false},
		{"https://api.anthropic.com", "short", false},
		{"https://api.anthropic.com", "has space-in-it", false},
		{"https://api.anthropic.com", "", true}, // refused per request instead
	}
	for _, tc := range tests {
		pol := testPolicy(tc.base, 1)
		_, err := New(Config{Policy: pol, Journal: newTestJournal(t), Credentials: map[string]string{"anthropic": tc.cred, "openai": testCredOA, "openai-r": testCredOA}})
		if (err == nil) != tc.ok {
			t.Errorf("New(base %q, cred %q) error %v, want ok=%v", tc.base, tc.cred, err, tc.ok)
		}
	}
}

// TestAttribution: the attributor's answer, or the backend's declared
// reason, is recorded on every request.
func TestAttribution(t *testing.T) {
	h := newHarness(t, 10, func(c *Config) { c.AttributionUnavailable = "endpoint-only backend" })
	h.mustSucceed()
	a := h.records(audit.TypeInferenceRequested)[0]["attribution"].(map[string]any)
	if a["status"] != "unavailable" || a["reason"] != "endpoint-only backend" {
		t.Errorf("attribution %v, want unavailable with the backend's reason", a)
	}
	h2 := newHarness(t, 10, func(c *Config) { c.Attributor = fixedAttributor{PID: 42, Status: "resolved", Executable: "/bin/agent"} })
	h2.mustSucceed()
	a = h2.records(audit.TypeInferenceRequested)[0]["attribution"].(map[string]any)
	if a["status"] != "resolved" || a["pid"] != 42.0 {
		t.Errorf("attribution %v, want the attributor's answer", a)
	}
}

// TestRequireAttribution: with require_attribution, an unattributed
// connection is refused before its allowance is taken; an attributed one
// in the same setup succeeds.
func TestRequireAttribution(t *testing.T) {
	var mu sync.Mutex
	att := fixedAttributor{Status: "unavailable", Reason: "socket owner exited"}
	h := newHarness(t, 1, func(c *Config) {
		c.Policy.Inference.RequireAttribution = true
		c.Attributor = attributorFunc(func(net.Conn) audit.Attribution {
			mu.Lock()
			defer mu.Unlock()
			return audit.Attribution(att)
		})
	})
	if r := h.raw(post("/v1/messages", anthropicBody)); r.status != 403 || Reason(r.header.Get("Moat-Reason")) != ReasonUnattributed {
		t.Errorf("unattributed: status %d reason %q, want 403 %s", r.status, r.header.Get("Moat-Reason"), ReasonUnattributed)
	}
	mu.Lock()
	att = fixedAttributor{Status: "resolved", PID: 7, Executable: "/bin/agent"}
	mu.Unlock()
	h.mustSucceed() // allowance 1: the refusal did not consume it
}

type attributorFunc func(net.Conn) audit.Attribution

func (f attributorFunc) Attribute(c net.Conn) audit.Attribution { return f(c) }

type fixedAttributor audit.Attribution

func (f fixedAttributor) Attribute(net.Conn) audit.Attribution { return audit.Attribution(f) }

// TestWorkloadEnv pins the variables the SDKs read: each family's only
// with a provider of that family, MOAT_BROKER_URL always.
func TestWorkloadEnv(t *testing.T) {
	withAPIs := func(apis ...string) *policy.Policy {
		p := &policy.Policy{}
		for i, a := range apis {
			p.Inference.Providers = append(p.Inference.Providers, policy.Provider{Name: fmt.Sprint("p", i), API: a})
		}
		return p
	}
	const (
		anth   = "ANTHROPIC_BASE_URL=http://127.0.0.1:4711"
		anthK  = "ANTHROPIC_API_KEY=" + Placeholder
		oai    = "OPENAI_BASE_URL=http://127.0.0.1:4711/v1"
		oaiK   = "OPENAI_API_KEY=" + Placeholder
		broker = "MOAT_BROKER_URL=http://127.0.0.1:4711"
	)
	for _, tt := range []struct {
		name string
		pol  *policy.Policy
		want []string
	}{
		{"no policy", nil, []string{broker}},
		{"no providers", withAPIs(), []string{broker}},
		{"anthropic only", withAPIs("anthropic-messages"), []string{anth, anthK, broker}},
		{"openai chat only", withAPIs("openai-chat"), []string{oai, oaiK, broker}},
		{"openai responses only", withAPIs("openai-responses"), []string{oai, oaiK, broker}},
		{"both families", withAPIs("openai-responses", "anthropic-messages", "openai-chat"), []string{anth, anthK, oai, oaiK, broker}},
	} {
		if got := WorkloadEnv(4711, tt.pol); !slices.Equal(got, tt.want) {
			t.Errorf("%s: WorkloadEnv = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestCheckCredential: the rule a run applies at start is New's.
func TestCheckCredential(t *testing.T) {
	for _, c := range []string{"", "short", "sk has space", "sk-\x01-0123456789", strings.Repeat("k", MaxCredentialBytes+1)} {
		if CheckCredential("p", c) == nil {
			t.Errorf("CheckCredential(%q) accepted it", c)
		}
		pol := &policy.Policy{Version: 1, Audit: policy.Audit{MaxBytes: policy.DefaultAuditMaxBytes}, Inference: policy.Inference{Providers: []policy.Provider{
			{Name: "p", API: "anthropic-messages", BaseURL: "https://x.example", CredentialEnv: "K", Models: []string{"m"}}}}}
		if _, err := New(Config{Policy: pol, Journal: newTestJournal(t), Credentials: map[string]string{"p": c}}); err == nil && c != "" {
			t.Errorf("New accepted credential %q that CheckCredential refuses", c)
		}
	}
	if err := CheckCredential("p", "sk-0123456789"); err != nil {
		t.Errorf("control: %v", err)
	}
}

// TestMemoryBudget: requests share one budget of buffered bytes; a request
// that needs more than is free waits, then is refused; once the budget is
// free again a request succeeds.
func TestMemoryBudget(t *testing.T) {
	body := func(n int) string {
		return strings.Replace(anthropicBody, `"content":"hi"`, `"content":"`+strings.Repeat("x", n)+`"`, 1)
	}
	big, small := body(8000), body(1000)
	h := newHarness(t, 10, func(b *Broker) {
		b.setMemLimit(int64(bodyCopies*len(big) + 1000))
		b.readTimeout = 500 * time.Millisecond
	})
	hold := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(hold) }) }
	defer release()
	h.fp.setRespond(func(w http.ResponseWriter, r *http.Request, b []byte) {
		if len(b) > 5000 {
			<-hold
		}
		defaultRespond(w, r, b)
	})
	done := make(chan result)
	go func() { done <- h.raw(post("/v1/messages", big)) }()
	for h.fp.count() == 0 { // the big request is charged and at the provider
		time.Sleep(5 * time.Millisecond)
	}
	r := h.raw(post("/v1/messages", small))
	if r.status != 503 || Reason(r.header.Get("Moat-Reason")) != ReasonBusy {
		t.Errorf("request over the free budget: status %d reason %q, want 503 %s", r.status, r.header.Get("Moat-Reason"), ReasonBusy)
	}
	over := fmt.Sprintf("POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n", h.b.memLimit)
	if r := h.raw(over); r.status != 413 {
		t.Errorf("request larger than the whole budget: status %d, want 413", r.status)
	}
	release()
	if r := <-done; r.status != 200 {
		t.Errorf("the big request: status %d, want 200", r.status)
	}
	if r := h.raw(post("/v1/messages", small)); r.status != 200 {
		t.Errorf("small request after the budget was released: status %d, want 200", r.status)
	}
}

// TestClose: Close ends Serve with nil, cancels an in-flight upstream
// request and closes its worker connection.
func TestClose(t *testing.T) {
	fp := newFakeProvider(t, false)
	j := newTestJournal(t)
	fp.verify = j.verify
	b, err := New(Config{Policy: testPolicy(fp.srv.URL, 10), Journal: j, Credentials: map[string]string{"anthropic": testCred}})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- b.Serve(l) }()
	stuck := make(chan struct{})
	fp.setRespond(func(w http.ResponseWriter, r *http.Request, body []byte) {
		close(stuck)
		<-r.Context().Done()
	})
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, post("/v1/messages", anthropicBody))
	<-stuck
	if err := b.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := <-served; err != nil {
		t.Errorf("Serve returned %v after Close, want nil", err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadAll(c); err != nil {
		t.Errorf("worker connection: %v, want closed", err)
	}
	if _, err := net.Dial("tcp", l.Addr().String()); err == nil {
		t.Errorf("listener still accepts after Close")
	}
}

// TestRefusalKeepsJournalValid: refusals quoting hostile bytes (invalid
// UTF-8 in the body and in the model name) are journaled without breaking
// the journal, and the run goes on.
func TestRefusalKeepsJournalValid(t *testing.T) {
	h := newHarness(t, 10)
	for _, body := range []string{
		strings.Replace(anthropicBody, "hi", "h\xffi", 1),
		strings.Replace(anthropicBody, "claude-test", "claude-\xc3", 1),
		strings.Replace(anthropicBody, "claude-test", "claude-\u00e9\u2028", 1),
	} {
		if r := h.raw(post("/v1/messages", body)); r.status != 400 {
			t.Errorf("status %d, want 400: %s", r.status, r.body)
		}
	}
	select {
	case f := <-h.fatal:
		t.Fatalf("fatal %q after a refusal", f)
	default:
	}
	h.mustSucceed()
	h.j.verifyAll(t)
}

// TestLoopbackOnlyDialGuard: the dial guard of plain-http providers admits
// loopback addresses only (checked without dialing anything).
func TestLoopbackOnlyDialGuard(t *testing.T) {
	for addr, ok := range map[string]bool{
		"127.0.0.1:80": true, "127.1.2.3:8080": true, "[::1]:443": true,
		"10.0.0.1:80": false, "[2001:db8::1]:80": false, "0.0.0.0:80": false, "[::]:80": false, "169.254.169.254:80": false,
	} {
		if err := loopbackOnly("tcp", addr, nil); (err == nil) != ok {
			t.Errorf("loopbackOnly(%s) = %v, want allowed=%v", addr, err, ok)
		}
	}
}

// TestJournalFailedFromOutside: a process record the session could not
// write stops the broker as its own record's failure does: a request
// that worked before is refused afterwards and never reaches the
// provider, OnFatal names the reason once, and a second report changes
// nothing. A full journal ends the run with journal_limit.
func TestJournalFailedFromOutside(t *testing.T) {
	for _, tc := range []struct {
		full   bool
		reason Reason
	}{{false, ReasonAuditFailure}, {true, ReasonJournalLimit}} {
		t.Run(string(tc.reason), func(t *testing.T) {
			h := newHarness(t, 10)
			h.mustSucceed() // control: the same request works before
			h.b.JournalFailed(tc.full, errors.New("process.exited of p1: disk on fire"))
			expectFatal(t, h, tc.reason)
			if r := h.raw(post("/v1/messages", anthropicBody)); r.status != 503 {
				t.Errorf("after the fault: status %d, want 503", r.status)
			}
			if got := h.fp.count(); got != 1 {
				t.Errorf("provider saw %d requests, want 1 (the one before the fault)", got)
			}
			h.b.JournalFailed(!tc.full, errors.New("again"))
			select {
			case got := <-h.fatal:
				t.Errorf("a second OnFatal(%q) after the first", got)
			case <-time.After(100 * time.Millisecond):
			}
			if err := h.b.Failed(); err == nil || !strings.Contains(err.Error(), "disk on fire") {
				t.Errorf("Failed() = %v, want the first report", err)
			}
		})
	}
}
