package broker

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/broker/wire"
)

// canonicalFields are the fields of every decision line, in order.
var canonicalFields = []string{"time", "level", "msg", "request_id", "reason", "api", "endpoint", "provider",
	"model", "stream", "status", "attribution", "pid", "duration_ms", "detail"}

// logLine is one JSON log line with its keys in the order written.
type logLine struct {
	keys []string
	m    map[string]any
}

func parseLogLines(t *testing.T, out string) []logLine {
	t.Helper()
	var lines []logLine
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if l == "" {
			continue
		}
		var ll logLine
		if err := json.Unmarshal([]byte(l), &ll.m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		dec := json.NewDecoder(strings.NewReader(l))
		dec.Token() // {
		for dec.More() {
			k, _ := dec.Token()
			ll.keys = append(ll.keys, k.(string))
			var skip any
			dec.Decode(&skip)
		}
		lines = append(lines, ll)
	}
	return lines
}

// TestCanonicalLogLine: every request ends in exactly one decision line
// (completed at Info, refused or failed at Warn; admitted at Debug before
// it is sent), each with the same fields in the same order, naming the
// request as its journal record does.
func TestCanonicalLogLine(t *testing.T) {
	var buf syncBuf
	h := newHarness(t, 10, func(c *Config) {
		c.Log = slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	h.mustSucceed()
	if r := h.raw(post("/v1/messages", strings.Replace(anthropicBody, "claude-test", "not-allowed", 1))); r.status != 400 {
		t.Fatalf("refusal: status %d", r.status)
	}
	h.fp.setRespond(func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Location", "http://127.0.0.1:1/")
		w.WriteHeader(307)
	})
	if r := h.raw(post("/v1/messages", anthropicBody)); r.status != 502 {
		t.Fatalf("redirect: status %d", r.status)
	}
	lines := parseLogLines(t, buf.String())
	ends := map[string]logLine{} // request id → its ending line
	count := map[string]int{}
	for _, l := range lines {
		if !slices.Equal(l.keys, canonicalFields) {
			t.Errorf("line %v: fields %v, want %v", l.m, l.keys, canonicalFields)
		}
		decision, _ := strings.CutPrefix(l.m["msg"].(string), "moat.broker ")
		count[decision]++
		wantLevel := map[string]string{decisionAdmitted: "DEBUG", decisionCompleted: "INFO", decisionRefused: "WARN", decisionFailed: "WARN"}[decision]
		if l.m["level"] != wantLevel {
			t.Errorf("%s line at level %v, want %s", decision, l.m["level"], wantLevel)
		}
		if decision == decisionAdmitted {
			continue
		}
		id := l.m["request_id"].(string)
		if _, dup := ends[id]; dup {
			t.Errorf("request %s has two ending lines", id)
		}
		ends[id] = l
	}
	if want := map[string]int{decisionAdmitted: 2, decisionCompleted: 1, decisionRefused: 1, decisionFailed: 1}; !mapsEqual(count, want) {
		t.Errorf("decision lines %v, want %v", count, want)
	}
	// Each ending line matches the journal's record of the request.
	for _, typ := range []string{audit.TypeInferenceCompleted, audit.TypeInferenceRefused, audit.TypeInferenceFailed} {
		for _, rec := range h.records(typ) {
			l, ok := ends[rec["request_id"].(string)]
			if !ok {
				t.Errorf("%s %v has no log line", typ, rec["request_id"])
				continue
			}
			if typ != audit.TypeInferenceCompleted && (l.m["reason"] != rec["reason"] || l.m["detail"] != rec["detail"]) {
				t.Errorf("log line %v does not match record %v", l.m, rec)
			}
		}
	}
	for _, l := range ends {
		switch l.m["msg"] {
		case "moat.broker completed":
			if l.m["status"] != 200.0 || l.m["provider"] != "anthropic" || l.m["model"] != "claude-test" || l.m["reason"] != "" || l.m["attribution"] != "unavailable" {
				t.Errorf("completed line %v", l.m)
			}
		case "moat.broker refused":
			if l.m["status"] != 400.0 || l.m["reason"] != string(wire.ReasonModelNotAllowed) || l.m["endpoint"] != "/v1/messages" {
				t.Errorf("refused line %v", l.m)
			}
		case "moat.broker failed":
			if l.m["status"] != 502.0 || l.m["reason"] != string(ReasonUpstreamRedirect) || l.m["provider"] != "anthropic" {
				t.Errorf("failed line %v", l.m)
			}
		}
	}
}

func mapsEqual(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestAttributionResolvedOnce: a request's process is looked up once,
// whether it is completed or refused after the lookup (the refusal record
// used to look it up a second time).
func TestAttributionResolvedOnce(t *testing.T) {
	var calls atomic.Int64
	h := newHarness(t, 1, func(c *Config) {
		c.Attributor = attributorFunc(func(net.Conn) audit.Attribution {
			calls.Add(1)
			return audit.Attribution{Status: "resolved", PID: 7, Executable: "/bin/agent"}
		})
	})
	h.mustSucceed()
	if n := calls.Load(); n != 1 {
		t.Errorf("completed request: %d lookups, want 1", n)
	}
	// The allowance (1) is used up: refused after the lookup.
	if r := h.raw(post("/v1/messages", anthropicBody)); Reason(r.header.Get("Moat-Reason")) != ReasonAllowanceExhausted {
		t.Fatalf("second request: %d %s, want %s", r.status, r.header.Get("Moat-Reason"), ReasonAllowanceExhausted)
	}
	if n := calls.Load(); n != 2 {
		t.Errorf("refused request: %d lookups in all, want 2 (one per request)", n)
	}
	if a := h.records(audit.TypeInferenceRefused)[0]["attribution"].(map[string]any); a["pid"] != 7.0 {
		t.Errorf("refusal record attribution %v, want the lookup's", a)
	}
}

// prefixOnce reports whether s starts with want and holds no second
// "moat: " or "refused: ".
func prefixOnce(s, want string) bool {
	return strings.HasPrefix(s, want) && strings.Count(s, "moat: ") == 1 && strings.Count(s, "refused: ") <= strings.Count(want, "refused: ")
}

// TestPrefixOnce: every refusal and failure the worker, the journal and
// the log get says "moat: refused: " (or "moat: <reason>: ") once, from
// whichever stage it comes: the front, the header policy, broker/wire,
// the broker after a fatal event whose cause itself says "refused:", and
// the upstream stage.
func TestPrefixOnce(t *testing.T) {
	var buf syncBuf
	h := newHarness(t, 100, func(c *Config) {
		c.Log = slog.New(slog.NewJSONHandler(&buf, nil))
	})
	check := func(name string, r result, want string) {
		t.Helper()
		var o struct {
			Error struct{ Message string } `json:"error"`
		}
		if err := json.Unmarshal([]byte(r.body), &o); err != nil {
			t.Fatalf("%s: body %s: %v", name, r.body, err)
		}
		if !prefixOnce(o.Error.Message, want) {
			t.Errorf("%s: message %q, want the prefix %q once", name, o.Error.Message, want)
		}
	}
	check("front", h.raw("POST /v1/messages?key=1 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"), "moat: refused: ")
	check("path", h.raw(post("/v1/files", anthropicBody)), "moat: refused: ")
	check("header", h.raw(post("/v1/messages", anthropicBody, "Authorization: Bearer sk-mine")), "moat: refused: ")
	check("wire", h.raw(post("/v1/messages", strings.Replace(anthropicBody, "claude-test", "not-allowed", 1))), "moat: refused: ")
	check("wire json", h.raw(post("/v1/messages", anthropicBody+"x")), "moat: refused: ")
	h.fp.setRespond(func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Location", "http://127.0.0.1:1/")
		w.WriteHeader(302)
	})
	check("upstream", h.raw(post("/v1/messages", anthropicBody)), "moat: upstream_redirect: ")
	h.fp.setRespond(nil)
	// A journal failure whose text says "refused:" (as audit's do) ends the
	// run; the refusals after it name the fatal event by its code.
	h.j.setFail(errors.New("audit: refused: the journal is full"))
	check("audit failure", h.raw(post("/v1/messages", anthropicBody)), "moat: audit_failure: ")
	h.j.setFail(nil)
	check("run failed", h.raw(post("/v1/messages", anthropicBody)), "moat: refused: ")
	for _, typ := range []string{audit.TypeInferenceRefused, audit.TypeInferenceFailed} {
		for _, rec := range h.records(typ) {
			d := rec["detail"].(string)
			want := "moat: refused: "
			if typ == audit.TypeInferenceFailed {
				want = "moat: " + rec["reason"].(string) + ": "
			}
			if !prefixOnce(d, want) {
				t.Errorf("%s detail %q, want the prefix %q once", typ, d, want)
			}
		}
	}
	n := 0
	for _, l := range parseLogLines(t, buf.String()) {
		if d, _ := l.m["detail"].(string); d != "" && l.m["msg"] != "moat.broker fatal" {
			n++
			if strings.Count(d, "moat: ") != 1 || strings.Count(d, "refused: ") > 1 {
				t.Errorf("log detail %q: prefix not once", d)
			}
		}
	}
	if n < 8 {
		t.Errorf("%d log lines with a detail, want at least 8", n)
	}
	// A wire refusal printed as an error says it once too (it used to be
	// wrapped as "moat: refused: moat: refused: …").
	_, rf := wire.Admit(wire.APIAnthropicMessages, "/v1/messages", []byte(`{"model":"x","max_tokens":1,"messages":[]}`), wire.Limits{Models: []string{"y"}, MaxOutputTokens: 1})
	if rf == nil {
		t.Fatal("admitted")
	}
	for _, s := range []string{rf.Error(), (&frontError{Code: rf.Code, Msg: rf.Message}).Error()} {
		if !prefixOnce(s, "moat: refused: ") {
			t.Errorf("error text %q, want the prefix once", s)
		}
	}
}

// TestCompletionSyncedAfterRelease: a non-streamed answer is released
// while its completion record syncs; the record is written (in its place)
// before the answer leaves, and a sync that fails after the release ends
// the run like any journal failure. Control: the same request with a
// working sync completes and the run goes on.
func TestCompletionSyncedAfterRelease(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			body := anthropicBody
			if stream {
				body = strings.Replace(anthropicBody, `{"model"`, `{"stream":true,"model"`, 1)
			}
			h := newHarness(t, 10)
			r := h.raw(post("/v1/messages", body))
			if r.status != 200 {
				t.Fatalf("control: status %d %s", r.status, r.body)
			}
			id := r.header.Get("Moat-Request-Id")
			if recs := h.records(audit.TypeInferenceCompleted); len(recs) != 1 || recs[0]["request_id"] != id {
				t.Fatalf("completion records %v when the answer arrived, want the request's", recs)
			}
			if got := h.j.asyncTypes(); !slices.Equal(got, []string{audit.TypeInferenceCompleted}) {
				t.Errorf("records written before their sync: %v, want only %s", got, audit.TypeInferenceCompleted)
			}
			select {
			case f := <-h.fatal:
				t.Fatalf("control: fatal %s", f)
			default:
			}
			// The answer arrives while its record's sync is still held.
			hold := make(chan struct{})
			h.j.setHoldWait(hold)
			got := make(chan result, 1)
			go func() { got <- h.raw(post("/v1/messages", body)) }()
			select {
			case r := <-got:
				if r.status != 200 {
					t.Fatalf("held sync: status %d", r.status)
				}
			case <-time.After(10 * time.Second):
				close(hold) // let the handler end
				t.Fatal("the answer waited for its completion record's sync")
			}
			close(hold)
			h.j.setHoldWait(nil)
			h.j.setFailWait(errors.New("fsync: input/output error"))
			r = h.raw(post("/v1/messages", body))
			if r.status != 200 {
				t.Fatalf("answer before the failed sync: status %d, want 200 (released before the sync)", r.status)
			}
			expectFatal(t, h, ReasonAuditFailure)
			h.j.setFailWait(nil)
			before := h.fp.count()
			if r := h.raw(post("/v1/messages", anthropicBody)); r.status != 503 || Reason(r.header.Get("Moat-Reason")) != ReasonRunFailed {
				t.Errorf("after the failed sync: %d %s, want 503 %s", r.status, r.header.Get("Moat-Reason"), ReasonRunFailed)
			}
			if h.fp.count() != before {
				t.Error("a request left after the failed sync")
			}
		})
	}
}

// TestCrashBeforeCompletionSync: what a crash between the release of an
// answer and the sync of its completion record leaves: the durable
// pre-effect record, then none, part or all of the completion line (or
// the zeros a file system may expose). Every such journal verifies as
// incomplete (never invalid), with the pre-effect record among its valid
// records.
func TestCrashBeforeCompletionSync(t *testing.T) {
	h := newHarness(t, 10)
	h.mustSucceed()
	b, err := os.ReadFile(h.j.w.JournalPath())
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.SplitAfter(b, []byte("\n"))
	last := lines[len(lines)-2] // the completion line, LF included; the last element is empty
	if !bytes.Contains(last, []byte("inference.completed")) && payloadOf(t, bytes.TrimSuffix(last, []byte("\n")))["type"] != audit.TypeInferenceCompleted {
		t.Fatalf("the last line is not the completion record")
	}
	durable := b[:len(b)-len(last)]
	pub := h.j.w.PublicKey()
	var cuts [][]byte
	for n := 0; n < len(last); n += max(1, len(last)/64) {
		cuts = append(cuts, append(append([]byte(nil), durable...), last[:n]...))
	}
	cuts = append(cuts, append(append([]byte(nil), durable...), make([]byte, len(last)-1)...)) // zeros
	for _, j := range cuts {
		res := audit.Verify(j, pub)
		if res.Status != audit.Incomplete {
			t.Fatalf("journal cut at %d bytes: %v (%s), want incomplete", len(j), res.Status, res.Reason)
		}
	}
	// Control: the whole journal, terminated, is complete.
	h.j.verifyAll(t)
}

// TestBugNeverUnderClientCode: a decision whose message says BUG (moat's
// own fault) is made with ReasonInternal, never under a code that blames
// the client (invalid_json, invalid_value, …), in broker/ and broker/wire.
// The checker's negative control is a refusal that does blame the client.
func TestBugNeverUnderClientCode(t *testing.T) {
	bad := `package p
func f() { refuse(ReasonInvalidJSON, "", "BUG: re-encoding: %v", err) }`
	good := `package p
func f() { refuse(ReasonInternal, "", "BUG: re-encoding: %v", err); x.failRequest(y, wire.ReasonInternal, 500, "BUG: "+s) }`
	if n, errs := bugDecisions(t, "bad.go", bad); n != 1 || len(errs) != 1 {
		t.Fatalf("negative control: %d decisions, %v; want 1 found and refused", n, errs)
	}
	if n, errs := bugDecisions(t, "good.go", good); n != 2 || len(errs) != 0 {
		t.Fatalf("positive control: %d decisions, %v; want 2 found, none refused", n, errs)
	}
	// The source is found beside this file, not from the working
	// directory: scripts/test runs the test binary again elsewhere as an
	// unprivileged uid.
	_, self, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("runtime.Caller: no file for this test")
	}
	total := 0
	for _, dir := range []string{".", "wire"} {
		files, _ := filepath.Glob(filepath.Join(filepath.Dir(self), dir, "*.go"))
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			n, errs := bugDecisions(t, f, string(src))
			total += n
			for _, e := range errs {
				t.Error(e)
			}
		}
	}
	if total < 5 {
		t.Errorf("found %d BUG decisions in broker and broker/wire, want at least 5 (is the checker still looking?)", total)
	}
}

// decisionFuncs make a refusal or failure with a reason code.
var decisionFuncs = []string{"refuse", "failRequest", "failStream", "abortStream", "answerFailure", "writeError"}

// bugDecisions finds the calls of decisionFuncs whose arguments hold a
// string literal starting with "BUG" and reports those without
// ReasonInternal among their arguments.
func bugDecisions(t *testing.T, name, src string) (n int, errs []string) {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, name, src, 0)
	if err != nil {
		t.Fatal(err)
	}
	ast.Inspect(f, func(node ast.Node) bool {
		call, ok := node.(*ast.CallExpr)
		if !ok {
			return true
		}
		var fn string
		switch e := call.Fun.(type) {
		case *ast.Ident:
			fn = e.Name
		case *ast.SelectorExpr:
			fn = e.Sel.Name
		}
		if !slices.Contains(decisionFuncs, fn) {
			return true
		}
		bug, internal := false, false
		for _, a := range call.Args {
			ast.Inspect(a, func(m ast.Node) bool {
				switch m := m.(type) {
				case *ast.BasicLit:
					if s, err := strconv.Unquote(m.Value); err == nil && strings.HasPrefix(s, "BUG") {
						bug = true
					}
				case *ast.Ident:
					internal = internal || m.Name == "ReasonInternal"
				}
				return true
			})
		}
		if bug {
			n++
			if !internal {
				errs = append(errs, fmt.Sprintf("%s: %s(…) reports a BUG under a client's code", fset.Position(call.Pos()), fn))
			}
		}
		return true
	})
	return n, errs
}

// TestNextRequestNotHeldByCompletionSync: the connection is read again as
// soon as an answer is released, not once its completion record is
// durable. Two requests on one kept connection are both answered while
// the first's completion sync is held, and Close waits for the held wait.
// Control: the same two requests with nothing held.
func TestNextRequestNotHeldByCompletionSync(t *testing.T) {
	for _, held := range []bool{false, true} {
		t.Run(fmt.Sprintf("held=%v", held), func(t *testing.T) {
			h := newHarness(t, 10)
			hold := make(chan struct{})
			if held {
				h.j.setHoldWait(hold)
			}
			c, err := h.send(post("/v1/messages", anthropicBody))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			br := bufio.NewReader(c)
			if r := readResult(t, br, c); r.status != 200 || r.closed {
				t.Fatalf("first: status %d closed %v", r.status, r.closed)
			}
			h.j.setHoldWait(nil)
			if _, err := io.WriteString(c, post("/v1/messages", anthropicBody)); err != nil {
				t.Fatal(err)
			}
			got := make(chan *http.Response, 1)
			go func() {
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					resp = nil
				}
				got <- resp
			}()
			select {
			case resp := <-got:
				if resp == nil || resp.StatusCode != 200 {
					t.Fatalf("second: %v", resp)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			case <-time.After(10 * time.Second):
				close(hold)
				t.Fatal("the second request on the connection waited for the first's completion sync")
			}
			if n := len(h.records(audit.TypeInferenceCompleted)); n != 2 {
				t.Fatalf("%d completion records, want 2", n)
			}
			closed := make(chan struct{})
			go func() { h.b.Close(); close(closed) }()
			if held {
				select {
				case <-closed:
					t.Fatal("Close returned while a completion record's wait was held")
				case <-time.After(100 * time.Millisecond):
				}
			}
			close(hold)
			select {
			case <-closed:
			case <-time.After(10 * time.Second):
				t.Fatal("Close did not return once the wait was released")
			}
			select {
			case f := <-h.fatal:
				t.Fatalf("fatal %s", f)
			default:
			}
		})
	}
}
