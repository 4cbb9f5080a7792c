package broker

import (
	"bufio"
	"bytes"
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
