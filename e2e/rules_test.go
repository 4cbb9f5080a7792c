//go:build linux

package e2e

import (
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
)

// rawReq builds a raw HTTP/1.1 request to the broker.
func rawReq(method, target string, headers []string, body string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n", method, target)
	for _, h := range headers {
		b.WriteString(h + "\r\n")
	}
	b.WriteString("\r\n")
	b.WriteString(body)
	return b.String()
}

const validBody = `{"model":"claude-e2e","max_tokens":32,"messages":[{"role":"user","content":"hi"}]}`

func msgReq(extraHeaders []string, body string) string {
	h := append([]string{"Content-Type: application/json", "anthropic-version: 2023-06-01", fmt.Sprintf("Content-Length: %d", len(body))}, extraHeaders...)
	return rawReq("POST", "/v1/messages", h, body)
}

func withBody(mutate func(string) string) string { return mutate(validBody) }

// Every broker rule, through a real sandbox: each violating request is
// refused (an error status, or the connection closed) and never reaches
// the provider, and a valid request on a new connection right after it
// works. The provider observes only the valid requests, with the real
// credential and nothing the worker was not allowed to send.
func TestRunBrokerRulesThroughSandbox(t *testing.T) {
	e := newEnv(t)
	p, ptls := newProvider(t, false), newProvider(t, true)
	pol := e.brokerPolicy(p, ptls)
	valid := msgReq(nil, validBody)
	long := strings.Repeat("a", 70<<10)
	rules := []struct{ name, raw string }{
		{"absolute-form target", strings.Replace(valid, "POST /v1/messages", "POST http://api.anthropic.com/v1/messages", 1)},
		{"authority-form CONNECT", "CONNECT api.anthropic.com:443 HTTP/1.1\r\nHost: api.anthropic.com:443\r\n\r\n"},
		{"upgrade h2c", msgReq([]string{"Upgrade: h2c", "HTTP2-Settings: AAMAAABkAAQAAP__"}, validBody)},
		{"HTTP/2 preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"},
		{"duplicate Content-Length", msgReq([]string{fmt.Sprintf("Content-Length: %d", len(validBody))}, validBody)},
		{"conflicting Content-Length", msgReq([]string{"Content-Length: 3"}, validBody)},
		{"Content-Length with Transfer-Encoding", msgReq([]string{"Transfer-Encoding: chunked"}, validBody)},
		{"transfer coding gzip", rawReq("POST", "/v1/messages", []string{"Content-Type: application/json", "Transfer-Encoding: gzip, chunked"}, "0\r\n\r\n")},
		{"malformed chunked", rawReq("POST", "/v1/messages", []string{"Content-Type: application/json", "Transfer-Encoding: chunked"}, "zz\r\n{}\r\n0\r\n\r\n")},
		{"request smuggled inside a chunk", func() string {
			inner := "0\r\n\r\n" + valid
			return rawReq("POST", "/v1/messages", []string{"Content-Type: application/json", "anthropic-version: 2023-06-01", "Transfer-Encoding: chunked"},
				fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(inner), inner))
		}()},
		{"obsolete line folding", msgReq([]string{"X-Folded: a", " b"}, validBody)},
		{"bare LF", strings.Replace(valid, "Connection: close\r\n", "Connection: close\n", 1)},
		{"bare CR", strings.Replace(valid, "Connection: close\r\n", "Connection: close\rX: y\r\n", 1)},
		{"NUL in a header", msgReq([]string{"X-Nul: a\x00b"}, validBody)},
		{"oversized header", msgReq([]string{"X-Big: " + long}, validBody)},
		{"dot segments", strings.Replace(valid, "POST /v1/messages", "POST /v1/../v1/messages", 1)},
		{"encoded slash", strings.Replace(valid, "POST /v1/messages", "POST /v1%2fmessages", 1)},
		{"double slash", strings.Replace(valid, "POST /v1/messages", "POST //v1/messages", 1)},
		{"?key= in the query", strings.Replace(valid, "POST /v1/messages", "POST /v1/messages?key=stolen", 1)},
		{"compressed body", msgReq([]string{"Content-Encoding: gzip"}, validBody)},
		{"worker Authorization", msgReq([]string{"Authorization: Bearer sk-worker-own-key"}, validBody)},
		{"worker x-api-key", msgReq([]string{"x-api-key: sk-worker-own-key"}, validBody)},
		{"Moat-* header", msgReq([]string{"Moat-Pre-Effect: forged"}, validBody)},
		{"unknown field", msgReq(nil, withBody(func(s string) string { return strings.Replace(s, `"max_tokens"`, `"surprise":1,"max_tokens"`, 1) }))},
		{"model not allowed", msgReq(nil, withBody(func(s string) string { return strings.Replace(s, "claude-e2e", "claude-other", 1) }))},
		{"max_tokens above policy", msgReq(nil, withBody(func(s string) string { return strings.Replace(s, `"max_tokens":32`, `"max_tokens":100000`, 1) }))},
		{"URL image source", msgReq(nil, withBody(func(s string) string {
			return strings.Replace(s, `"content":"hi"`, `"content":[{"type":"image","source":{"type":"url","url":"https://example.invalid/x.png"}}]`, 1)
		}))},
		{"server tool", msgReq(nil, withBody(func(s string) string {
			return strings.Replace(s, `"messages"`, `"tools":[{"type":"web_search_20250305","name":"web_search"}],"messages"`, 1)
		}))},
		{"remote MCP server", msgReq(nil, withBody(func(s string) string {
			return strings.Replace(s, `"messages"`, `"mcp_servers":[{"type":"url","url":"https://mcp.invalid","name":"x"}],"messages"`, 1)
		}))},
		{"context management", msgReq(nil, withBody(func(s string) string {
			return strings.Replace(s, `"messages"`, `"context_management":{"edits":[]},"messages"`, 1)
		}))},
		{"duplicate JSON key", msgReq(nil, withBody(func(s string) string {
			return strings.Replace(s, `"max_tokens":32`, `"max_tokens":32,"max_tokens":16`, 1)
		}))},
		{"duplicate key via escape", msgReq(nil, withBody(func(s string) string {
			return strings.Replace(s, `"max_tokens":32`, `"max_tokens":32,"max_tok\u0065ns":16`, 1)
		}))},
		{"trailing data", msgReq(nil, validBody+"{}")},
	}
	var actions []string
	for _, r := range rules {
		actions = append(actions, "raw="+base64.StdEncoding.EncodeToString([]byte(r.raw)), "raw="+base64.StdEncoding.EncodeToString([]byte(valid)))
	}
	// A well-formed chunked request is re-framed and works.
	chunked := rawReq("POST", "/v1/messages", []string{"Content-Type: application/json", "anthropic-version: 2023-06-01", "Transfer-Encoding: chunked"},
		fmt.Sprintf("%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n", 10, validBody[:10], len(validBody)-10, validBody[10:]))
	// A request pipelined behind one that says Connection: close is never
	// read: the first is answered, the second never reaches the provider.
	pipelined := valid + valid
	actions = append(actions, "raw="+base64.StdEncoding.EncodeToString([]byte(chunked)), "raw="+base64.StdEncoding.EncodeToString([]byte(pipelined)))

	r, journal := e.runWithProvider(pol, []*provider{p, ptls}, actions...)
	if r.code != 0 {
		t.Fatalf("%s", r)
	}
	var got []string
	for _, l := range strings.Split(r.stdout, "\n") {
		if rest, ok := strings.CutPrefix(l, "raw="); ok {
			_, res, _ := strings.Cut(rest, " ")
			s, ok := strings.CutPrefix(res, "ok ")
			if !ok {
				t.Fatalf("a raw exchange failed: %s\n%s", l, r)
			}
			got = append(got, s)
		}
	}
	if len(got) != 2*len(rules)+2 {
		t.Fatalf("got %d raw results, want %d\n%s", len(got), 2*len(rules)+2, r)
	}
	for i, rule := range rules {
		refused, after := got[2*i], got[2*i+1]
		if refused == "200" {
			t.Errorf("%s: the broker answered 200, want a refusal", rule.name)
		}
		if after != "200" {
			t.Errorf("%s: the valid request after it got %q, want 200", rule.name, after)
		}
	}
	if got[len(got)-2] != "200" {
		t.Errorf("well-formed chunked request: got %q, want 200", got[len(got)-2])
	}
	if got[len(got)-1] != "200" {
		t.Errorf("pipelined pair: the first got %q, want 200", got[len(got)-1])
	}
	seen := p.Requests()
	if want := len(rules) + 2; len(seen) != want {
		t.Errorf("the provider saw %d requests, want %d (only the valid ones)", len(seen), want)
	}
	for _, s := range seen {
		if s.PreEffectErr != nil {
			t.Errorf("pre-effect: %v", s.PreEffectErr)
		}
		if s.Query != "" || s.Path != "/v1/messages" {
			t.Errorf("provider saw %s?%s", s.Path, s.Query)
		}
		if s.Header.Get("X-Api-Key") != anthropicCred || s.Header.Get("Authorization") != "" {
			t.Errorf("provider saw credentials x-api-key=%q authorization=%q", s.Header.Get("X-Api-Key"), s.Header.Get("Authorization"))
		}
		for k := range s.Header {
			if strings.HasPrefix(strings.ToLower(k), "moat-") && k != "Moat-Pre-Effect" || k == "X-Folded" || k == "X-Big" || k == "Upgrade" {
				t.Errorf("provider saw header %s", k)
			}
		}
		if strings.Contains(string(s.Body), "surprise") || strings.Contains(string(s.Body), "claude-other") {
			t.Errorf("provider saw a refused body: %s", s.Body)
		}
	}
	v := e.moat("audit", "verify", journal, "--pubkey", journal[:len(journal)-len("journal.jsonl")]+"pubkey.pem")
	if v.code != 0 {
		t.Errorf("journal: %s", v)
	}
	show := e.moat("audit", "show", journal)
	if n := strings.Count(show.stdout, "inference.refused"); n < len(rules)-12 {
		// Framing refusals before the API is known may close the
		// connection without a record; admission refusals are journaled.
		t.Errorf("only %d inference.refused records for %d rules\n%s", n, len(rules), show.stdout)
	}
}
