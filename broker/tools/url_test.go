package tools

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/moat-sandbox/moat/audit"
)

// TestURLServerPreEffect: a url server (the SDK's streamable HTTP server)
// receives each tools/call with the call's tool.requested line in
// Moat-Pre-Effect, byte for byte the durable journal line, verifiable
// with the run's key, and the credential as a bearer token; a request
// that is not a call (the control) carries no record.
func TestURLServerPreEffect(t *testing.T) {
	obs := &observer{}
	srv := testServer(obs)
	type seen struct{ method, pre, auth string }
	var mu sync.Mutex
	var got []seen
	inner := sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return srv }, nil)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		method := "other"
		for _, m := range []string{"tools/call", "tools/list", "initialize"} {
			if bytes.Contains(body, []byte(`"method":"`+m+`"`)) {
				method = m
			}
		}
		mu.Lock()
		got = append(got, seen{method, r.Header.Get(PreEffectHeader), r.Header.Get("Authorization")})
		mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(body))
		inner.ServeHTTP(w, r)
	}))
	defer hs.Close()
	ctx := context.Background()
	up, err := Connect(ctx, "remote", URLTransport(hs.URL, "tok-0123456789", URLOptions{}))
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	e := calcEntry()
	e.Name = "remote"
	f := newFixtureWith(t, e, up, obs)
	cs := f.client(t)
	if _, err := cs.ListTools(ctx, nil); err != nil {
		t.Fatal(err)
	}
	res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "add", Arguments: map[string]any{"a": 1, "b": 2}})
	if err != nil || resultText(t, res) != "3" {
		t.Fatalf("add: %v %v", res, err)
	}
	j := mustRead(t, f.w.JournalPath())
	lines := bytes.Split(bytes.TrimSuffix(j, []byte("\n")), []byte("\n"))
	var reqLine []byte
	for _, l := range lines {
		if e, err := audit.VerifyLine(l, f.w.PublicKey()); err == nil {
			if _, ok := e.Record.(audit.ToolRequested); ok {
				reqLine = l
			}
		}
	}
	if reqLine == nil {
		t.Fatal("no tool.requested in the journal")
	}
	mu.Lock()
	defer mu.Unlock()
	calls := 0
	for _, s := range got {
		if s.auth != "Bearer tok-0123456789" {
			t.Errorf("%s: Authorization %q", s.method, s.auth)
		}
		switch {
		case s.method == "tools/call":
			calls++
			line, err := base64.StdEncoding.DecodeString(s.pre)
			if err != nil || !bytes.Equal(line, reqLine) {
				t.Errorf("tools/call: Moat-Pre-Effect %q is not the journal's line %s", s.pre, reqLine)
			}
			if _, err := audit.VerifyLine(line, f.w.PublicKey()); err != nil {
				t.Errorf("the pre-effect line does not verify: %v", err)
			}
		case s.pre != "":
			t.Errorf("%s carries a pre-effect record: %q", s.method, s.pre)
		}
	}
	if calls != 1 || !strings.Contains(strings.Join(obs.seen(), "|"), `add {"a":1,"b":2}`) {
		t.Errorf("server saw %d calls (%q), want 1", calls, obs.seen())
	}
}

// TestURLServerAnswerCap: a url server's application/json answer is read
// under the same cap as a command server's message on stdio (the SDK's
// 16 MiB line limit): a larger one fails the call instead of being read
// whole into moat's memory. Control: a small answer of the same server,
// in the same form, is the result.
func TestURLServerAnswerCap(t *testing.T) {
	obs := &observer{}
	srv := testServer(obs)
	var size atomic.Int64 // the text's size in the next tools/call answer
	inner := sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return srv }, nil)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var m struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		if json.Unmarshal(body, &m) == nil && m.Method == "tools/call" {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"`, m.ID)
			chunk := strings.Repeat("x", 1<<20)
			for n := int(size.Load()); n > 0; n -= len(chunk) {
				io.WriteString(w, chunk[:min(n, len(chunk))])
			}
			io.WriteString(w, `"}]}}`)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		inner.ServeHTTP(w, r)
	}))
	defer hs.Close()
	ctx := context.Background()
	up, err := Connect(ctx, "remote", URLTransport(hs.URL, "", URLOptions{}))
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	size.Store(1000)
	if res, err := up.CallTool(ctx, "add", []byte(`{}`)); err != nil || len(res.Content) != 1 {
		t.Fatalf("control: %v %v", res, err)
	}
	size.Store(40 << 20)
	if _, err := up.CallTool(ctx, "add", []byte(`{}`)); err == nil {
		t.Fatal("a 40 MiB answer was read whole")
	}
}
