package broker

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/hex"
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
		whole := newScanner(newPattern(cred)).Write(data)
		if split < 0 {
			split = -split
		}
		split %= len(data) + 1
		s := newScanner(newPattern(cred))
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
		if !newScanner(newPattern(cred)).Write(append(append([]byte(nil), data...), "\n"+esc.String()...)) {
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

// FuzzReflection composes the transformations the guard covers (case,
// one encoding, JSON escapes up to maxEscapeDepth, splits across SSE
// events, content blocks and headers, compression up to
// maxCompressionDepth) and checks the guard's property: the key is always
// detected, and a streamed response releases nothing from which the
// independent client oracle (oracle_test.go) rebuilds the key before the
// guard fires. The release rule is stream's: bytes up to scanner.safe.
// The seed corpus is in testdata/fuzz/FuzzReflection.
func FuzzReflection(f *testing.F) {
	f.Add(uint64(0), uint8(0), uint8(0), uint8(0), uint8(0), []byte{10})
	f.Add(uint64(0xffff), uint8(1), uint8(2), uint8(1), uint8(1), []byte{3, 40, 7})
	f.Add(uint64(0x5a5a), uint8(9), uint8(3), uint8(0), uint8(2), []byte{1, 2, 3, 4, 5})
	f.Add(uint64(1), uint8(4), uint8(1), uint8(2), uint8(3), []byte{17})
	f.Add(uint64(7), uint8(5), uint8(4), uint8(3), uint8(0), []byte{200, 9, 33})
	f.Fuzz(func(t *testing.T, caseMask uint64, enc, depth, comp, shape uint8, cuts []byte) {
		const cred = testCred
		k := []byte(cred)
		for i := range k {
			if caseMask>>(i%64)&1 == 1 {
				switch {
				case 'a' <= k[i] && k[i] <= 'z':
					k[i] -= 'a' - 'A'
				case 'A' <= k[i] && k[i] <= 'Z':
					k[i] += 'a' - 'A'
				}
			}
		}
		prefix := strings.Repeat("p", int(enc/8)%3)
		var text string
		switch enc % 8 {
		case 0, 7:
			text = string(k)
		case 1:
			text = b64(prefix, string(k), base64.StdEncoding)
		case 2:
			text = b64(prefix, string(k), base64.RawURLEncoding)
		case 3:
			text = hex.EncodeToString(k)
		case 4:
			text = strings.ToUpper(hex.EncodeToString(k))
		case 5:
			text = pctAll(string(k))
		case 6:
			text = strings.ToLower(pctAll(string(k)))
		}
		text = nestU(text, int(depth)%maxEscapeDepth) // the JSON string adds one level
		var pieces []string
		last := 0
		for _, c := range cuts {
			if len(pieces) >= 8 {
				break
			}
			at := last + int(c)%(len(text)-last+1)
			pieces = append(pieces, text[last:at])
			last = at
		}
		pieces = append(pieces, text[last:])
		layers := int(comp) % (maxCompressionDepth + 1)
		var body []byte
		switch shape % 4 {
		case 0, 1: // SSE deltas, in one block or one block per piece
			evs := []string{aStart}
			for i, p := range pieces {
				evs = append(evs, aDelta(int(shape%4)*i, p))
			}
			body = []byte(strings.Join(append(evs, aStop), ""))
		case 2: // one content block per piece
			body = []byte(msg(pieces...))
		case 3: // one header per piece
			h := http.Header{}
			for i, p := range pieces {
				h.Add(fmt.Sprintf("X-P%d", i), p)
			}
			if len(pieces) > 2 {
				return // the guard pairs values; longer chains are in sorted order only
			}
			if !headReflects(newPattern(cred), "200 OK", h) {
				t.Fatalf("key in headers %q not detected", pieces)
			}
			return
		}
		for i := 0; i < layers; i++ {
			body = gz(body)
		}
		if layers > 0 || shape%4 == 2 {
			hit, _, err := inspectLayers(newPattern(cred), body, maxCompressionDepth)
			if !hit {
				t.Fatalf("key not detected (layers %d, err %v) in %q", layers, err, body)
			}
			return
		}
		// Stream: feed in reads cut at the same points, release as stream does.
		sc := newScanner(newPattern(cred))
		var released []byte
		hit := false
		for off, i := 0, 0; off < len(body) && !hit; i++ {
			n := len(body)
			if len(cuts) > 0 {
				n = 1 + int(cuts[i%len(cuts)])*7
			}
			if off+n > len(body) {
				n = len(body) - off
			}
			hit = sc.Write(body[off : off+n])
			off += n
			if !hit {
				released = append(released, body[len(released):sc.safe]...)
			}
		}
		if !hit {
			hit = sc.Close()
		}
		if !hit {
			t.Fatalf("key not detected in stream %q", body)
		}
		if clientRecovers(cred, released) {
			t.Fatalf("the client rebuilds the key from %q, released before the guard fired", released)
		}
	})
}
