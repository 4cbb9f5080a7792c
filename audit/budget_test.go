package audit

import (
	"os"
	"strings"
	"testing"
)

func TestBudgetUpdatedRoundTrip(t *testing.T) {
	w, _ := newTestWriter(t)
	rec := BudgetUpdated{RequestID: "moatreq_000000000000000000000001", Outcome: BudgetKept, ReservedTokens: 64, ChargedTokens: 64,
		Accounts: []BudgetBalance{{Account: "child", Requests: 1, Tokens: 64}, {Account: "parent", Requests: 3, MaxRequests: 8, Tokens: 100, MaxTokens: 512}}}
	appendAll(t, w, runStarted(w), sampleRecords()[0], rec)
	raw, err := os.ReadFile(w.JournalPath())
	if err != nil {
		t.Fatal(err)
	}
	if res := Verify(raw, w.PublicKey()); res.Status != Incomplete || res.Records != 3 {
		t.Fatalf("verify: %+v", res)
	}
	e, err := ParseLine(raw[strings.LastIndex(strings.TrimSuffix(string(raw), "\n"), "\n")+1 : len(raw)-1])
	if err != nil {
		t.Fatal(err)
	}
	got, ok := e.Record.(BudgetUpdated)
	if !ok || got.Accounts[1] != rec.Accounts[1] || got.Outcome != BudgetKept {
		t.Fatalf("decoded %#v", e.Record)
	}
	if d := Describe(got); d != "id=moatreq_000000000000000000000001 outcome=kept reserved=64 charged=64 child=1/- req,64/- tok parent=3/8 req,100/512 tok" {
		t.Errorf("Describe: %s", d)
	}
}
