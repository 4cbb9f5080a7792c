package broker

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

// FuzzReadRequest: the front never panics, and whatever it accepts is
// unambiguous: net/http's own parser reads the same bytes as the same
// method, path and body, and nothing is left over or read twice.
// The seed corpus is in testdata/fuzz/FuzzReadRequest.
func FuzzReadRequest(f *testing.F) {
	f.Add([]byte(post("/v1/messages", anthropicBody)))
	f.Add([]byte("POST /v1/messages HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		src := bytes.NewReader(data)
		br := bufio.NewReaderSize(src, frontBufferBytes)
		req, err := readRequest(br, io.Discard, nil)
		if err != nil {
			if _, ok := err.(*frontError); !ok && err != io.EOF {
				t.Fatalf("error of type %T: %v", err, err)
			}
			return
		}
		if len(req.body) > MaxBodyBytes || checkPath(req.path) != nil {
			t.Fatalf("accepted an over-limit body or a bad path %q", req.path)
		}
		seen := map[string]bool{}
		for _, f := range req.header {
			if seen[f.name] || f.name != strings.ToLower(f.name) || !isToken(f.name) {
				t.Fatalf("accepted header name %q twice or malformed", f.name)
			}
			seen[f.name] = true
		}
		consumed := len(data) - src.Len() - br.Buffered()
		hr, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(data[:consumed])))
		if err != nil {
			t.Fatalf("front accepted what net/http refuses (%v): %q", err, data[:consumed])
		}
		body, err := io.ReadAll(hr.Body)
		if err != nil {
			t.Fatalf("net/http body: %v", err)
		}
		if hr.Method != req.method || hr.URL.Path != req.path || !bytes.Equal(body, req.body) {
			t.Fatalf("disagreement: front %s %s %q, net/http %s %s %q", req.method, req.path, req.body, hr.Method, hr.URL.Path, body)
		}
	})
}

// FuzzScanner: the reflection guard's answer does not depend on how the
// response is split into reads, and a raw or \u-escaped credential is
// always found.
func FuzzScanner(f *testing.F) {
	f.Add([]byte(`{"text":"sk-test-REALCRED-0123456789abcdef"}`), 7)
	f.Add([]byte(`\u0073k-test-REALCRED-0123456789abcdef\\\u`), 3)
	f.Add([]byte(`\\u0073k-test`), 1)
	f.Fuzz(func(t *testing.T, data []byte, split int) {
		const cred = "sk-test-REALCRED-0123456789abcdef"
		whole := newScanner(cred).Write(data)
		if split < 0 {
			split = -split
		}
		split %= len(data) + 1
		s := newScanner(cred)
		s.Write(data[:split])
		if got := s.Write(data[split:]); got != whole {
			t.Fatalf("split at %d: %v, whole: %v", split, got, whole)
		}
		if bytes.Contains(data, []byte(cred)) && !whole {
			t.Fatalf("raw credential not found in %q", data)
		}
		var esc strings.Builder
		for i := 0; i < len(cred); i++ {
			fmt.Fprintf(&esc, `\u%04x`, cred[i])
		}
		// After a line feed (which ends any escape in progress) an escaped
		// credential is found whatever came before.
		if !newScanner(cred).Write(append(append([]byte(nil), data...), "\n"+esc.String()...)) {
			t.Fatalf("escaped credential not found after %q", data)
		}
	})
}

// FuzzSSEUsage: usage parsing of a hostile stream never panics and does
// not depend on how the stream is split.
func FuzzSSEUsage(f *testing.F) {
	for _, ev := range anthropicStream("m") {
		f.Add([]byte(ev), 5)
	}
	f.Add([]byte("data: {\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":6}}\n\n"), 9)
	f.Add([]byte("data: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":1,\"output_tokens\":2}}}\n"), 30)
	f.Fuzz(func(t *testing.T, data []byte, split int) {
		var a, b sseUsage
		a.feed(data)
		if split < 0 {
			split = -split
		}
		split %= len(data) + 1
		b.feed(data[:split])
		b.feed(data[split:])
		if a.u != b.u {
			t.Fatalf("split at %d: %+v, whole: %+v", split, b.u, a.u)
		}
	})
}
