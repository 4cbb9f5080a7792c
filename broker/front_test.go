package broker

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/audit"
)

const crlf = "\r\n"

// ab is the valid body with its length, for hand-written heads.
var abLen = fmt.Sprint(len(anthropicBody))

// TestFrontRefusals sends each raw request on its own connection. Each must
// be refused with its reason code, journaled, never reach the provider, and
// close the connection; then a valid request on a new connection must
// succeed.
func TestFrontRefusals(t *testing.T) {
	h := newHarness(t, 1000)
	head := "Host: 127.0.0.1\r\nContent-Type: application/json\r\nX-Api-Key: moat-placeholder\r\n"
	tests := []struct {
		name   string
		raw    string
		status int
		reason Reason
	}{
		{"absolute-form", "POST http://api.anthropic.com/v1/messages HTTP/1.1\r\n" + head + "Content-Length: " + abLen + "\r\n\r\n" + anthropicBody, 400, ReasonTargetForm},
		{"authority-form", "POST api.anthropic.com:443 HTTP/1.1\r\n" + head + "\r\n", 400, ReasonTargetForm},
		{"asterisk-form", "OPTIONS * HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 400, ReasonTargetForm},
		{"CONNECT", "CONNECT api.anthropic.com:443 HTTP/1.1\r\nHost: api.anthropic.com:443\r\n\r\n", 405, ReasonConnect},
		{"HTTP/2 preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505, ReasonVersion},
		{"HTTP/1.0", "POST /v1/messages HTTP/1.0\r\n" + head + "Content-Length: " + abLen + "\r\n\r\n" + anthropicBody, 505, ReasonVersion},
		{"h2c upgrade", post("/v1/messages", anthropicBody, "Connection: Upgrade, HTTP2-Settings", "Upgrade: h2c", "HTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA"), 400, ReasonUpgrade},
		{"websocket upgrade", post("/v1/messages", anthropicBody, "Upgrade: websocket"), 400, ReasonUpgrade},
		{"connection upgrade token", post("/v1/messages", anthropicBody, "Connection: upgrade"), 400, ReasonUpgrade},
		{"connection other token", post("/v1/messages", anthropicBody, "Connection: X-Foo"), 400, ReasonConnection},
		{"duplicate identical Content-Length", "POST /v1/messages HTTP/1.1\r\n" + head + "Content-Length: " + abLen + "\r\nContent-Length: " + abLen + "\r\n\r\n" + anthropicBody, 400, ReasonDuplicateHeader},
		{"conflicting Content-Length", "POST /v1/messages HTTP/1.1\r\n" + head + "Content-Length: " + abLen + "\r\nContent-Length: 5\r\n\r\n" + anthropicBody, 400, ReasonDuplicateHeader},
		{"Content-Length list", "POST /v1/messages HTTP/1.1\r\n" + head + "Content-Length: " + abLen + ", " + abLen + "\r\n\r\n" + anthropicBody, 400, ReasonContentLength},
		{"Content-Length with sign", "POST /v1/messages HTTP/1.1\r\n" + head + "Content-Length: +" + abLen + "\r\n\r\n" + anthropicBody, 400, ReasonContentLength},
		{"Content-Length hex", "POST /v1/messages HTTP/1.1\r\n" + head + "Content-Length: 0x10\r\n\r\n", 400, ReasonContentLength},
		{"CL with TE", "POST /v1/messages HTTP/1.1\r\n" + head + "Content-Length: " + abLen + "\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(anthropicBody), 400, ReasonCLWithTE},
		{"TE gzip", "POST /v1/messages HTTP/1.1\r\n" + head + "Transfer-Encoding: gzip\r\n\r\n", 501, ReasonTransferCoding},
		{"TE gzip, chunked", "POST /v1/messages HTTP/1.1\r\n" + head + "Transfer-Encoding: gzip, chunked\r\n\r\n" + chunked(anthropicBody), 501, ReasonTransferCoding},
		{"TE chunked twice in one", "POST /v1/messages HTTP/1.1\r\n" + head + "Transfer-Encoding: chunked, chunked\r\n\r\n" + chunked(anthropicBody), 501, ReasonTransferCoding},
		{"TE header twice", "POST /v1/messages HTTP/1.1\r\n" + head + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(anthropicBody), 400, ReasonDuplicateHeader},
		{"chunk extension", "POST /v1/messages HTTP/1.1\r\n" + head + "Transfer-Encoding: chunked\r\n\r\n" + fmt.Sprintf("%x;ext=1\r\n%s\r\n0\r\n\r\n", len(anthropicBody), anthropicBody), 400, ReasonChunked},
		{"chunk trailer", "POST /v1/messages HTTP/1.1\r\n" + head + "Transfer-Encoding: chunked\r\n\r\n" + fmt.Sprintf("%x\r\n%s\r\n0\r\nX-Trailer: 1\r\n\r\n", len(anthropicBody), anthropicBody), 400, ReasonChunked},
		{"chunk size not hex", "POST /v1/messages HTTP/1.1\r\n" + head + "Transfer-Encoding: chunked\r\n\r\nzz\r\n", 400, ReasonChunked},
		{"chunk without CRLF", "POST /v1/messages HTTP/1.1\r\n" + head + "Transfer-Encoding: chunked\r\n\r\n" + fmt.Sprintf("%x\r\n%sXX0\r\n\r\n", len(anthropicBody), anthropicBody), 400, ReasonChunked},
		{"chunk size bare LF", "POST /v1/messages HTTP/1.1\r\n" + head + "Transfer-Encoding: chunked\r\n\r\n" + fmt.Sprintf("%x\n%s\r\n0\r\n\r\n", len(anthropicBody), anthropicBody), 400, ReasonChunked},
		{"obsolete line folding", "POST /v1/messages HTTP/1.1\r\n" + head + "X-Foo: a\r\n b\r\nContent-Length: " + abLen + "\r\n\r\n" + anthropicBody, 400, ReasonObsFold},
		{"bare LF", "POST /v1/messages HTTP/1.1\nHost: 127.0.0.1\n\n", 400, ReasonBareCRLF},
		{"bare LF in header", "POST /v1/messages HTTP/1.1\r\n" + head + "X-Foo: a\nContent-Length: " + abLen + "\r\n\r\n" + anthropicBody, 400, ReasonBareCRLF},
		{"bare CR in header", "POST /v1/messages HTTP/1.1\r\n" + head + "X-Foo: a\rb\r\nContent-Length: " + abLen + "\r\n\r\n" + anthropicBody, 400, ReasonBareCRLF},
		{"NUL in header", "POST /v1/messages HTTP/1.1\r\n" + head + "X-Foo: a\x00b\r\nContent-Length: " + abLen + "\r\n\r\n" + anthropicBody, 400, ReasonNUL},
		{"NUL in request line", "POST /v1/mess\x00ages HTTP/1.1\r\n" + head + "\r\n", 400, ReasonNUL},
		{"space before colon", "POST /v1/messages HTTP/1.1\r\n" + head + "Content-Length : " + abLen + "\r\n\r\n" + anthropicBody, 400, ReasonBadFraming},
		{"non-ASCII header value", post("/v1/messages", anthropicBody, "X-Foo: caf\xc3\xa9"), 400, ReasonBadFraming},
		{"double space in request line", "POST  /v1/messages HTTP/1.1\r\n" + head + "\r\n", 400, ReasonBadFraming},
		{"header line too long", post("/v1/messages", anthropicBody, "X-Big: "+strings.Repeat("a", MaxLineBytes)), 431, ReasonHeaderTooLarge},
		{"head too large", post("/v1/messages", anthropicBody, manyHeaders(8, 5000)...), 431, ReasonHeaderTooLarge},
		{"too many header fields", post("/v1/messages", anthropicBody, manyHeaders(MaxHeaderFields, 1)...), 431, ReasonHeaderTooLarge},
		{"body too large", "POST /v1/messages HTTP/1.1\r\n" + head + fmt.Sprintf("Content-Length: %d\r\n\r\n", MaxBodyBytes+1), 413, ReasonBodyTooLarge},
		{"chunked body too large", "POST /v1/messages HTTP/1.1\r\n" + head + "Transfer-Encoding: chunked\r\n\r\n" + fmt.Sprintf("%x\r\n", MaxBodyBytes+1), 413, ReasonBodyTooLarge},
		{"dot-dot segment", post("/v1/../v1/messages", anthropicBody), 400, ReasonPathTrick},
		{"dot segment", post("/v1/./messages", anthropicBody), 400, ReasonPathTrick},
		{"trailing dot-dot", post("/v1/messages/..", anthropicBody), 400, ReasonPathTrick},
		{"encoded slash", post("/v1%2fmessages", anthropicBody), 400, ReasonPathTrick},
		{"encoded backslash", post("/v1%5cmessages", anthropicBody), 400, ReasonPathTrick},
		{"encoded letter", post("/v1/m%65ssages", anthropicBody), 400, ReasonPathTrick},
		{"double slash", post("//v1/messages", anthropicBody), 400, ReasonPathTrick},
		{"inner double slash", post("/v1//messages", anthropicBody), 400, ReasonPathTrick},
		{"backslash", post("/v1\\messages", anthropicBody), 400, ReasonPathTrick},
		{"query key", post("/v1/messages?key=sk-mine", anthropicBody), 400, ReasonQuery},
		{"empty query", post("/v1/messages?", anthropicBody), 400, ReasonQuery},
		{"fragment", post("/v1/messages#x", anthropicBody), 400, ReasonQuery},
		{"Content-Encoding gzip", post("/v1/messages", anthropicBody, "Content-Encoding: gzip"), 415, ReasonCompressedBody},
		{"Content-Encoding identity", post("/v1/messages", anthropicBody, "Content-Encoding: identity"), 415, ReasonCompressedBody},
		{"missing Host", "POST /v1/messages HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: " + abLen + "\r\n\r\n" + anthropicBody, 400, ReasonMissingHost},
		{"Expect other", post("/v1/messages", anthropicBody, "Expect: 200-ok"), 417, ReasonExpect},
		{"unknown path", post("/v1/models", anthropicBody), 404, ReasonPathNotAllowed},
		{"GET", "GET /v1/messages HTTP/1.1\r\n" + head + "\r\n", 405, ReasonMethod},
		{"Moat header", post("/v1/messages", anthropicBody, "Moat-Pre-Effect: e30="), 400, ReasonMoatHeader},
		{"Moat header other", post("/v1/messages", anthropicBody, "moat-audit: off"), 400, ReasonMoatHeader},
		{"own Authorization", post("/v1/messages", anthropicBody, "Authorization: Bearer sk-my-own-key"), 403, ReasonCredentialHeader},
		{"own api-key", post("/v1/messages", anthropicBody, "Api-Key: sk-my-own-key"), 403, ReasonCredentialHeader},
		{"own x-api-key", "POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Api-Key: sk-my-own-key\r\nContent-Length: " + abLen + "\r\n\r\n" + anthropicBody, 403, ReasonCredentialHeader},
		{"server-tool beta", post("/v1/messages", anthropicBody, "Anthropic-Beta: mcp-client-2025-04-04"), 400, ReasonBetaNotAllowed},
		{"beta list with one bad", post("/v1/messages", anthropicBody, "Anthropic-Beta: interleaved-thinking-2025-05-14, code-execution-2025-05-22"), 400, ReasonBetaNotAllowed},
		{"malformed anthropic-version", post("/v1/messages", anthropicBody, "Anthropic-Version: latest; x"), 400, ReasonBadHeaderValue},
		{"text body", "POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: text/plain\r\nContent-Length: " + abLen + "\r\n\r\n" + anthropicBody, 415, ReasonContentType},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := h.fp.count()
			r := h.raw(tc.raw)
			if r.status != tc.status {
				t.Errorf("status %d, want %d; body %s", r.status, tc.status, r.body)
			}
			if !r.closed {
				t.Errorf("connection kept open after a refusal, want closed")
			}
			var eb struct {
				Error struct {
					Code    string `json:"code"`
					Message string `json:"message"`
				} `json:"error"`
			}
			if err := json.Unmarshal([]byte(r.body), &eb); err != nil || !strings.HasPrefix(eb.Error.Message, "moat: refused: ") {
				t.Errorf("error body %q: want JSON with error.message starting \"moat: refused: \" (%v)", r.body, err)
			}
			rec := h.lastRecord()
			if rec["type"] != audit.TypeInferenceRefused || rec["reason"] != string(tc.reason) {
				t.Errorf("last journal record %v %v, want %s with reason %s", rec["type"], rec["reason"], audit.TypeInferenceRefused, tc.reason)
			}
			if got := h.fp.count(); got != before {
				t.Errorf("provider saw %d new requests, want 0", got-before)
			}
			h.mustSucceed()
		})
	}
}

// TestFrontAccepts shows the framings that are accepted: chunked (re-framed
// for the provider), Expect: 100-continue, keep-alive.
func TestFrontAccepts(t *testing.T) {
	h := newHarness(t, 100)
	t.Run("chunked", func(t *testing.T) {
		half := len(anthropicBody) / 2
		body := fmt.Sprintf("%x\r\n%s\r\n%X\r\n%s\r\n0\r\n\r\n", half, anthropicBody[:half], len(anthropicBody)-half, anthropicBody[half:])
		r := h.raw("POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n" + body)
		if r.status != 200 {
			t.Fatalf("status %d, want 200: %s", r.status, r.body)
		}
		s := h.fp.last()
		if got := s.header.Get("Transfer-Encoding"); got != "" {
			t.Errorf("provider saw Transfer-Encoding %q, want a re-framed body", got)
		}
		if !json.Valid(s.body) || !strings.Contains(string(s.body), `"claude-test"`) {
			t.Errorf("provider body %q, want the de-chunked request", s.body)
		}
	})
	t.Run("expect 100-continue", func(t *testing.T) {
		c, err := net.Dial("tcp", h.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		io.WriteString(c, "POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nExpect: 100-continue\r\nContent-Length: "+abLen+"\r\n\r\n")
		br := bufio.NewReader(c)
		line, _ := br.ReadString('\n')
		if line != "HTTP/1.1 100 Continue\r\n" {
			t.Fatalf("got %q, want the 100 Continue interim response", line)
		}
		br.ReadString('\n')
		io.WriteString(c, anthropicBody)
		if r := readResult(t, br, c); r.status != 200 {
			t.Fatalf("status %d, want 200", r.status)
		}
	})
	t.Run("keep-alive", func(t *testing.T) {
		c, err := net.Dial("tcp", h.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		br := bufio.NewReader(c)
		io.WriteString(c, post("/v1/messages", anthropicBody))
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || resp.Close {
			t.Fatalf("first request: status %d close %v, want 200 kept open", resp.StatusCode, resp.Close)
		}
		io.WriteString(c, post("/v1/messages", anthropicBody, "Connection: close"))
		if r := readResult(t, br, c); r.status != 200 || !r.closed {
			t.Fatalf("second request on the same connection: status %d closed %v, want 200 and closed", r.status, r.closed)
		}
	})
}

// TestFrontSlowClient: a client that stops mid-request is cut off after the
// read timeout, the refusal is journaled, and the next client is served.
func TestFrontSlowClient(t *testing.T) {
	h := newHarness(t, 10, func(b *Broker) { b.readTimeout = 300 * time.Millisecond })
	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, "POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 500\r\n\r\n{\"model\"")
	r := readResult(t, bufio.NewReader(c), c)
	if r.status != 408 || !r.closed {
		t.Errorf("slow client: status %d closed %v, want 408 and closed", r.status, r.closed)
	}
	if rec := h.lastRecord(); rec["reason"] != string(ReasonTimeout) {
		t.Errorf("journal reason %v, want %s", rec["reason"], ReasonTimeout)
	}
	if h.fp.count() != 0 {
		t.Errorf("provider saw the slow request")
	}
	h.mustSucceed()
}

func chunked(s string) string { return fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(s), s) }

func manyHeaders(n, size int) []string {
	var hs []string
	for i := range n {
		hs = append(hs, fmt.Sprintf("X-H%d: %s", i, strings.Repeat("v", size)))
	}
	return hs
}

// TestRefusalSurvivesUnreadBody: a refusal decided on the head reaches a
// client that is still sending its body. (Linux loopback keeps queued data
// readable after a reset, so this does not by itself show why lingerClose
// exists; other paths and stacks do drop it.)
func TestRefusalSurvivesUnreadBody(t *testing.T) {
	h := newHarness(t, 10)
	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	body := strings.Repeat("x", 1<<20)
	io.WriteString(c, "POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Encoding: gzip\r\nContent-Length: "+fmt.Sprint(len(body))+"\r\n\r\n")
	go io.WriteString(c, body)
	time.Sleep(100 * time.Millisecond)
	r := readResult(t, bufio.NewReader(c), c)
	if r.status != 415 {
		t.Errorf("status %d, want 415", r.status)
	}
	h.mustSucceed()
}
