package broker

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"io"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// The client oracle: what a client that received bytes can rebuild from
// them, written independently of scan.go with the standard library's
// decoders. The tests ask it whether the worker could recover the
// credential from what the broker released.

// oracleDepth is how many escape levels and compression layers the
// oracle undoes; it matches the guard's stated limits.
const oracleDepth = 4

// clientRecovers reports whether cred can be rebuilt from received, the
// bytes a worker read from the broker (an HTTP response, perhaps cut off).
func clientRecovers(cred string, received []byte) bool {
	texts := []string{string(received)}
	body := received
	if i := bytes.Index(received, []byte("\r\n\r\n")); i >= 0 {
		head := received[:i]
		body = received[i+4:]
		texts = append(texts, headerTexts(head)...)
		if bytes.Contains(bytes.ToLower(head), []byte("transfer-encoding: chunked")) {
			body = dechunk(body)
		}
	}
	texts = append(texts, bodyTexts(body)...)
	for _, t := range texts {
		if textRecovers(cred, t) {
			return true
		}
	}
	return false
}

// bodyTexts: the body, its undeclared compressed layers, and the strings a
// JSON or SSE client rebuilds from each.
func bodyTexts(body []byte) []string {
	var out []string
	layer := body
	for d := 0; d <= oracleDepth && len(layer) > 0; d++ {
		out = append(out, string(layer))
		out = append(out, jsonTexts([][]byte{layer})...)
		out = append(out, jsonTexts(sseData(layer))...)
		next, ok := gunzipAny(layer)
		if !ok {
			break
		}
		layer = next
	}
	return out
}

func gunzipAny(b []byte) ([]byte, bool) {
	var r io.Reader
	if zr, err := gzip.NewReader(bytes.NewReader(b)); err == nil {
		r = zr
	} else if zr, err := zlib.NewReader(bytes.NewReader(b)); err == nil {
		r = zr
	} else {
		return nil, false
	}
	out, _ := io.ReadAll(r)
	return out, len(out) > 0
}

func dechunk(b []byte) []byte {
	var out []byte
	br := bufio.NewReader(bytes.NewReader(b))
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return out
		}
		var n int
		for _, c := range strings.TrimSpace(line) {
			d := strings.IndexRune("0123456789abcdef", c|0x20)
			if d < 0 {
				break
			}
			n = n*16 + d
		}
		if n == 0 {
			return out
		}
		chunk := make([]byte, n)
		k, _ := io.ReadFull(br, chunk)
		out = append(out, chunk[:k]...)
		br.Discard(2)
	}
}

// headerTexts: each header value, and every value order a client could
// concatenate (all permutations of up to 6 values).
func headerTexts(head []byte) []string {
	var vals []string
	for _, l := range strings.Split(string(head), "\r\n")[1:] {
		if _, v, ok := strings.Cut(l, ":"); ok {
			vals = append(vals, strings.TrimSpace(v))
		}
	}
	out := append([]string(nil), vals...)
	if len(vals) > 6 {
		return append(out, strings.Join(vals, ""))
	}
	var perm func(rest []string, acc string)
	perm = func(rest []string, acc string) {
		out = append(out, acc)
		for i := range rest {
			r := append(append([]string(nil), rest[:i]...), rest[i+1:]...)
			perm(r, acc+rest[i])
		}
	}
	perm(vals, "")
	return out
}

// sseData splits an event stream into each event's joined data.
func sseData(b []byte) [][]byte {
	var evs [][]byte
	var cur []string
	has := false
	for _, l := range strings.Split(strings.ReplaceAll(string(b), "\r\n", "\n"), "\n") {
		if l == "" {
			if has {
				evs = append(evs, []byte(strings.Join(cur, "\n")))
			}
			cur, has = nil, false
			continue
		}
		if v, ok := strings.CutPrefix(l, "data:"); ok {
			cur, has = append(cur, strings.TrimPrefix(v, " ")), true
		}
	}
	if has {
		evs = append(evs, []byte(strings.Join(cur, "\n")))
	}
	return evs
}

// contentFields are the members whose strings SDKs concatenate into text.
var contentFields = map[string]bool{"text": true, "partial_json": true, "thinking": true, "content": true,
	"arguments": true, "delta": true, "refusal": true}

// jsonTexts: for a sequence of JSON documents (one per event), every
// field's strings concatenated across documents, per block (grouped by
// the index members SDKs use) and all content strings in order.
func jsonTexts(docs [][]byte) []string {
	perField := map[string]*strings.Builder{}
	var content strings.Builder
	var nonJSON strings.Builder
	add := func(k, s string) {
		b := perField[k]
		if b == nil {
			b = &strings.Builder{}
			perField[k] = b
		}
		b.WriteString(s)
	}
	for _, d := range docs {
		var v any
		if json.Unmarshal(d, &v) != nil {
			nonJSON.Write(d)
			continue
		}
		var walk func(v any, path, block string)
		walk = func(v any, path, block string) {
			switch t := v.(type) {
			case map[string]any:
				keys := make([]string, 0, len(t))
				for k := range t {
					keys = append(keys, k)
				}
				sort.Strings(keys)
				for _, k := range []string{"index", "output_index", "content_index"} {
					if n, ok := t[k].(float64); ok {
						block += k + "=" + strconv.FormatFloat(n, 'g', -1, 64) + ";"
					}
				}
				for _, k := range keys {
					walk(t[k], path+"."+k, block)
					if s, ok := t[k].(string); ok && contentFields[k] {
						content.WriteString(s)
					}
				}
			case []any:
				for _, e := range t {
					walk(e, path+"[]", block)
				}
			case string:
				add(path, t)
				add(path+"#"+block, t)
			}
		}
		walk(v, "", "")
	}
	out := []string{content.String(), nonJSON.String()}
	for _, b := range perField {
		out = append(out, b.String())
	}
	return out
}

// textRecovers: cred in t, case-insensitively, after up to oracleDepth
// levels of JSON unescaping, and in each level's percent, hex and base64
// decodings.
func textRecovers(cred, t string) bool {
	low := strings.ToLower(cred)
	for d := 0; d <= oracleDepth; d++ {
		for _, c := range decodings(t) {
			if strings.Contains(strings.ToLower(c), low) {
				return true
			}
		}
		u := jsonUnescape(t)
		if u == t {
			break
		}
		t = u
	}
	return false
}

var (
	hexRun = regexp.MustCompile(`[0-9a-fA-F]{2,}`)
	b64Run = regexp.MustCompile(`[A-Za-z0-9+/_-]{2,}`)
	pctSeq = regexp.MustCompile(`%[0-9a-fA-F]{2}`)
)

func decodings(t string) []string {
	out := []string{t, pctSeq.ReplaceAllStringFunc(t, func(m string) string {
		b, _ := hex.DecodeString(m[1:])
		return string(b)
	})}
	for _, r := range hexRun.FindAllString(t, -1) {
		for off := 0; off < 2; off++ {
			s := r[off:]
			b, _ := hex.DecodeString(s[:len(s)/2*2])
			out = append(out, string(b))
		}
	}
	for _, r := range b64Run.FindAllString(t, -1) {
		r = strings.NewReplacer("-", "+", "_", "/").Replace(r)
		for off := 0; off < 4 && off < len(r); off++ {
			s := r[off:]
			if len(s)%4 == 1 {
				s = s[:len(s)-1]
			}
			b, _ := base64.RawStdEncoding.DecodeString(s)
			out = append(out, string(b))
		}
	}
	return out
}

// jsonUnescape undoes one level of JSON string escapes; malformed escapes
// stay as written.
func jsonUnescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' || i+1 >= len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch c := s[i+1]; c {
		case 'u':
			if i+6 <= len(s) {
				if v, err := hex.DecodeString(s[i+2 : i+6]); err == nil {
					r := rune(v[0])<<8 | rune(v[1])
					b.WriteRune(r)
					i += 5
					continue
				}
			}
			b.WriteByte('\\')
		case '"', '\\', '/':
			b.WriteByte(c)
			i++
		case 'n', 't', 'r', 'b', 'f':
			b.WriteByte(map[byte]byte{'n': '\n', 't': '\t', 'r': '\r', 'b': '\b', 'f': '\f'}[c])
			i++
		default:
			b.WriteByte('\\')
		}
	}
	return b.String()
}
