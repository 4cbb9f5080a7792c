package broker

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/moat-sandbox/moat/broker/wire"
)

// lockedBuffer is a log sink shared by the broker's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Len()
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func withLog(buf *lockedBuffer) func(*Config) {
	return func(c *Config) { c.Log = slog.New(slog.NewTextHandler(buf, nil)) }
}

func noFatal(t *testing.T, h *harness) {
	t.Helper()
	select {
	case r := <-h.fatal:
		t.Fatalf("the run was cancelled (%s), want it to continue", r)
	default:
	}
}

// TestHugeValueRefusalBounded: a 4 MiB model name is refused; the refusal
// record quotes a prefix of it plus its length and sha256, so the line is
// small; the log line is small too; the run continues and the journal
// verifies. (Before, the whole name was quoted: the record was over the
// journal's line limit, the append failed and the run was cancelled as an
// audit failure.)
func TestHugeValueRefusalBounded(t *testing.T) {
	var logBuf lockedBuffer
	h := newHarness(t, 10, withLog(&logBuf))
	model := strings.Repeat("m", 4<<20)
	body := `{"model":"` + model + `","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`
	r := h.raw(post("/v1/messages", body))
	if r.status != 400 || r.header.Get("Moat-Reason") != "model_not_allowed" {
		t.Fatalf("status %d, reason %s, body %.300s; want 400 model_not_allowed", r.status, r.header.Get("Moat-Reason"), r.body)
	}
	if len(r.body) > 2*MaxDetailBytes {
		t.Errorf("error body is %d bytes, want at most %d", len(r.body), 2*MaxDetailBytes)
	}
	noFatal(t, h)
	recs := h.records("inference.refused")
	if len(recs) != 1 {
		t.Fatalf("%d refusal records, want 1", len(recs))
	}
	detail := recs[0]["detail"].(string)
	sum := sha256.Sum256([]byte(model))
	if want := fmt.Sprintf("(%d bytes, sha256 %s)", len(model), hex.EncodeToString(sum[:])); !strings.Contains(detail, want) {
		t.Errorf("detail %q does not carry %s", detail, want)
	}
	if !strings.Contains(detail, strings.Repeat("m", wire.MaxQuotedBytes)) || strings.Contains(detail, strings.Repeat("m", wire.MaxQuotedBytes+1)) {
		t.Errorf("detail does not quote exactly a %d-byte prefix: %q", wire.MaxQuotedBytes, detail)
	}
	for _, l := range h.j.lines() {
		if len(l) > 4*MaxDetailBytes {
			t.Errorf("journal line of %d bytes, want every line under %d", len(l), 4*MaxDetailBytes)
		}
	}
	if n := logBuf.Len(); n > 2*MaxDetailBytes {
		t.Errorf("log is %d bytes after one refusal, want at most %d", n, 2*MaxDetailBytes)
	}
	h.mustSucceed()
	noFatal(t, h)
	h.j.verifyAll(t)
}

// TestRefusalLimit: refusals up to inference.max_refusals leave the run
// alone; the one past it is journaled and ends the run (refusal_limit);
// later ones are answered but neither journaled nor logged.
func TestRefusalLimit(t *testing.T) {
	var logBuf lockedBuffer
	fp := newFakeProvider(t, false)
	pol := testPolicy(fp.srv.URL, 10)
	pol.Inference.MaxRefusals = 3
	h := startBroker(t, fp, pol, nil, withLog(&logBuf))
	bad := post("/v1/messages", strings.Replace(anthropicBody, "claude-test", "not-allowed", 1))
	for i := 0; i < 3; i++ {
		if r := h.raw(bad); r.status != 400 {
			t.Fatalf("refusal %d: status %d, want 400", i+1, r.status)
		}
	}
	noFatal(t, h)
	h.mustSucceed() // positive control: at the limit, the run goes on
	if r := h.raw(bad); r.status != 400 {
		t.Fatalf("refusal 4: status %d, want 400", r.status)
	}
	expectFatal(t, h, ReasonRefusalLimit)
	logAt := logBuf.Len()
	for i := 0; i < 20; i++ {
		if r := h.raw(bad); r.status != 400 && r.status != 503 {
			t.Fatalf("refusal past the limit: status %d, want an error", r.status)
		}
	}
	if got := len(h.records("inference.refused")); got != 4 {
		t.Errorf("%d refusal records, want 4 (max_refusals + the one that ended the run)", got)
	}
	if grown := logBuf.Len() - logAt; grown > 1024 {
		t.Errorf("log grew by %d bytes over 20 refusals past the limit, want one short line", grown)
	}
	if err := h.b.Failed(); err == nil || !strings.Contains(err.Error(), "inference.max_refusals") {
		t.Errorf("Failed() = %v, want it to name inference.max_refusals", err)
	}
	before := h.fp.count()
	if r := h.raw(post("/v1/messages", anthropicBody)); r.status == 200 {
		t.Errorf("valid request after refusal_limit: status 200, want refused")
	}
	if h.fp.count() != before {
		t.Errorf("a request reached the provider after refusal_limit")
	}
	h.j.verifyAll(t)
}

// TestJournalLimit: once the broker's records reach audit.max_bytes, the
// run ends (journal_limit) and nothing new is journaled or sent.
func TestJournalLimit(t *testing.T) {
	const limit = 8 << 10
	h := newHarness(t, 1000, func(b *Broker) { b.maxBytes = limit })
	sent := 0
	for ; sent < 100; sent++ {
		if h.b.Failed() != nil {
			break
		}
		r := h.raw(post("/v1/messages", anthropicBody, "Connection: close"))
		if r.status != 200 {
			t.Fatalf("request %d before the limit: status %d: %s", sent+1, r.status, r.body)
		}
	}
	if sent == 0 || sent == 100 {
		t.Fatalf("%d requests before the limit, want some, then journal_limit", sent)
	}
	expectFatal(t, h, ReasonJournalLimit)
	written := h.b.written.Load()
	if written < limit || written > limit+4*MaxDetailBytes {
		t.Errorf("broker wrote %d journal bytes, want the limit %d plus at most one record", written, limit)
	}
	lines := len(h.j.lines())
	before := h.fp.count()
	for i := 0; i < 5; i++ {
		h.raw(post("/v1/messages", anthropicBody, "Connection: close"))
		h.raw(post("/v1/nope", anthropicBody, "Connection: close"))
	}
	if got := len(h.j.lines()); got != lines {
		t.Errorf("journal grew from %d to %d lines past journal_limit", lines, got)
	}
	if h.fp.count() != before {
		t.Errorf("a request reached the provider past journal_limit")
	}
	h.j.verifyAll(t)
}

// TestNewRefusesUnvalidatedCaps: a policy without its run-wide caps (not
// loaded through policy.Load) is refused instead of ending every run at
// its first record.
func TestNewRefusesUnvalidatedCaps(t *testing.T) {
	pol := testPolicy("http://127.0.0.1:1", 1)
	pol.Audit.MaxBytes = 0
	if _, err := New(Config{Policy: pol, Journal: newTestJournal(t)}); err == nil || !strings.Contains(err.Error(), "audit.max_bytes") {
		t.Errorf("New with audit.max_bytes 0: %v, want an error naming it", err)
	}
	pol = testPolicy("http://127.0.0.1:1", 1)
	if _, err := New(Config{Policy: pol, Journal: newTestJournal(t)}); err != nil {
		t.Errorf("New with the default caps: %v", err)
	}
}
