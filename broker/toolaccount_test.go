package broker

import (
	"net/http"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/confirmation"
)

// accountTools stands in for the tool gateway: it takes the run's
// accounting from the broker, as broker/tools.Handler does.
type accountTools struct {
	http.Handler
	appendRec func(audit.Record) ([]byte, bool)
	refusal   func() (int64, int64)
}

func (a *accountTools) UseAccount(appendRec func(audit.Record) ([]byte, bool), refusal func() (int64, int64)) {
	a.appendRec, a.refusal = appendRec, refusal
}

func withTools(a *accountTools) func(*Config) { return func(c *Config) { c.Tools = a } }

func toolRequested() audit.ToolRequested {
	return audit.ToolRequested{CallID: "moatcall_000000000000000000000001", Server: "calc", Tool: "add",
		ArgumentsSHA256: strings.Repeat("0", 64), ArgumentsBytes: 2, Attribution: audit.Attribution{Status: confirmation.AttributionUnavailable, Reason: "test"}}
}

// TestToolRefusalsCountInTheRunsLimit: the gateway's refusals and the
// broker's are one count, capped by inference.max_refusals: with a cap of
// 2, an inference refusal and a tool refusal leave the run going (the
// control), and the next refusal, of either kind, ends it.
func TestToolRefusalsCountInTheRunsLimit(t *testing.T) {
	fp := newFakeProvider(t, false)
	pol := testPolicy(fp.srv.URL, 10)
	pol.Inference.MaxRefusals = 2
	gw := &accountTools{Handler: http.NotFoundHandler()}
	h := startBroker(t, fp, pol, nil, withTools(gw))
	if gw.refusal == nil || gw.appendRec == nil {
		t.Fatal("the broker did not share its accounting with the tool gateway")
	}
	bad := strings.Replace(anthropicBody, "claude-test", "claude-other", 1)
	if r := h.raw(post("/v1/messages", bad)); r.status != 400 {
		t.Fatalf("inference refusal: got %d", r.status)
	}
	if n, limit := gw.refusal(); n != 2 || limit != 2 {
		t.Fatalf("the gateway's refusal is number %d of %d, want 2 of 2 (after the broker's one)", n, limit)
	}
	noFatal(t, h)
	h.raw(post("/v1/messages", bad)) // refusal 3: past the cap
	expectFatal(t, h, ReasonRefusalLimit)
	if n, _ := gw.refusal(); n != 4 {
		t.Fatalf("the count after the broker's third refusal is %d, want 4", n)
	}
}

// TestToolRecordsCountInMaxBytes: the gateway's records go through the
// broker's journal path: they count in audit.max_bytes, and once the
// run's records reached it a tool.requested or tool.refused is not
// written and the run ends, as for inference records; a completion is
// still written.
func TestToolRecordsCountInMaxBytes(t *testing.T) {
	fp := newFakeProvider(t, false)
	gw := &accountTools{Handler: http.NotFoundHandler()}
	h := startBroker(t, fp, testPolicy(fp.srv.URL, 10), nil, withTools(gw))
	before := h.b.written.Load()
	line, ok := gw.appendRec(toolRequested())
	if !ok || h.b.written.Load() != before+int64(len(line))+1 {
		t.Fatalf("control: tool.requested written %v, journal bytes %d -> %d for a %d-byte line", ok, before, h.b.written.Load(), len(line))
	}
	noFatal(t, h)
	h.b.written.Store(h.b.maxBytes) // the run's records reached audit.max_bytes
	if _, ok := gw.appendRec(toolRequested()); ok {
		t.Fatal("a tool.requested past audit.max_bytes was written")
	}
	expectFatal(t, h, ReasonJournalLimit)
	if _, ok := gw.appendRec(audit.ToolRefused{CallID: "moatcall_000000000000000000000002", Server: "calc", Reason: "tool_not_allowed", Detail: "x",
		Attribution: audit.Attribution{Status: confirmation.AttributionUnavailable, Reason: "test"}}); ok {
		t.Fatal("a tool.refused past audit.max_bytes was written")
	}
	if _, ok := gw.appendRec(audit.ToolCompleted{CallID: "moatcall_000000000000000000000001", ResultSHA256: strings.Repeat("0", 64)}); !ok {
		t.Fatal("the completion of a call in flight was not written")
	}
}
