package broker

import (
	"bufio"
	"compress/gzip"
	"compress/zlib"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/audit"
)

// TestRedirectNotFollowed: a 3xx fails the request, and the redirect target
// observes nothing.
func TestRedirectNotFollowed(t *testing.T) {
	var hits int
	var mu sync.Mutex
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hits++
		mu.Unlock()
	}))
	defer target.Close()
	h := newHarness(t, 20)
	for _, code := range []int{301, 302, 303, 307, 308} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			h.fp.setRespond(func(w http.ResponseWriter, r *http.Request, body []byte) {
				http.Redirect(w, r, target.URL+"/v1/messages", code)
			})
			r := h.raw(post("/v1/messages", anthropicBody))
			if r.status != 502 || !strings.Contains(r.body, string(ReasonUpstreamRedirect)) {
				t.Errorf("status %d body %s, want 502 %s", r.status, r.body, ReasonUpstreamRedirect)
			}
			if rec := h.lastRecord(); rec["type"] != audit.TypeInferenceFailed || rec["reason"] != string(ReasonUpstreamRedirect) {
				t.Errorf("last record %v/%v, want inference.failed/%s", rec["type"], rec["reason"], ReasonUpstreamRedirect)
			}
			mu.Lock()
			if hits != 0 {
				t.Errorf("redirect target saw %d requests, want 0", hits)
			}
			mu.Unlock()
			h.fp.setRespond(nil)
			h.mustSucceed()
		})
	}
}

// TestUpstreamEncoding: gzip and deflate are decoded for the worker, other
// codings are withheld (not fatal).
func TestUpstreamEncoding(t *testing.T) {
	h := newHarness(t, 20)
	msg := `{"id":"m","type":"message","usage":{"input_tokens":1,"output_tokens":2}}`
	for _, enc := range []string{"gzip", "deflate"} {
		t.Run(enc, func(t *testing.T) {
			h.fp.setRespond(func(w http.ResponseWriter, r *http.Request, body []byte) {
				w.Header().Set("Content-Type", "application/json")
				w.Header().Set("Content-Encoding", enc)
				compress(w, enc, msg)
			})
			r := h.raw(post("/v1/messages", anthropicBody))
			if r.status != 200 || r.body != msg {
				t.Errorf("status %d body %q, want 200 and the decoded body", r.status, r.body)
			}
		})
	}
	t.Run("br", func(t *testing.T) {
		h.fp.setRespond(func(w http.ResponseWriter, r *http.Request, body []byte) {
			w.Header().Set("Content-Encoding", "br")
			io.WriteString(w, "\x0b\x02\x80")
		})
		r := h.raw(post("/v1/messages", anthropicBody))
		if r.status != 502 || !strings.Contains(r.body, string(ReasonUpstreamEncoding)) {
			t.Errorf("status %d body %s, want 502 %s", r.status, r.body, ReasonUpstreamEncoding)
		}
		h.fp.setRespond(nil)
		h.mustSucceed()
	})
}

func compress(w io.Writer, enc, s string) {
	var zw io.WriteCloser
	if enc == "gzip" {
		zw = gzip.NewWriter(w)
	} else {
		zw = zlib.NewWriter(w)
	}
	io.WriteString(zw, s)
	zw.Close()
}

// TestCompletedRecord: status, sha256, size and usage of a plain and a
// streamed response.
func TestCompletedRecord(t *testing.T) {
	h := newHarness(t, 10)
	r := h.raw(post("/v1/messages", anthropicBody))
	if r.status != 200 {
		t.Fatalf("status %d", r.status)
	}
	rec := h.lastRecord()
	if rec["type"] != audit.TypeInferenceCompleted || rec["status"] != 200.0 || rec["response_bytes"] != float64(len(r.body)) {
		t.Errorf("record %v, want inference.completed status 200 bytes %d", rec, len(r.body))
	}
	if u := rec["usage"].(map[string]any); u["input_tokens"] != 3.0 || u["output_tokens"] != 5.0 {
		t.Errorf("usage %v, want 3/5", u)
	}
	r = h.raw(post("/v1/chat/completions", chatBody, "Authorization: Bearer moat-placeholder"))
	if u := h.lastRecord()["usage"].(map[string]any); r.status != 200 || u["input_tokens"] != 4.0 || u["output_tokens"] != 6.0 {
		t.Errorf("chat: status %d usage %v, want 200 and 4/6", r.status, u)
	}
	body := strings.Replace(anthropicBody, `{"model"`, `{"stream":true,"model"`, 1)
	r = h.raw(post("/v1/messages", body))
	rec = h.lastRecord()
	if u := rec["usage"].(map[string]any); r.status != 200 || u["input_tokens"] != 11.0 || u["output_tokens"] != 12.0 {
		t.Errorf("stream: status %d usage %v, want 200 and 11/12", r.status, u)
	}
	if want := strings.Join(anthropicStream("claude-test"), ""); r.body != want {
		t.Errorf("stream body %q, want %q", r.body, want)
	}
}

// TestStreamPassThrough: the first SSE event reaches the worker while the
// provider is still holding the rest.
func TestStreamPassThrough(t *testing.T) {
	h := newHarness(t, 10)
	release := make(chan struct{})
	h.fp.setRespond(func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		evs := anthropicStream("claude-test")
		io.WriteString(w, evs[0])
		w.(http.Flusher).Flush()
		<-release
		for _, e := range evs[1:] {
			io.WriteString(w, e)
		}
	})
	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	body := strings.Replace(anthropicBody, `{"model"`, `{"stream":true,"model"`, 1)
	io.WriteString(c, post("/v1/messages", body))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	first := make([]byte, len(anthropicStream("claude-test")[0]))
	if _, err := io.ReadFull(resp.Body, first); err != nil {
		t.Fatalf("first event did not arrive while the provider held the rest: %v", err)
	}
	close(release)
	rest, _ := io.ReadAll(resp.Body)
	if got, want := string(first)+string(rest), strings.Join(anthropicStream("claude-test"), ""); got != want {
		t.Errorf("stream %q, want %q", got, want)
	}
}

// TestReflection: a response carrying the credential, in any of the forms
// the guard covers, is withheld: the worker gets an error and never the
// credential, OnFatal fires, inference.failed is journaled and no further
// request reaches the provider. A near miss passes in the same setup.
func TestReflection(t *testing.T) {
	esc := func(s string) string { // every byte as \u00XX
		var b strings.Builder
		for i := 0; i < len(s); i++ {
			fmt.Fprintf(&b, `\u%04X`, s[i])
		}
		return b.String()
	}
	slashCred := "sk-test/REAL/cred-0123456789"
	sse := func(parts ...string) func(w http.ResponseWriter, r *http.Request, body []byte) {
		return func(w http.ResponseWriter, r *http.Request, body []byte) {
			w.Header().Set("Content-Type", "text/event-stream")
			for _, p := range parts {
				io.WriteString(w, p)
				w.(http.Flusher).Flush()
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
	plain := func(s string) func(w http.ResponseWriter, r *http.Request, body []byte) {
		return func(w http.ResponseWriter, r *http.Request, body []byte) {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, s)
		}
	}
	tests := []struct {
		name    string
		cred    string
		respond func(cred string) func(w http.ResponseWriter, r *http.Request, body []byte)
	}{
		{"raw in body", testCred, func(c string) func(http.ResponseWriter, *http.Request, []byte) {
			return plain(`{"error":{"message":"bad key ` + c + `"}}`)
		}},
		{"unicode-escaped", testCred, func(c string) func(http.ResponseWriter, *http.Request, []byte) {
			return plain(`{"text":"` + esc(c) + `"}`)
		}},
		{"slash-escaped", slashCred, func(c string) func(http.ResponseWriter, *http.Request, []byte) {
			return plain(`{"text":"` + strings.ReplaceAll(c, "/", `\/`) + `"}`)
		}},
		{"double-escaped", testCred, func(c string) func(http.ResponseWriter, *http.Request, []byte) {
			return plain(`{"args":"{\"k\":\"` + strings.ReplaceAll(esc(c), `\`, `\\`) + `\"}"}`)
		}},
		{"in a header", testCred, func(c string) func(http.ResponseWriter, *http.Request, []byte) {
			return func(w http.ResponseWriter, r *http.Request, body []byte) {
				w.Header().Set("X-Debug", "key="+c)
				io.WriteString(w, `{}`)
			}
		}},
		{"gzip body", testCred, func(c string) func(http.ResponseWriter, *http.Request, []byte) {
			return func(w http.ResponseWriter, r *http.Request, body []byte) {
				w.Header().Set("Content-Encoding", "gzip")
				compress(w, "gzip", `{"text":"`+c+`"}`)
			}
		}},
		{"split across SSE chunks", testCred, func(c string) func(http.ResponseWriter, *http.Request, []byte) {
			return sse("event: message_start\ndata: {}\n\n", "data: {\"text\":\""+c[:10], c[10:20], c[20:]+"\"}\n\n")
		}},
		{"escaped and split in SSE", testCred, func(c string) func(http.ResponseWriter, *http.Request, []byte) {
			e := esc(c)
			return sse("data: {\"text\":\""+e[:13], e[13:77], e[77:]+"\"}\n\n")
		}},
		{"gzip SSE", testCred, func(c string) func(http.ResponseWriter, *http.Request, []byte) {
			return func(w http.ResponseWriter, r *http.Request, body []byte) {
				w.Header().Set("Content-Type", "text/event-stream")
				w.Header().Set("Content-Encoding", "gzip")
				zw := gzip.NewWriter(w)
				io.WriteString(zw, "data: {\"text\":\""+c[:5])
				zw.Flush()
				w.(http.Flusher).Flush()
				io.WriteString(zw, c[5:]+"\"}\n\n")
				zw.Close()
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, 10, func(c *Config) { c.Credentials["anthropic"] = tc.cred })
			miss := tc.cred[:len(tc.cred)-1] + string(tc.cred[len(tc.cred)-1]^1)
			h.fp.setRespond(tc.respond(miss))
			if r := h.raw(post("/v1/messages", anthropicBody)); r.status != 200 || strings.Contains(r.body, "moat:") {
				t.Fatalf("near miss: status %d body %q, want it passed through", r.status, r.body)
			}
			h.fp.setRespond(tc.respond(tc.cred))
			got := h.rawAll(post("/v1/messages", anthropicBody))
			if strings.Contains(got, tc.cred) || strings.Contains(got, esc(tc.cred)) {
				t.Errorf("the worker received the credential: %q", got)
			}
			if !strings.Contains(got, string(ReasonCredentialReflect)) {
				t.Errorf("worker got %q, want an error naming %s", got, ReasonCredentialReflect)
			}
			expectFatal(t, h, ReasonCredentialReflect)
			if rec := h.records(audit.TypeInferenceFailed); len(rec) != 1 || rec[0]["reason"] != string(ReasonCredentialReflect) {
				t.Errorf("inference.failed records %v, want one with reason %s", rec, ReasonCredentialReflect)
			}
			for _, l := range h.j.lines() {
				if strings.Contains(string(l), tc.cred) {
					t.Errorf("the journal holds the credential")
				}
			}
			n := h.fp.count()
			h.fp.setRespond(nil)
			if r := h.raw(post("/v1/messages", anthropicBody)); r.status != 503 {
				t.Errorf("request after the reflection: status %d, want 503", r.status)
			}
			if h.fp.count() != n {
				t.Errorf("a request reached the provider after the reflection")
			}
		})
	}
}

// rawAll sends raw and returns everything the broker wrote until it closed.
func (h *harness) rawAll(in string) string {
	h.t.Helper()
	c, _ := h.send(in) // a write cut short still shows what the broker wrote
	defer c.Close()
	b, _ := io.ReadAll(c)
	return string(b)
}

// TestProviderErrorPassesThrough: a provider's own error answer reaches the
// worker with its status and retry headers, and is journaled as completed.
func TestProviderErrorPassesThrough(t *testing.T) {
	h := newHarness(t, 10)
	h.fp.setRespond(func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Retry-After", "7")
		w.Header().Set("Set-Cookie", "tracking=1")
		w.WriteHeader(429)
		io.WriteString(w, `{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}`)
	})
	r := h.raw(post("/v1/messages", anthropicBody))
	if r.status != 429 || r.header.Get("Retry-After") != "7" || !strings.Contains(r.body, "slow down") {
		t.Errorf("status %d headers %v body %s, want the provider's 429", r.status, r.header, r.body)
	}
	if r.header.Get("Set-Cookie") != "" {
		t.Errorf("a provider header outside the list reached the worker")
	}
	if rec := h.lastRecord(); rec["type"] != audit.TypeInferenceCompleted || rec["status"] != 429.0 {
		t.Errorf("record %v/%v, want inference.completed with status 429", rec["type"], rec["status"])
	}
}

// TestStreamClientGone: a worker that leaves mid-stream is journaled as
// client_closed, and the broker keeps serving.
func TestStreamClientGone(t *testing.T) {
	h := newHarness(t, 10)
	gone := make(chan struct{})
	h.fp.setRespond(func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {}\n\n")
		w.(http.Flusher).Flush()
		<-gone
		for i := 0; i < 200; i++ { // keep writing until the broker stops reading
			if _, err := io.WriteString(w, "data: {\"x\":1}\n\n"); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			time.Sleep(5 * time.Millisecond)
		}
	})
	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	body := strings.Replace(anthropicBody, `{"model"`, `{"stream":true,"model"`, 1)
	io.WriteString(c, post("/v1/messages", body))
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	bufio.NewReader(c).ReadString('}')
	c.Close()
	close(gone)
	deadline := time.Now().Add(10 * time.Second)
	for len(h.records(audit.TypeInferenceFailed)) == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if rec := h.records(audit.TypeInferenceFailed); len(rec) != 1 || rec[0]["reason"] != string(ReasonClientClosed) {
		t.Errorf("inference.failed records %v, want one with reason %s", rec, ReasonClientClosed)
	}
	h.fp.setRespond(nil)
	h.mustSucceed()
}
