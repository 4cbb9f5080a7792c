package tools

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/policy"
)

const testSecret = "sk-moat-test-0123456789abcdef0123456789"

// observer is the server's own log: every call that reached it, with the
// exact arguments bytes it received.
type observer struct {
	mu    sync.Mutex
	calls []string // tool + " " + raw arguments
}

func (o *observer) record(tool string, args []byte) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.calls = append(o.calls, tool+" "+string(args))
}

func (o *observer) seen() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]string(nil), o.calls...)
}

// testServer is a real MCP server of the SDK with tools add, rm, sleep
// and leak (its result holds the credential).
func testServer(o *observer) *sdk.Server {
	s := sdk.NewServer(&sdk.Implementation{Name: "calc", Version: "1"}, nil)
	obj := map[string]any{"type": "object"}
	add := func(name string, h func(context.Context, json.RawMessage) (*sdk.CallToolResult, error)) {
		s.AddTool(&sdk.Tool{Name: name, InputSchema: obj}, func(ctx context.Context, req *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
			o.record(name, req.Params.Arguments)
			return h(ctx, req.Params.Arguments)
		})
	}
	text := func(s string) *sdk.CallToolResult {
		return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: s}}}
	}
	add("add", func(_ context.Context, a json.RawMessage) (*sdk.CallToolResult, error) {
		var in struct{ A, B float64 }
		if err := json.Unmarshal(a, &in); err != nil {
			return nil, err
		}
		b, _ := json.Marshal(in.A + in.B)
		return text(string(b)), nil
	})
	add("rm", func(context.Context, json.RawMessage) (*sdk.CallToolResult, error) { return text("removed"), nil })
	add("sleep", func(ctx context.Context, _ json.RawMessage) (*sdk.CallToolResult, error) {
		<-ctx.Done()
		return text("late"), nil
	})
	add("leak", func(context.Context, json.RawMessage) (*sdk.CallToolResult, error) {
		return text("key=" + testSecret), nil
	})
	add("leakerr", func(context.Context, json.RawMessage) (*sdk.CallToolResult, error) {
		return nil, errors.New("upstream refused key " + testSecret) // a JSON-RPC error
	})
	return s
}

type fixture struct {
	h    *Handler
	obs  *observer
	w    *audit.Writer
	url  string
	dir  string
	fat  chan string
	pol  *policy.Policy
	http *httptest.Server
}

// newFixture serves entry's server (a real SDK server connected over the
// SDK's in-memory transport) behind a Handler journaling to a real audit
// writer, on a loopback httptest server.
func newFixture(t *testing.T, entry policy.MCPServer) *fixture {
	t.Helper()
	obs := &observer{}
	st, ct := sdk.NewInMemoryTransports()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ss, err := testServer(obs).Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ss.Close() })
	up, err := Connect(ctx, entry.Name, ct)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { up.Close() })
	return newFixtureWith(t, entry, up, obs)
}

// newFixtureWith is newFixture with the server already connected.
func newFixtureWith(t *testing.T, entry policy.MCPServer, up Upstream, obs *observer) *fixture {
	t.Helper()
	pol := policy.Default()
	pol.Inference.MaxRefusals = 8
	pol.Tools.MCP = []policy.MCPServer{entry}
	var err error
	dir := filepath.Join(t.TempDir(), "run")
	w, err := audit.Create(dir, "tools-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	if _, err := w.Append(audit.RunStarted{PolicySHA256: strings.Repeat("a", 64), Backend: "native", BinarySHA256: strings.Repeat("b", 64), PublicKey: string(w.PublicKeyPEM())}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Append(audit.BoundaryConfirmed{Ready: true}); err != nil {
		t.Fatal(err)
	}
	f := &fixture{obs: obs, w: w, dir: dir, fat: make(chan string, 1), pol: pol}
	f.h, err = New(Config{Policy: pol, Journal: w, Servers: map[string]Upstream{entry.Name: up},
		Reflects: func(b []byte) bool { return bytes.Contains(b, []byte(testSecret)) },
		Attribute: func(*http.Request) audit.Attribution {
			return audit.Attribution{Status: "resolved", PID: 42, Executable: "/usr/bin/agent"}
		},
		OnFatal: func(reason string, _ error) { f.fat <- reason }})
	if err != nil {
		t.Fatal(err)
	}
	f.http = httptest.NewServer(f.h)
	t.Cleanup(f.http.Close)
	f.url = f.http.URL + PathPrefix + entry.Name
	return f
}

func calcEntry() policy.MCPServer {
	return policy.MCPServer{Name: "calc", Tools: []string{"add", "sleep", "leak"}, MaxCalls: 4, MaxArgumentBytes: 1024, Timeout: policy.Duration(500 * time.Millisecond)}
}

// client connects the SDK's own client, over streamable HTTP, as an
// agent in the sandbox would.
func (f *fixture) client(t *testing.T) *sdk.ClientSession {
	t.Helper()
	c := sdk.NewClient(&sdk.Implementation{Name: "agent", Version: "1"}, nil)
	cs, err := c.Connect(context.Background(), &sdk.StreamableClientTransport{Endpoint: f.url, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// records returns the journal's records after line 2, verified.
func (f *fixture) records(t *testing.T) []audit.Record {
	t.Helper()
	j, err := os.ReadFile(f.w.JournalPath())
	if err != nil {
		t.Fatal(err)
	}
	if r := audit.Verify(j, f.w.PublicKey()); r.Status != audit.Incomplete {
		t.Fatalf("journal: got %v (%v), want a valid, unterminated journal", r.Status, r.Err)
	}
	var out []audit.Record
	for i, line := range bytes.Split(bytes.TrimSuffix(j, []byte("\n")), []byte("\n")) {
		e, err := audit.ParseLine(line)
		if err != nil {
			t.Fatal(err)
		}
		if i >= 2 {
			out = append(out, e.Record)
		}
	}
	return out
}

func resultText(t *testing.T, r *sdk.CallToolResult) string {
	t.Helper()
	if len(r.Content) != 1 {
		t.Fatalf("result has %d contents", len(r.Content))
	}
	tc, ok := r.Content[0].(*sdk.TextContent)
	if !ok {
		t.Fatalf("content %T", r.Content[0])
	}
	return tc.Text
}

// TestCallAndRefusal: with the SDK's client and server on either side, an
// allowed call succeeds with tool.requested durable before the server
// saw it and tool.completed after; an unlisted tool is refused, journaled
// and never reaches the server; tools/list shows only the allowlist.
func TestCallAndRefusal(t *testing.T) {
	f := newFixture(t, calcEntry())
	cs := f.client(t)
	ctx := context.Background()

	lt, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range lt.Tools {
		names = append(names, tl.Name)
	}
	if got := strings.Join(names, ","); got != "add,leak,sleep" {
		t.Errorf("tools/list: got %s, want add,leak,sleep (rm is not on the allowlist)", got)
	}

	res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "add", Arguments: map[string]any{"b": 3, "a": 2}})
	if err != nil {
		t.Fatalf("add: %v", err)
	}
	if got := resultText(t, res); got != "5" || res.IsError {
		t.Errorf("add: got %q (isError %v), want 5", got, res.IsError)
	}
	_, err = cs.CallTool(ctx, &sdk.CallToolParams{Name: "rm", Arguments: map[string]any{"path": "/"}})
	if err == nil || !strings.Contains(err.Error(), `tool "rm" is not allowed`) {
		t.Errorf("rm: got %v, want a refusal naming the tool", err)
	}
	// The server's own log: add arrived, with exactly the canonical
	// bytes; rm never did.
	const canon = `{"a":2,"b":3}`
	if got := f.obs.seen(); len(got) != 1 || got[0] != "add "+canon {
		t.Errorf("server saw %q, want [add %s]", got, canon)
	}
	recs := f.records(t)
	if len(recs) != 3 {
		t.Fatalf("journal holds %d tool records, want 3: %#v", len(recs), recs)
	}
	req, ok1 := recs[0].(audit.ToolRequested)
	done, ok2 := recs[1].(audit.ToolCompleted)
	ref, ok3 := recs[2].(audit.ToolRefused)
	if !ok1 || !ok2 || !ok3 {
		t.Fatalf("journal order: got %T %T %T, want tool.requested, tool.completed, tool.refused", recs[0], recs[1], recs[2])
	}
	sum := sha256.Sum256([]byte(canon))
	if req.Server != "calc" || req.Tool != "add" || req.ArgumentsSHA256 != hex.EncodeToString(sum[:]) || req.ArgumentsBytes != int64(len(canon)) || req.Attribution.PID != 42 {
		t.Errorf("tool.requested: got %+v", req)
	}
	if done.CallID != req.CallID || done.IsError || done.ResultBytes == 0 {
		t.Errorf("tool.completed: got %+v for call %s", done, req.CallID)
	}
	if ref.Reason != ReasonToolNotAllowed || ref.Tool != "rm" || ref.Method != MethodToolsCall || ref.Server != "calc" {
		t.Errorf("tool.refused: got %+v", ref)
	}
}

// TestRawBodies: what the SDK's client would never send is refused before
// any server sees it, with a JSON-RPC error; a well-formed control in the
// same setup passes.
func TestRawBodies(t *testing.T) {
	f := newFixture(t, calcEntry())
	post := func(body, ct string) (int, map[string]any) {
		t.Helper()
		resp, err := http.Post(f.url, ct, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		json.NewDecoder(resp.Body).Decode(&out)
		return resp.StatusCode, out
	}
	reason := func(m map[string]any) string {
		e, _ := m["error"].(map[string]any)
		d, _ := e["data"].(map[string]any)
		s, _ := d["reason"].(string)
		return s
	}
	for _, c := range []struct {
		name, body, ct string
		status         int
		reason         string
	}{
		{"duplicate key", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"add","name":"rm","arguments":{}}}`, "application/json", 200, ReasonBadJSON},
		{"trailing data", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"add","arguments":{}}}x`, "application/json", 200, ReasonBadJSON},
		{"invalid UTF-8", "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"add\",\"arguments\":{\"a\":\"\xff\"}}}", "application/json", 200, ReasonBadJSON},
		{"resources/read", `{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"file:///etc/shadow"}}`, "application/json", 200, ReasonMethodNotAllowed},
		{"text/plain", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"add","arguments":{}}}`, "text/plain", 415, ReasonContentType},
	} {
		st, out := post(c.body, c.ct)
		if st != c.status || reason(out) != c.reason {
			t.Errorf("%s: got %d %q, want %d %q", c.name, st, reason(out), c.status, c.reason)
		}
	}
	if got := f.obs.seen(); len(got) != 0 {
		t.Errorf("server saw %q, want nothing", got)
	}
	st, out := post(`{"jsonrpc":"2.0","id":"c","method":"tools/call","params":{"name":"add","arguments":{"a":1,"b":1}}}`, "application/json")
	if st != 200 || out["id"] != "c" || out["result"] == nil {
		t.Errorf("control: got %d %v", st, out)
	}
	if got := f.obs.seen(); len(got) != 1 {
		t.Errorf("control: server saw %q, want one call", got)
	}
}

// TestAllowanceTimeoutReflection: max_calls is reserved before the
// record and never returned; a hanging tool is cut at the timeout
// (tool.failed); a result carrying a credential is withheld and ends the
// run, after which nothing is called.
func TestAllowanceTimeoutReflection(t *testing.T) {
	f := newFixture(t, calcEntry())
	cs := f.client(t)
	ctx := context.Background()
	start := time.Now()
	if _, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "sleep"}); err == nil || !strings.Contains(err.Error(), "did not answer within 500ms") {
		t.Errorf("sleep: got %v, want the timeout", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("sleep took %v", d)
	}
	if _, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "add", Arguments: map[string]any{"a": 1, "b": 1}}); err != nil {
		t.Fatalf("add after timeout: %v", err)
	}
	_, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "leak"})
	if err == nil || !strings.Contains(err.Error(), "withheld") {
		t.Errorf("leak: got %v, want withheld", err)
	}
	if r := <-f.fat; r != ReasonReflected {
		t.Errorf("fatal: got %s, want %s", r, ReasonReflected)
	}
	// Run failed: even an allowed call with allowance left is refused.
	if _, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "add", Arguments: map[string]any{"a": 1, "b": 1}}); err == nil || !strings.Contains(err.Error(), "stopped after a fatal event") {
		t.Errorf("after the fatal event: got %v", err)
	}
	var types []string
	for _, r := range f.records(t) {
		types = append(types, r.RecordType())
		if fl, ok := r.(audit.ToolFailed); ok && fl.Reason != ReasonTimeout && fl.Reason != ReasonReflected {
			t.Errorf("tool.failed reason %q", fl.Reason)
		}
	}
	want := "tool.requested tool.failed tool.requested tool.completed tool.requested tool.failed tool.refused"
	if got := strings.Join(types, " "); got != want {
		t.Errorf("journal: got %s\nwant %s", got, want)
	}
	if strings.Contains(string(mustRead(t, f.w.JournalPath())), testSecret) {
		t.Error("the journal holds the credential")
	}

	// Allowance: a fresh run with max_calls 1.
	e := calcEntry()
	e.MaxCalls = 1
	g := newFixture(t, e)
	gs := g.client(t)
	if _, err := gs.CallTool(ctx, &sdk.CallToolParams{Name: "add", Arguments: map[string]any{"a": 1, "b": 1}}); err != nil {
		t.Fatalf("first call: %v", err)
	}
	if _, err := gs.CallTool(ctx, &sdk.CallToolParams{Name: "add", Arguments: map[string]any{"a": 1, "b": 1}}); err == nil || !strings.Contains(err.Error(), "max_calls 1") {
		t.Errorf("second call: got %v, want the allowance refusal", err)
	}
	if n := len(g.obs.seen()); n != 1 {
		t.Errorf("server saw %d calls, want 1", n)
	}
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestJournalFailure: when the pre-effect record cannot be made durable,
// the call is not made.
func TestJournalFailure(t *testing.T) {
	f := newFixture(t, calcEntry())
	f.w.Close()
	cs := f.client(t)
	_, err := cs.CallTool(context.Background(), &sdk.CallToolParams{Name: "add", Arguments: map[string]any{"a": 1, "b": 1}})
	if err == nil || !strings.Contains(err.Error(), "could not be made durable") {
		t.Errorf("got %v, want the durability refusal", err)
	}
	if got := f.obs.seen(); len(got) != 0 {
		t.Errorf("server saw %q, want nothing", got)
	}
	if r := <-f.fat; r != ReasonAuditFailure {
		t.Errorf("fatal: got %s", r)
	}
	if !errors.Is(f.h.Failed(), f.h.Failed()) || f.h.Failed() == nil {
		t.Error("handler not failed")
	}
}

// TestSharedAccount: with the run's accounting (UseAccount, as the broker
// gives it), records go through its append and refusals into its count.
// The control call is journaled through it and reaches the server; a
// refusal takes the run's next number, and the one past the cap ends the
// run; once the run's append refuses a tool.requested (journal full), the
// call never reaches the server and later calls are refused as run_failed.
func TestSharedAccount(t *testing.T) {
	f := newFixture(t, calcEntry())
	var mu sync.Mutex
	var written []string
	full := false
	refusals := int64(5) // the broker's refusals so far
	f.h.UseAccount(func(r audit.Record) ([]byte, bool) {
		mu.Lock()
		defer mu.Unlock()
		if full && (r.RecordType() == audit.TypeToolRequested || r.RecordType() == audit.TypeToolRefused) {
			return nil, false
		}
		written = append(written, r.RecordType())
		line, err := f.w.Append(r)
		return line, err == nil
	}, func() (int64, int64) {
		mu.Lock()
		defer mu.Unlock()
		refusals++
		return refusals, 6
	})
	cs := f.client(t)
	call := func(tool string) error {
		_, err := cs.CallTool(context.Background(), &sdk.CallToolParams{Name: tool, Arguments: map[string]any{"a": 1, "b": 1}})
		return err
	}
	if err := call("add"); err != nil {
		t.Fatalf("control call: %v", err)
	}
	if err := call("mul"); err == nil {
		t.Fatal("unlisted tool not refused")
	}
	select {
	case r := <-f.fat:
		t.Fatalf("fatal %s at the run's 6th refusal, cap 6", r)
	default:
	}
	call("mul") // the run's 7th: past the cap
	if r := <-f.fat; r != ReasonRefusalLimit {
		t.Fatalf("fatal: got %s, want %s", r, ReasonRefusalLimit)
	}
	mu.Lock()
	got := strings.Join(written, " ")
	mu.Unlock()
	if want := "tool.requested tool.completed tool.refused tool.refused"; got != want {
		t.Errorf("through the run's append: %s, want %s", got, want)
	}

	g := newFixture(t, calcEntry())
	g.h.UseAccount(func(r audit.Record) ([]byte, bool) {
		if r.RecordType() == audit.TypeToolRequested {
			return nil, false // the broker found the journal full and ended the run
		}
		line, err := g.w.Append(r)
		return line, err == nil
	}, func() (int64, int64) { return 1, 8 })
	gs := g.client(t)
	if _, err := gs.CallTool(context.Background(), &sdk.CallToolParams{Name: "add", Arguments: map[string]any{"a": 1, "b": 1}}); err == nil {
		t.Fatal("a call whose pre-effect record was not written went through")
	}
	if seen := g.obs.seen(); len(seen) != 0 {
		t.Errorf("server saw %q, want nothing", seen)
	}
	if g.h.Failed() == nil {
		t.Error("the gateway did not stop with the run")
	}
	select {
	case r := <-g.fat:
		t.Errorf("the gateway raised its own fatal %s; the broker already ended the run", r)
	default:
	}
	_, err := gs.CallTool(context.Background(), &sdk.CallToolParams{Name: "add", Arguments: map[string]any{"a": 1, "b": 1}})
	if err == nil || !strings.Contains(err.Error(), "run was stopped") {
		t.Errorf("later call: got %v, want the run_failed refusal", err)
	}
}

// TestErrorReflection: a tool server's JSON-RPC error is shown to the
// workload and journaled, so its text goes through the reflection guard
// like a result: an error carrying a credential is withheld and ends the
// run. Control: an ordinary error (add's bad arguments) reaches the
// workload.
func TestErrorReflection(t *testing.T) {
	e := calcEntry()
	e.Tools = append(e.Tools, "leakerr")
	e.Timeout = policy.Duration(10 * time.Second) // no call here waits
	f := newFixture(t, e)
	cs := f.client(t)
	ctx := context.Background()
	if _, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "add", Arguments: map[string]any{"a": "x"}}); err == nil || !strings.Contains(err.Error(), "cannot unmarshal") {
		t.Fatalf("control: got %v, want the server's own error", err)
	}
	_, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "leakerr"})
	if err == nil || strings.Contains(err.Error(), testSecret) || !strings.Contains(err.Error(), "withheld") {
		t.Fatalf("leakerr: got %v, want withheld without the credential", err)
	}
	select {
	case r := <-f.fat:
		if r != ReasonReflected {
			t.Errorf("fatal: got %s, want %s", r, ReasonReflected)
		}
	default:
		t.Error("no fatal event")
	}
	if strings.Contains(string(mustRead(t, f.w.JournalPath())), testSecret) {
		t.Error("the journal holds the credential")
	}
}

// TestRunFailedElsewhere: once the run failed on another road (the
// broker's fatal event, told through UseRunState), no tool call is made,
// and a fatal event of the gateway is passed to the run. Control: before
// it, the same call reaches the server.
func TestRunFailedElsewhere(t *testing.T) {
	f := newFixture(t, calcEntry())
	var runErr atomic.Pointer[error]
	var told []string
	f.h.UseRunState(func() error {
		if p := runErr.Load(); p != nil {
			return *p
		}
		return nil
	}, func(reason string, _ error) { told = append(told, reason) })
	cs := f.client(t)
	ctx := context.Background()
	add := &sdk.CallToolParams{Name: "add", Arguments: map[string]any{"a": 1, "b": 1}}
	if _, err := cs.CallTool(ctx, add); err != nil {
		t.Fatalf("control: %v", err)
	}
	e := errors.New("credential_reflected: an inference answer carried the credential")
	runErr.Store(&e)
	if _, err := cs.CallTool(ctx, add); err == nil || !strings.Contains(err.Error(), "stopped after a fatal event") {
		t.Errorf("after the run's fatal event: got %v", err)
	}
	if n := len(f.obs.seen()); n != 1 {
		t.Errorf("the server saw %d calls, want the control's only", n)
	}
	// The gateway's own fatal event reaches the run.
	g := newFixture(t, calcEntry())
	g.h.UseRunState(func() error { return nil }, func(reason string, _ error) { told = append(told, reason) })
	if _, err := g.client(t).CallTool(ctx, &sdk.CallToolParams{Name: "leak"}); err == nil {
		t.Error("leak was not withheld")
	}
	if strings.Join(told, ",") != ReasonReflected {
		t.Errorf("told the run %q, want %s", told, ReasonReflected)
	}
}

// TestRunFailedWhileHeld: a fatal event that comes while a call is held
// for approval (or while its tool.requested record is written) keeps the
// approved call from leaving; the control is the same call approved with
// the run still healthy.
func TestRunFailedWhileHeld(t *testing.T) {
	f := newFixture(t, calcEntry())
	var runErr atomic.Pointer[error]
	f.h.UseRunState(func() error {
		if p := runErr.Load(); p != nil {
			return *p
		}
		return nil
	}, func(string, error) {})
	var failDuringHold atomic.Bool
	f.h.UseApprovals(func(ctx context.Context, callID, server, tool string, args []byte) (string, string) {
		if failDuringHold.Load() {
			e := errors.New("credential_reflected: an inference answer carried the credential")
			runErr.Store(&e)
		}
		return "", "" // approved
	})
	cs := f.client(t)
	ctx := context.Background()
	add := &sdk.CallToolParams{Name: "add", Arguments: map[string]any{"a": 1, "b": 1}}
	if _, err := cs.CallTool(ctx, add); err != nil {
		t.Fatalf("control: an approved call in a healthy run: %v", err)
	}
	failDuringHold.Store(true)
	if _, err := cs.CallTool(ctx, add); err == nil || !strings.Contains(err.Error(), "fatal event") {
		t.Errorf("a call approved after the run's fatal event: got %v, want a refusal naming the fatal event", err)
	}
	if n := len(f.obs.seen()); n != 1 {
		t.Errorf("the server saw %d calls, want the control's only", n)
	}
}
