package broker

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/audit"
)

// postWith builds a well-formed request whose only credential headers are
// creds (none when empty).
func postWith(path, body string, creds ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n", path)
	for _, c := range creds {
		b.WriteString(c + "\r\n")
	}
	fmt.Fprintf(&b, "Content-Length: %d\r\n\r\n%s", len(body), body)
	return b.String()
}

// journalText is every journal payload, decoded, as one string.
func journalText(h *harness) string {
	var b strings.Builder
	for _, l := range h.j.lines() {
		p, _ := json.Marshal(payloadOf(h.t, l))
		b.Write(p)
		b.WriteByte('\n')
	}
	return b.String()
}

// TestWorkloadKey: a broker with a per-sandbox key (a listener others
// than the sandbox can reach) refuses, on every road and before any
// effect, a request that does not carry exactly that key: the placeholder,
// a wrong key, no credential at all, the key beside a wrong one, a
// neighbour's GET. Each refusal is journaled as credential_header with a
// message that says what to send but not the key, and the provider sees
// none of them. In the same broker the key is served, in x-api-key and in
// Authorization: Bearer, and the provider gets the real credential.
func TestWorkloadKey(t *testing.T) {
	key := NewWorkloadKey()
	other := NewWorkloadKey()
	if key == other || !strings.HasPrefix(key, "moat-") || len(key) < minWorkloadKeyBytes {
		t.Fatalf("NewWorkloadKey gave %q and %q: want two different moat- keys of at least %d bytes", key, other, minWorkloadKeyBytes)
	}
	h := newHarness(t, 100, func(c *Config) { c.WorkloadKey = key })
	tests := []struct {
		name, raw string
	}{
		{"placeholder", postWith("/v1/messages", anthropicBody, "X-Api-Key: "+Placeholder)},
		{"another sandbox's key", postWith("/v1/messages", anthropicBody, "X-Api-Key: "+other)},
		{"key with a suffix", postWith("/v1/messages", anthropicBody, "X-Api-Key: "+key+"x")},
		{"key prefix", postWith("/v1/messages", anthropicBody, "X-Api-Key: "+key[:len(key)-1])},
		{"no credential header", postWith("/v1/messages", anthropicBody)},
		{"key beside a wrong one", postWith("/v1/messages", anthropicBody, "X-Api-Key: "+key, "Authorization: Bearer "+Placeholder)},
		{"wrong bearer on openai", postWith("/v1/chat/completions", chatBody, "Authorization: Bearer "+other)},
		{"api-key placeholder on responses", postWith("/v1/responses", chatBody, "Api-Key: "+Placeholder)},
		{"spoofer's GET", "GET /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"},
		{"tools road", postWith(ToolsPathPrefix+"calc", `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`)},
		{"services road", postWith(ServicesPathPrefix+"x/y", `{}`, "X-Api-Key: "+Placeholder)},
		{"packages road", "GET " + PackagesPathPrefix + "pypi/simple/x/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := h.fp.count()
			r := h.raw(tc.raw)
			if r.status != 403 {
				t.Errorf("status %d, want 403; body %s", r.status, r.body)
			}
			if !strings.Contains(r.body, "broker key") && !strings.Contains(r.body, "the key moat put") {
				t.Errorf("error body %q does not say which key to send", r.body)
			}
			rec := h.lastRecord()
			if rec["type"] != audit.TypeInferenceRefused || rec["reason"] != string(ReasonCredentialHeader) {
				t.Errorf("last journal record %v %v, want %s with reason %s", rec["type"], rec["reason"], audit.TypeInferenceRefused, ReasonCredentialHeader)
			}
			if got := h.fp.count(); got != before {
				t.Errorf("provider saw %d new requests, want 0", got-before)
			}
			if strings.Contains(r.body, key) {
				t.Errorf("the refusal names the key: %s", r.body)
			}
		})
	}

	t.Run("served with the key", func(t *testing.T) {
		for _, tc := range []struct{ path, body, cred, header, want string }{
			{"/v1/messages", anthropicBody, "X-Api-Key: " + key, "X-Api-Key", testCred},
			{"/v1/chat/completions", chatBody, "Authorization: Bearer " + key, "Authorization", "Bearer " + testCredOA},
		} {
			before := h.fp.count()
			r := h.raw(postWith(tc.path, tc.body, tc.cred, "Connection: close"))
			if r.status != 200 {
				t.Fatalf("%s with the key: status %d, want 200; body %s", tc.path, r.status, r.body)
			}
			if got := h.fp.count(); got != before+1 {
				t.Fatalf("%s with the key: provider saw %d requests, want 1", tc.path, got-before)
			}
			s := h.fp.last()
			if got := s.header.Get(tc.header); got != tc.want {
				t.Errorf("%s: provider %s = %q, want the real credential", tc.path, tc.header, got)
			}
			if strings.Contains(fmt.Sprint(s.header), key) {
				t.Errorf("%s: the provider saw the workload key", tc.path)
			}
		}
	})

	if strings.Contains(journalText(h), key) {
		t.Errorf("the journal holds the workload key in clear")
	}
	h.j.verifyAll(t)
}

// TestWorkloadKeyDefault: without a key (a loopback listener) the broker
// takes the placeholder as before and refuses any other key, even another
// broker's per-sandbox key.
func TestWorkloadKeyDefault(t *testing.T) {
	h := newHarness(t, 100)
	before := h.fp.count()
	if r := h.raw(postWith("/v1/messages", anthropicBody, "X-Api-Key: "+Placeholder, "Connection: close")); r.status != 200 {
		t.Fatalf("placeholder: status %d, want 200; body %s", r.status, r.body)
	}
	if got := h.fp.count(); got != before+1 {
		t.Fatalf("placeholder: provider saw %d requests, want 1", got-before)
	}
	before = h.fp.count()
	r := h.raw(postWith("/v1/messages", anthropicBody, "X-Api-Key: "+NewWorkloadKey()))
	if r.status != 403 {
		t.Errorf("a per-sandbox key on a placeholder broker: status %d, want 403; body %s", r.status, r.body)
	}
	if rec := h.lastRecord(); rec["reason"] != string(ReasonCredentialHeader) {
		t.Errorf("refusal journaled as %v, want %s", rec["reason"], ReasonCredentialHeader)
	}
	if got := h.fp.count(); got != before {
		t.Errorf("provider saw %d requests, want 0", got-before)
	}
}

// TestNewRefusesWeakWorkloadKey: New takes "", the placeholder or a key
// of at least minWorkloadKeyBytes printable bytes, nothing else.
func TestNewRefusesWeakWorkloadKey(t *testing.T) {
	fp := newFakeProvider(t, false)
	pol := testPolicy(fp.srv.URL, 1)
	for _, tc := range []struct {
		key string
		ok  bool
	}{
		{"", true},
		{Placeholder, true},
		{NewWorkloadKey(), true},
		{"moat-short", false},
		{strings.Repeat("a", minWorkloadKeyBytes-1), false},
		{strings.Repeat("a", minWorkloadKeyBytes) + " b", false},
		{strings.Repeat("a", minWorkloadKeyBytes) + "\x7f", false},
	} {
		b, err := New(Config{Policy: pol, Journal: newTestJournal(t), WorkloadKey: tc.key})
		if (err == nil) != tc.ok {
			t.Errorf("New with workload key %q: err %v, want ok=%v", tc.key, err, tc.ok)
		}
		if b != nil {
			b.Close()
		}
	}
}

// TestKeylessRefusalsBounded: with a per-sandbox key, requests without it
// (a neighbour forging the sandbox's address) are refused but do not
// count toward inference.max_refusals, so they cannot end the run; their
// journal records are bounded (the first keylessJournaled, then one per
// doubling). Control in the same broker: the workload's own request with
// the key is served after them, and its bad requests with the key still
// end the run at max_refusals as before.
func TestKeylessRefusalsBounded(t *testing.T) {
	key := NewWorkloadKey()
	var logBuf lockedBuffer
	fp := newFakeProvider(t, false)
	pol := testPolicy(fp.srv.URL, 10)
	pol.Inference.MaxRefusals = 3
	h := startBroker(t, fp, pol, nil, withLog(&logBuf), func(c *Config) { c.WorkloadKey = key })
	const sent = 130 // journaled: the first 32, the 64th and the 128th
	for i := range sent {
		creds := []string{"X-Api-Key: " + Placeholder}
		if i%2 == 1 {
			creds = nil
		}
		if r := h.raw(postWith("/v1/messages", anthropicBody, creds...)); r.status != 403 || r.header.Get("Moat-Reason") != string(ReasonCredentialHeader) {
			t.Fatalf("keyless request %d: status %d, reason %q; want 403 credential_header", i+1, r.status, r.header.Get("Moat-Reason"))
		}
	}
	noFatal(t, h)
	recs := h.records("inference.refused")
	if want := keylessJournaled + 2; len(recs) != want {
		t.Errorf("%d refusal records for %d keyless requests, want %d", len(recs), sent, want)
	}
	if d, _ := recs[len(recs)-1]["detail"].(string); !strings.Contains(d, "request 128 without this sandbox's broker key") {
		t.Errorf("the last keyless record's detail %q does not give its count", d)
	}
	if strings.Contains(journalText(h), key) || strings.Contains(logBuf.String(), key) {
		t.Error("the journal or the log holds the workload key")
	}
	if lines := strings.Count(logBuf.String(), "moat.broker refused"); lines != keylessJournaled+2 {
		t.Errorf("%d refusal log lines, want %d", lines, keylessJournaled+2)
	}
	// The workload with the key: served, and its own refusals still end
	// the run at inference.max_refusals.
	before := fp.count()
	if r := h.raw(postWith("/v1/messages", anthropicBody, "X-Api-Key: "+key)); r.status != 200 {
		t.Fatalf("request with the key after %d keyless ones: status %d, want 200: %s", sent, r.status, r.body)
	}
	if fp.count() != before+1 {
		t.Fatal("the request with the key did not reach the provider")
	}
	bad := postWith("/v1/messages", strings.Replace(anthropicBody, "claude-test", "not-allowed", 1), "X-Api-Key: "+key)
	for i := range 3 {
		if r := h.raw(bad); r.status != 400 {
			t.Fatalf("refusal %d with the key: status %d, want 400", i+1, r.status)
		}
	}
	noFatal(t, h)
	if r := h.raw(bad); r.status != 400 {
		t.Fatalf("refusal 4 with the key: status %d, want 400", r.status)
	}
	expectFatal(t, h, ReasonRefusalLimit)
	h.j.verifyAll(t)
}
