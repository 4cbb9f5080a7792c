package broker

import (
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/audit"
)

// echo is one provider response that carries a key in some shape.
type echo struct {
	sse    bool
	header [][2]string
	ce     string   // declared Content-Encoding: "", "gzip", "gzip, gzip", "deflate"
	nested int      // undeclared gzip layers around the body
	parts  []string // the body, flushed between parts
	raw    string   // when set, written as is on the hijacked connection
}

func (e echo) body() string { return strings.Join(e.parts, "") }

func (e echo) respond(w http.ResponseWriter, r *http.Request, _ []byte) {
	if e.raw != "" {
		c, bw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		bw.WriteString(e.raw)
		bw.Flush()
		c.Close()
		return
	}
	ct := "application/json"
	if e.sse {
		ct = "text/event-stream"
	}
	w.Header().Set("Content-Type", ct)
	for _, h := range e.header {
		w.Header().Add(h[0], h[1])
	}
	parts := e.parts
	if e.nested > 0 {
		b := []byte(e.body())
		for i := 0; i < e.nested; i++ {
			b = gz(b)
		}
		parts = []string{string(b)}
	}
	var out io.Writer = w
	var closers []io.Closer
	var flushers []interface{ Flush() error }
	if e.ce != "" {
		w.Header().Set("Content-Encoding", e.ce)
		for _, c := range strings.Split(e.ce, ",") {
			var zw interface {
				io.WriteCloser
				Flush() error
			}
			if strings.TrimSpace(c) == "deflate" {
				zw = zlib.NewWriter(out)
			} else {
				zw = gzip.NewWriter(out)
			}
			out = zw
			closers = append([]io.Closer{zw}, closers...)
			flushers = append([]interface{ Flush() error }{zw}, flushers...)
		}
	}
	for _, p := range parts {
		io.WriteString(out, p)
		for _, f := range flushers {
			f.Flush()
		}
		w.(http.Flusher).Flush()
		if e.sse {
			time.Sleep(2 * time.Millisecond)
		}
	}
	for _, c := range closers {
		c.Close()
	}
}

func gz(b []byte) []byte {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write(b)
	zw.Close()
	return buf.Bytes()
}

// Transformations of the key.

// escU writes every byte as \u00xx: one level of JSON escapes.
func escU(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		fmt.Fprintf(&b, `\u%04x`, s[i])
	}
	return b.String()
}

// nestU applies escU n times.
func nestU(s string, n int) string {
	for i := 0; i < n; i++ {
		s = escU(s)
	}
	return s
}

func jstr(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func pctAll(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		fmt.Fprintf(&b, "%%%02X", s[i])
	}
	return b.String()
}

func split(s string, n int) []string {
	var out []string
	for i := 0; i < n; i++ {
		out = append(out, s[i*len(s)/n:(i+1)*len(s)/n])
	}
	return out
}

// Response builders. lit is a JSON string literal, written as is.

func msgLits(lits ...string) string {
	var blocks []string
	for _, l := range lits {
		blocks = append(blocks, `{"type":"text","text":`+l+`}`)
	}
	return `{"id":"msg_1","type":"message","role":"assistant","model":"claude-test","content":[` + strings.Join(blocks, ",") +
		`],"stop_reason":"end_turn","usage":{"input_tokens":3,"output_tokens":5}}`
}

func msg(texts ...string) string {
	var lits []string
	for _, t := range texts {
		lits = append(lits, jstr(t))
	}
	return msgLits(lits...)
}

// aDelta is an Anthropic content_block_delta event.
func aDelta(index int, text string) string {
	return fmt.Sprintf("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":%d,\"delta\":{\"type\":\"text_delta\",\"text\":%s}}\n\n", index, jstr(text))
}

func aJSONDelta(index int, partial string) string {
	return fmt.Sprintf("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":%d,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":%s}}\n\n", index, jstr(partial))
}

const aStart = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-test\",\"content\":[],\"usage\":{\"input_tokens\":1,\"output_tokens\":1}}}\n\n"
const aStop = "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"

func aStream(pieces ...string) []string {
	out := []string{aStart}
	for _, p := range pieces {
		out = append(out, aDelta(0, p))
	}
	return append(out, aStop)
}

func chatChunk(delta string) string {
	return `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-test","choices":[{"index":0,"delta":` + delta + `,"finish_reason":null}]}` + "\n\n"
}

func respEvent(typ string, outIdx int, delta string) string {
	return fmt.Sprintf("event: %s\ndata: {\"type\":%q,\"item_id\":\"msg_1\",\"output_index\":%d,\"content_index\":0,\"delta\":%s}\n\n", typ, typ, outIdx, jstr(delta))
}

type control int

const (
	passes       control = iota // the near miss reaches the worker unchanged
	refusedCoded                // the near miss is withheld as upstream_encoding, not fatal
	upstreamFail                // the near miss is an upstream_error, not fatal
)

type shape struct {
	name  string
	ctl   control
	build func(k string) echo
}

func b64(prefix, k string, enc *base64.Encoding) string {
	return enc.EncodeToString([]byte(prefix + k))
}

// reflectionShapes are the echo shapes of the table test: every split
// boundary (SSE events, content blocks, headers), nested escapes,
// compression, each encoding and case.
func reflectionShapes() []shape {
	plain := func(f func(k string) string) func(string) echo {
		return func(k string) echo { return echo{parts: []string{f(k)}} }
	}
	stream := func(f func(k string) []string) func(string) echo {
		return func(k string) echo { return echo{sse: true, parts: f(k)} }
	}
	hdr := func(f func(k string) [][2]string) func(string) echo {
		return func(k string) echo { return echo{header: f(k), parts: []string{msg("fine")}} }
	}
	return []shape{
		// Plain bodies.
		{"raw in body", passes, plain(func(k string) string { return msg("key " + k) })},
		{"upper case", passes, plain(func(k string) string { return msg(strings.ToUpper(k)) })},
		{"mixed case", passes, plain(func(k string) string { return msg(strings.ToUpper(k[:9]) + strings.ToLower(k[9:])) })},
		{"escape depth 1", passes, plain(func(k string) string { return msgLits(`"` + escU(k) + `"`) })},
		{"escape depth 2", passes, plain(func(k string) string { return msgLits(`"` + nestU(k, 2) + `"`) })},
		{"escape depth 3", passes, plain(func(k string) string { return msgLits(`"` + nestU(k, 3) + `"`) })},
		{"escape depth 4", passes, plain(func(k string) string { return msgLits(`"` + nestU(k, 4) + `"`) })},
		{"escape depth 3 upper hex digits", passes, plain(func(k string) string {
			return msgLits(`"` + strings.ReplaceAll(strings.ToUpper(nestU(k, 3)), `\U`, `\u`) + `"`)
		})},
		{"two content blocks", passes, plain(func(k string) string { return msg(k[:13], k[13:]) })},
		{"three content blocks", passes, plain(func(k string) string { return msg(split(k, 3)...) })},
		{"base64 aligned", passes, plain(func(k string) string { return msg(b64("", k, base64.StdEncoding)) })},
		{"base64 offset 1", passes, plain(func(k string) string { return msg(b64("x", k, base64.StdEncoding)) })},
		{"base64 offset 2", passes, plain(func(k string) string { return msg(b64("xy", k, base64.StdEncoding)) })},
		{"base64url aligned", passes, plain(func(k string) string { return msg(b64("", k, base64.RawURLEncoding)) })},
		{"base64url offset 1", passes, plain(func(k string) string { return msg(b64("?", k, base64.RawURLEncoding)) })},
		{"base64url offset 2", passes, plain(func(k string) string { return msg(b64("??", k, base64.RawURLEncoding)) })},
		{"base64 of upper case", passes, plain(func(k string) string { return msg(b64("", strings.ToUpper(k), base64.StdEncoding)) })},
		{"base64 escaped", passes, plain(func(k string) string { return msgLits(`"` + escU(b64("a", k, base64.StdEncoding)) + `"`) })},
		{"hex lower", passes, plain(func(k string) string { return msg(hex.EncodeToString([]byte(k))) })},
		{"hex upper", passes, plain(func(k string) string { return msg(strings.ToUpper(hex.EncodeToString([]byte(k)))) })},
		{"hex odd offset", passes, plain(func(k string) string { return msg("a" + hex.EncodeToString([]byte(k))) })},
		{"percent every byte", passes, plain(func(k string) string { return msg(pctAll(k)) })},
		{"percent lower hex", passes, plain(func(k string) string { return msg(strings.ToLower(pctAll(k))) })},
		{"percent some bytes", passes, plain(func(k string) string { return msg(strings.ReplaceAll(k, "-", "%2D")) })},
		{"not JSON", passes, plain(func(k string) string { return "plain text " + k })},
		// Compression.
		{"gzip declared", passes, func(k string) echo { return echo{ce: "gzip", parts: []string{msg(k)}} }},
		{"deflate declared", passes, func(k string) echo { return echo{ce: "deflate", parts: []string{msg(k)}} }},
		{"gzip twice declared", passes, func(k string) echo { return echo{ce: "gzip, gzip", parts: []string{msg(k)}} }},
		{"undeclared gzip", refusedCoded, func(k string) echo { return echo{nested: 1, parts: []string{msg(k)}} }},
		{"double gzip", refusedCoded, func(k string) echo { return echo{ce: "gzip", nested: 1, parts: []string{msg(k)}} }},
		{"gzip depth 4", refusedCoded, func(k string) echo { return echo{ce: "gzip, gzip", nested: 2, parts: []string{msg(k)}} }},
		{"nested gzip in a stream", refusedCoded, func(k string) echo { return echo{sse: true, ce: "gzip", nested: 1, parts: aStream(split(k, 2)...)} }},
		// Headers.
		{"one header", passes, hdr(func(k string) [][2]string { return [][2]string{{"X-Debug", "key=" + k}} })},
		{"two headers", passes, hdr(func(k string) [][2]string { return [][2]string{{"X-A", k[:10]}, {"X-B", k[10:]}} })},
		{"two returned headers reversed", passes, hdr(func(k string) [][2]string {
			return [][2]string{{"Request-Id", k[15:]}, {"X-Request-Id", k[:15]}}
		})},
		{"header base64", passes, hdr(func(k string) [][2]string { return [][2]string{{"X-Trace", b64("z", k, base64.URLEncoding)}} })},
		{"header upper case", passes, hdr(func(k string) [][2]string { return [][2]string{{"Request-Id", strings.ToUpper(k)}} })},
		{"header escaped", passes, hdr(func(k string) [][2]string { return [][2]string{{"Request-Id", nestU(k, 2)}} })},
		{"status line", passes, func(k string) echo {
			return echo{raw: "HTTP/1.1 200 " + k + "\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"}
		}},
		// Upstream errors quoting provider bytes.
		{"error text, escaped", upstreamFail, func(k string) echo { return echo{raw: "HTTP/1.1 " + escU(k) + " OK\r\n\r\n"} }},
		{"error text, raw header line", upstreamFail, func(k string) echo { return echo{raw: "HTTP/1.1 200 OK\r\n" + k + "\r\n\r\n"} }},
		// Streams.
		{"SSE two text deltas", passes, stream(func(k string) []string { return aStream(k[:11], k[11:]) })},
		{"SSE every byte a delta", passes, stream(func(k string) []string { return aStream(split(k, len(k))...) })},
		{"SSE two content blocks", passes, stream(func(k string) []string {
			return []string{aStart, aDelta(0, "a "+k[:17]), aDelta(1, k[17:]+" b"), aStop}
		})},
		{"SSE interleaved blocks", passes, stream(func(k string) []string {
			return []string{aStart, aDelta(0, k[:9]), aDelta(1, "unrelated"), aDelta(0, k[9:]), aStop}
		})},
		{"SSE tool input json escaped", passes, stream(func(k string) []string {
			a := `{"q":"` + escU(k) + `"}`
			return []string{aStart, aJSONDelta(0, a[:40]), aJSONDelta(0, a[40:120]), aJSONDelta(0, a[120:]), aStop}
		})},
		{"SSE escape depth 3 split", passes, stream(func(k string) []string { return aStream(split(nestU(k, 2), 3)...) })},
		{"SSE upper case split", passes, stream(func(k string) []string { return aStream(split(strings.ToUpper(k), 2)...) })},
		{"SSE base64 split", passes, stream(func(k string) []string { return aStream(split(b64("", k, base64.StdEncoding), 3)...) })},
		{"SSE hex split", passes, stream(func(k string) []string { return aStream(split(hex.EncodeToString([]byte(k)), 4)...) })},
		{"SSE percent split", passes, stream(func(k string) []string { return aStream(split(pctAll(k), 5)...) })},
		{"SSE event split across reads", passes, stream(func(k string) []string {
			s := strings.Join(aStream(k), "")
			return split(s, 7)
		})},
		{"SSE gzip declared split", passes, func(k string) echo { return echo{sse: true, ce: "gzip", parts: aStream(split(k, 3)...)} }},
		{"SSE comment line", passes, stream(func(k string) []string { return []string{": " + k[:20], k[20:] + "\n\n", aStop} })},
		{"SSE not JSON data", passes, stream(func(k string) []string { return []string{"data: " + k[:8] + "\n\n", "data: " + k[8:] + "\n\n"} })},
		{"chat content split", passes, stream(func(k string) []string {
			return []string{chatChunk(`{"content":` + jstr(k[:12]) + `}`), chatChunk(`{"content":` + jstr(k[12:]) + `}`), "data: [DONE]\n\n"}
		})},
		{"chat tool arguments split", passes, stream(func(k string) []string {
			tc := func(i int, a string) string {
				return `{"tool_calls":[{"index":` + fmt.Sprint(i) + `,"function":{"arguments":` + jstr(a) + `}}]}`
			}
			return []string{chatChunk(tc(1, `{"k":"`+k[:14])), chatChunk(tc(0, "{}")), chatChunk(tc(1, k[14:]+`"}`)), "data: [DONE]\n\n"}
		})},
		{"responses text delta split", passes, stream(func(k string) []string {
			return []string{respEvent("response.output_text.delta", 0, k[:5]), respEvent("response.output_text.delta", 0, k[5:])}
		})},
		{"responses arguments interleaved", passes, stream(func(k string) []string {
			return []string{respEvent("response.function_call_arguments.delta", 1, k[:20]),
				respEvent("response.output_text.delta", 0, "other"),
				respEvent("response.function_call_arguments.delta", 1, k[20:])}
		})},
	}
}

// TestReflectionShapes: for each shape, a near miss (the key with its last
// byte changed) passes through unchanged (or, for compressed layers and
// broken responses, is refused without cancelling the run), and the key
// itself cancels the run before the worker can rebuild it from anything
// it received.
func TestReflectionShapes(t *testing.T) {
	shapes := reflectionShapes()
	if len(shapes) < 40 {
		t.Fatalf("%d shapes, want at least 40", len(shapes))
	}
	key := testCred
	miss := key[:len(key)-1] + "g"
	for _, tc := range shapes {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, 10)
			near := tc.build(miss)
			h.fp.setRespond(near.respond)
			got := h.rawAll(post("/v1/messages", anthropicBody, "Connection: close"))
			r := parseRaw(t, got)
			switch tc.ctl {
			case passes:
				if r.status != 200 || (near.raw == "" && r.body != near.body()) {
					t.Fatalf("near miss: status %d body %q, want 200 and %q", r.status, r.body, near.body())
				}
			case refusedCoded:
				if r.status != 502 || !strings.Contains(r.body, string(ReasonUpstreamEncoding)) {
					t.Fatalf("near miss: status %d body %q, want 502 %s", r.status, r.body, ReasonUpstreamEncoding)
				}
			case upstreamFail:
				if r.status != 502 || !strings.Contains(r.body, string(ReasonUpstreamError)) {
					t.Fatalf("near miss: status %d body %q, want 502 %s", r.status, r.body, ReasonUpstreamError)
				}
			}
			if tc.ctl == passes && near.raw == "" && len(near.header) == 0 && !clientRecovers(miss, []byte(got)) {
				t.Errorf("BUG: the oracle cannot rebuild the near miss from the reply %q", got)
			}
			select {
			case reason := <-h.fatal:
				t.Fatalf("near miss cancelled the run (%s)", reason)
			default:
			}

			h.fp.setRespond(tc.build(key).respond)
			got = h.rawAll(post("/v1/messages", anthropicBody, "Connection: close"))
			if clientRecovers(key, []byte(got)) {
				t.Errorf("the worker can rebuild the key from what it received: %q", got)
			}
			if !strings.Contains(got, string(ReasonCredentialReflect)) {
				t.Errorf("worker got %q, want an error naming %s", got, ReasonCredentialReflect)
			}
			expectFatal(t, h, ReasonCredentialReflect)
			var reflected int
			for _, rec := range h.records(audit.TypeInferenceFailed) {
				if rec["reason"] == string(ReasonCredentialReflect) {
					reflected++
				}
			}
			if reflected != 1 || h.lastRecord()["reason"] != string(ReasonCredentialReflect) {
				t.Errorf("%d inference.failed records with reason %s, last record %v; want one, last", reflected, ReasonCredentialReflect, h.lastRecord())
			}
			for _, l := range h.j.lines() {
				if clientRecovers(key, l) {
					t.Errorf("the journal holds the key: %q", l)
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

// parseRaw reads the status and the de-chunked body of a raw reply.
func parseRaw(t *testing.T, got string) result {
	t.Helper()
	head, body, ok := strings.Cut(got, "\r\n\r\n")
	if !ok {
		t.Fatalf("no response head in %q", got)
	}
	var r result
	fmt.Sscanf(head, "HTTP/1.1 %d", &r.status)
	if strings.Contains(strings.ToLower(head), "transfer-encoding: chunked") {
		body = string(dechunk([]byte(body)))
	}
	r.body = body
	return r
}

// TestStreamHoldBack measures the streaming hold-back: fed one byte at a
// time, the guard holds at most the event in progress, and releases each
// event as soon as its blank line arrives.
func TestStreamHoldBack(t *testing.T) {
	evs := anthropicStream("claude-test")
	body := strings.Join(evs, "")
	sc := newScanner(newPattern(testCred))
	var released, maxHeld int64
	ends := map[int64]bool{}
	var off int64
	for _, e := range evs {
		off += int64(len(e))
		ends[off] = true
	}
	maxEvent := 0
	for _, e := range evs {
		maxEvent = max(maxEvent, len(e))
	}
	for i := 0; i < len(body); i++ {
		if sc.Write([]byte{body[i]}) {
			t.Fatal("the guard fired on a clean stream")
		}
		released = sc.safe
		held := int64(i+1) - released
		maxHeld = max(maxHeld, held)
		if ends[int64(i+1)] && held != 0 {
			t.Errorf("after the blank line ending at byte %d, %d bytes still held", i+1, held)
		}
	}
	if maxHeld > int64(maxEvent) {
		t.Errorf("held %d bytes, more than the largest event (%d)", maxHeld, maxEvent)
	}
	t.Logf("hold-back: at most %d bytes (the largest event is %d bytes); 0 at every event boundary", maxHeld, maxEvent)
}

// BenchmarkScanner: the guard's cost per byte on a streamed answer (many
// small text deltas) and on a buffered JSON answer.
func BenchmarkScanner(b *testing.B) {
	var sse strings.Builder
	sse.WriteString(aStart)
	for sse.Len() < 64<<10 {
		sse.WriteString(aDelta(0, "Here is some ordinary streamed text, with \"quotes\"\n and numbers 12345. "))
	}
	sse.WriteString(aStop)
	text := strings.Repeat("Here is some ordinary text, with \"quotes\"\n and numbers 12345. ", 1000)
	body := msg(text)
	b.Run("sse", func(b *testing.B) {
		b.ReportAllocs()
		data := []byte(sse.String())
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			sc := newScanner(newPattern(testCred))
			for off := 0; off < len(data); off += 512 {
				sc.Write(data[off:min(off+512, len(data))])
			}
			if sc.Close() {
				b.Fatal("hit")
			}
		}
	})
	b.Run("json", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			if hit, _, _ := inspectLayers(newPattern(testCred), []byte(body), maxCompressionDepth); hit {
				b.Fatal("hit")
			}
		}
	})
}
