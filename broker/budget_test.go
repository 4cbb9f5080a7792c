package broker

import (
	"net/http"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/internal/ledger"
)

// budgetLedger makes a ledger with a parent "p" (maxReq requests, maxTok
// output tokens) and children "c0".."cN-1" without caps of their own.
func budgetLedger(t *testing.T, maxReq, maxTok int64, children int) *ledger.Ledger {
	t.Helper()
	l, err := ledger.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := l.AddAccount("p", "", maxReq, maxTok); err != nil {
		t.Fatal(err)
	}
	for i := range children {
		if err := l.AddAccount("c"+string(rune('0'+i)), "p", 0, 0); err != nil {
			t.Fatal(err)
		}
	}
	return l
}

func withBudget(b Budget) func(*Config) { return func(c *Config) { c.Budget = b } }

// TestBudgetSettledAndExhausted: requests within the parent's budget are
// served (positive control), each with budget.updated (settled with the
// reported output tokens) before its inference.completed; the one past
// the budget is refused and never reaches the provider.
func TestBudgetSettledAndExhausted(t *testing.T) {
	l := budgetLedger(t, 3, 0, 1)
	h := newHarness(t, 100, withBudget(ledger.Charger{L: l, Account: "c0"}))
	for range 3 {
		h.mustSucceed()
	}
	r := h.raw(post("/v1/messages", anthropicBody, "Connection: close"))
	if r.status != http.StatusTooManyRequests || r.header.Get("Moat-Reason") != string(ReasonBudgetExhausted) || h.fp.count() != 3 {
		t.Fatalf("past the budget: status %d reason %q, provider saw %d", r.status, r.header.Get("Moat-Reason"), h.fp.count())
	}
	var order []string
	for _, line := range h.j.lines() {
		p := payloadOf(t, line)
		switch p["type"] {
		case audit.TypeBudgetUpdated, audit.TypeInferenceCompleted, audit.TypeInferenceRequested:
			order = append(order, p["type"].(string))
		}
	}
	want := []string{audit.TypeInferenceRequested, audit.TypeBudgetUpdated, audit.TypeInferenceCompleted}
	if len(order) != 9 {
		t.Fatalf("records %v", order)
	}
	for i, typ := range order {
		if typ != want[i%3] {
			t.Fatalf("record order %v, want %v three times", order, want)
		}
	}
	u := h.records(audit.TypeBudgetUpdated)[2]
	accts := u["accounts"].([]any)
	if u["outcome"] != audit.BudgetSettled || u["charged_tokens"] != 5.0 || u["reserved_tokens"] != 16.0 ||
		accts[1].(map[string]any)["account"] != "p" || accts[1].(map[string]any)["requests"] != 3.0 || accts[1].(map[string]any)["tokens"] != 15.0 {
		t.Fatalf("third budget.updated: %v", u)
	}
	if rf := h.records(audit.TypeInferenceRefused); len(rf) != 1 || rf[0]["reason"] != string(ReasonBudgetExhausted) {
		t.Fatalf("refusal records: %v", rf)
	}
}

// TestBudgetUncertainKept: a provider that fails after the request was
// sent leaves the reservation charged (kept), journaled before
// inference.failed; a token budget then refuses what no longer fits, and
// serves what does (control).
func TestBudgetUncertainKept(t *testing.T) {
	l := budgetLedger(t, 0, 40, 1)
	h := newHarness(t, 100, withBudget(ledger.Charger{L: l, Account: "c0"}))
	h.fp.setRespond(func(w http.ResponseWriter, r *http.Request, body []byte) {
		c, _, _ := w.(http.Hijacker).Hijack()
		c.Close() // the provider got the request, then the connection broke
	})
	if r := h.raw(post("/v1/messages", anthropicBody, "Connection: close")); r.status != 502 {
		t.Fatalf("broken provider: status %d", r.status)
	}
	last := h.j.lines()
	if p := payloadOf(t, last[len(last)-2]); p["type"] != audit.TypeBudgetUpdated || p["outcome"] != audit.BudgetKept || p["charged_tokens"] != 16.0 {
		t.Fatalf("before inference.failed: %v", p)
	}
	if p := h.lastRecord(); p["type"] != audit.TypeInferenceFailed {
		t.Fatalf("last record %v", p)
	}
	st, _ := l.Snapshot()
	if st.Accounts["p"].Tokens != 16 {
		t.Fatalf("parent after the uncertain request: %+v", st.Accounts["p"])
	}
	h.fp.setRespond(nil)
	h.mustSucceed() // 16 kept + 16 reserved <= 40; settles to 5
	// 16+5 = 21 spent: 16 more fits (37), then nothing does.
	h.mustSucceed()
	if r := h.raw(post("/v1/messages", anthropicBody, "Connection: close")); r.status != http.StatusTooManyRequests {
		t.Fatalf("past the token budget: %d %s", r.status, r.body)
	}
	if h.fp.count() != 3 {
		t.Fatalf("provider saw %d requests, want 3", h.fp.count())
	}
}

// TestBudgetConcurrentBrokers: four brokers (four children) and many
// concurrent clients share a parent's budget of 37 requests: the
// provider-side count is 37 exactly, whatever the interleaving.
func TestBudgetConcurrentBrokers(t *testing.T) {
	const budget, brokers, clients = 37, 4, 48
	l := budgetLedger(t, budget, 0, brokers)
	fp := newFakeProvider(t, false)
	hs := make([]*harness, brokers)
	for i := range hs {
		hs[i] = startBroker(t, fp, testPolicy(fp.srv.URL, 1000), nil, withBudget(ledger.Charger{L: l, Account: "c" + string(rune('0'+i))}))
		fp.verify = nil // each broker has its own journal and key
	}
	var ok, refused atomic.Int64
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h := hs[c%brokers]
			for range 2 {
				switch r := h.raw(post("/v1/messages", anthropicBody, "Connection: close")); r.status {
				case 200:
					ok.Add(1)
				case http.StatusTooManyRequests:
					refused.Add(1)
				default:
					t.Errorf("status %d: %s", r.status, r.body)
				}
			}
		}()
	}
	wg.Wait()
	if ok.Load() != budget || fp.count() != budget || refused.Load() != 2*clients-budget {
		t.Fatalf("served %d, provider saw %d, refused %d; want %d served", ok.Load(), fp.count(), refused.Load(), budget)
	}
}

// TestBudgetStreamSettled: a streamed answer is settled with the usage
// read from its events, before its inference.completed.
func TestBudgetStreamSettled(t *testing.T) {
	l := budgetLedger(t, 0, 100, 1)
	h := newHarness(t, 100, withBudget(ledger.Charger{L: l, Account: "c0"}))
	body := `{"model":"claude-test","max_tokens":16,"stream":true,"messages":[{"role":"user","content":"hi"}]}`
	if r := h.raw(post("/v1/messages", body, "Connection: close")); r.status != 200 {
		t.Fatalf("stream: %d %s", r.status, r.body)
	}
	lines := h.j.lines()
	u := payloadOf(t, lines[len(lines)-2])
	c := payloadOf(t, lines[len(lines)-1])
	if u["type"] != audit.TypeBudgetUpdated || c["type"] != audit.TypeInferenceCompleted || u["outcome"] != audit.BudgetSettled {
		t.Fatalf("last records %v then %v", u, c)
	}
	out := c["usage"].(map[string]any)["output_tokens"]
	if out == 0.0 || u["charged_tokens"] != out {
		t.Fatalf("charged %v, the stream reported %v", u["charged_tokens"], out)
	}
	st, _ := l.Snapshot()
	if float64(st.Accounts["p"].Tokens) != out {
		t.Fatalf("ledger %+v, reported %v", st.Accounts["p"], out)
	}
}
