package broker

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/broker/tools"
	"github.com/moat-sandbox/moat/policy"
)

// countingServer is a tool server that records each call's arguments.
type countingServer struct {
	mu    sync.Mutex
	calls []string
}

func (s *countingServer) ListTools(context.Context) ([]*sdk.Tool, error) { return nil, nil }

func (s *countingServer) CallTool(_ context.Context, tool string, args []byte) (*sdk.CallToolResult, error) {
	s.mu.Lock()
	s.calls = append(s.calls, tool+" "+string(args))
	s.mu.Unlock()
	return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "done"}}}, nil
}

func (s *countingServer) seen() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.calls...)
}

func toolCall(tool, args string) string {
	return `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"` + tool + `","arguments":` + args + `}}`
}

// TestApprovalToolCall: on the tool road, a call of the rule's tool is
// held and reaches the server only once approved with its digest (the
// canonical arguments); another tool is not held (control); a denied
// call and a call approved with another digest never reach the server.
func TestApprovalToolCall(t *testing.T) {
	fp := newFakeProvider(t, false)
	pol := testPolicy(fp.srv.URL, 100)
	pol.Tools.MCP = []policy.MCPServer{{Name: "calc", Tools: []string{"add", "rm"}, MaxCalls: 16, MaxArgumentBytes: 4096, Timeout: policy.Duration(10 * time.Second)}}
	pol.Approvals = policy.Approvals{Timeout: policy.Duration(time.Minute), Rules: []policy.ApprovalRule{{Road: policy.RoadTool, Server: "calc", Tool: "rm"}}}
	srv := &countingServer{}
	j := newTestJournal(t)
	gw, err := tools.New(tools.Config{Policy: pol, Journal: j, Servers: map[string]tools.Upstream{"calc": srv},
		Attribute: func(r *http.Request) audit.Attribution { a, _ := AttributionFrom(r.Context()); return a },
		Reflects:  func([]byte) bool { return false }})
	if err != nil {
		t.Fatal(err)
	}
	h := startBroker(t, fp, pol, nil, j, func(c *Config) { c.Tools = gw; c.RunID = "run-broker-test" })
	d := h.b.Approvals()
	send := func(tool, args string) <-chan result {
		ch := make(chan result, 1)
		go func() {
			ch <- h.raw(post("/mcp/calc", toolCall(tool, args), "Connection: close", "Accept: application/json, text/event-stream"))
		}()
		return ch
	}
	if r := <-send("add", `{"a":1,"b":2}`); r.status != 200 || !strings.Contains(r.body, "done") || len(srv.seen()) != 1 {
		t.Fatalf("unheld tool: %d %s, server saw %v", r.status, r.body, srv.seen())
	}
	// Approved with its digest: made once.
	res := send("rm", `{"path":"/tmp/x"}`)
	held := waitHeld(t, d, 1)[0]
	if held.Road != "tool" || held.Target != "calc" || held.Name != "rm" || held.RequestSHA256 != sha([]byte(`{"path":"/tmp/x"}`)) {
		t.Fatalf("held: %+v", held)
	}
	if len(srv.seen()) != 1 {
		t.Fatalf("server saw a held call: %v", srv.seen())
	}
	if rep := d.Do(ApprovalCommand{Op: ApprovalOpApprove, ID: held.ID, Digest: held.RequestSHA256}, approver); rep.Error != "" {
		t.Fatal(rep.Error)
	}
	if r := <-res; r.status != 200 || !strings.Contains(r.body, "done") {
		t.Fatalf("approved call: %d %s", r.status, r.body)
	}
	if s := srv.seen(); len(s) != 2 || s[1] != `rm {"path":"/tmp/x"}` {
		t.Fatalf("server saw %v", s)
	}
	// Denied, and approved with another digest: never made.
	res = send("rm", `{"path":"/"}`)
	held = waitHeld(t, d, 1)[0]
	d.Do(ApprovalCommand{Op: ApprovalOpDeny, ID: held.ID}, approver)
	if r := <-res; !strings.Contains(r.body, string(ReasonApprovalDenied)) {
		t.Errorf("denied call: %d %s", r.status, r.body)
	}
	res = send("rm", `{"path":"/home"}`)
	held = waitHeld(t, d, 1)[0]
	d.Do(ApprovalCommand{Op: ApprovalOpApprove, ID: held.ID, Digest: sha([]byte(`{"path":"/tmp/x"}`))}, approver)
	if r := <-res; !strings.Contains(r.body, string(ReasonApprovalSubstituted)) {
		t.Errorf("substituted call: %d %s", r.status, r.body)
	}
	if s := srv.seen(); len(s) != 2 {
		t.Errorf("server saw %v, want the two calls only", s)
	}
	if n := len(h.records(audit.TypeToolRefused)); n != 2 {
		t.Errorf("%d tool.refused, want 2", n)
	}
}
