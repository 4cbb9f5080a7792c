package broker

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/audit"
)

// TestToolRoute: with Config.Tools set, /mcp/… reaches it through the
// strict front, with the connection's attribution and the exact body;
// without it (the control) the same request is refused as an unknown
// path, and strict framing still applies before the gateway.
func TestToolRoute(t *testing.T) {
	type seen struct {
		method, path, body, ct string
		att                    audit.Attribution
		attOK                  bool
	}
	got := make(chan seen, 4)
	gw := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		a, ok := AttributionFrom(r.Context())
		got <- seen{r.Method, r.URL.Path, string(b), r.Header.Get("Content-Type"), a, ok}
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"jsonrpc":"2.0","id":1,"result":{}}`))
	})
	body := `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`
	h := newHarness(t, 4, func(c *Config) { c.Tools = gw })
	r := h.raw(post("/mcp/calc", body))
	if r.status != 200 || r.body != `{"jsonrpc":"2.0","id":1,"result":{}}` || r.closed {
		t.Fatalf("got %d %q closed=%v", r.status, r.body, r.closed)
	}
	s := <-got
	if s.method != "POST" || s.path != "/mcp/calc" || s.body != body || s.ct != "application/json" || !s.attOK || s.att.Status == "" {
		t.Errorf("gateway saw %+v", s)
	}
	// Framing is the front's: a duplicate Content-Length never reaches
	// the gateway.
	r = h.raw("POST /mcp/calc HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n{}")
	if r.status != 400 {
		t.Errorf("duplicate Content-Length: got %d, want 400", r.status)
	}
	select {
	case s := <-got:
		t.Errorf("gateway saw a badly framed request: %+v", s)
	default:
	}
	// Control: no gateway, the path is not served.
	c := newHarness(t, 4)
	if r := c.raw(post("/mcp/calc", body)); r.status != 404 || !strings.Contains(r.body, "path_not_allowed") {
		t.Errorf("without a gateway: got %d %s", r.status, r.body)
	}
}

// TestReflectionGuard: the guard the tool gateway uses finds a credential
// raw and JSON-escaped, and passes text without one (the control).
func TestReflectionGuard(t *testing.T) {
	g := NewReflectionGuard([]string{"", testCred})
	for _, c := range []struct {
		name string
		data string
		want bool
	}{
		{"raw", `{"content":[{"type":"text","text":"key ` + testCred + `"}]}`, true},
		{"escaped", `{"text":"` + strings.Replace(testCred, testCred[:1], `\u00`+hex2(testCred[0]), 1) + `"}`, true},
		{"control", `{"content":[{"type":"text","text":"5"}]}`, false},
	} {
		if got := g([]byte(c.data)); got != c.want {
			t.Errorf("%s: got %v, want %v", c.name, got, c.want)
		}
	}
}

func hex2(b byte) string {
	const digits = "0123456789abcdef"
	return string([]byte{digits[b>>4], digits[b&15]})
}
