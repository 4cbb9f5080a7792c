package broker

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/internal/fakeprovider"
)

// walkRecord is one string the guard feeds: the names of its two streams
// (before hashing), its decoded value, and whether it also goes to the
// whole-response stream.
type walkRecord struct {
	f, b, val string
	all       bool
}

// walkTokens is the guard's JSON walk as it was before scanjson.go, on
// encoding/json's Decoder.Token: the oracle of walkJSON. It returns the
// strings the walk feeds, in order, and whether d yielded any token.
func walkTokens(d []byte) ([]walkRecord, bool) {
	type jsonStr struct {
		val, path string
		obj       int
		field     string
	}
	type jsonObj struct {
		parent int
		block  string
	}
	dec := json.NewDecoder(bytes.NewReader(d))
	dec.UseNumber()
	type frame struct {
		obj    int
		owner  int
		key    bool
		member string
		path   string
	}
	var (
		stack []frame
		strs  []jsonStr
		objs  []jsonObj
		any   bool
	)
	for {
		tok, err := dec.Token()
		if err != nil {
			break
		}
		any = true
		n := len(stack)
		if n > 0 && stack[n-1].obj >= 0 && stack[n-1].key {
			if name, ok := tok.(string); ok {
				stack[n-1].member, stack[n-1].key = name, false
				continue
			}
		}
		path, member, owner, blockObj := "", "", -1, -1
		if n > 0 {
			top := &stack[n-1]
			owner = top.owner
			if top.obj >= 0 {
				path, member, blockObj = top.path+"."+top.member, top.member, top.obj
			} else {
				path = top.path + "[]"
			}
		}
		switch t := tok.(type) {
		case json.Delim:
			switch t {
			case '{':
				objs = append(objs, jsonObj{parent: owner})
				stack = append(stack, frame{obj: len(objs) - 1, owner: len(objs) - 1, key: true, path: path})
				continue
			case '[':
				stack = append(stack, frame{obj: -1, owner: owner, path: path})
				continue
			}
			stack = stack[:n-1]
		case string:
			strs = append(strs, jsonStr{val: t, path: path, obj: owner, field: member})
			if blockObj >= 0 && slices.Contains(blockNames, member) {
				objs[blockObj].block += member + "=" + t + ";"
			}
		case json.Number:
			if blockObj >= 0 && slices.Contains(blockNames, member) {
				objs[blockObj].block += member + "=" + string(t) + ";"
			}
		}
		if k := len(stack); k > 0 && stack[k-1].obj >= 0 {
			stack[k-1].key = true
		}
	}
	var out []walkRecord
	for _, js := range strs {
		b := "b:" + js.path + "#"
		for o := js.obj; o >= 0; o = objs[o].parent {
			b += objs[o].block + "/"
		}
		out = append(out, walkRecord{f: "f:" + js.path, b: b, val: js.val, all: !slices.Contains(structuralNames, js.field)})
	}
	return out, any
}

// walkBytes is walkJSON's walk with the same records as walkTokens.
func walkBytes(d []byte) ([]walkRecord, bool) {
	var w jsonWalk
	any := w.run(d)
	var out []walkRecord
	for _, js := range w.strs {
		p := string(js.path)
		switch js.sep {
		case sepMember:
			p += "." + string(js.field)
		case sepElem:
			p += "[]"
		}
		b := "b:" + p + "#"
		for o := js.obj; o >= 0; o = w.objs[o].parent {
			b += string(w.objs[o].block) + "/"
		}
		out = append(out, walkRecord{f: "f:" + p, b: b, val: string(js.val), all: !inNames(structuralNames, js.field)})
	}
	return out, any
}

func checkWalk(t *testing.T, d []byte) {
	t.Helper()
	want, wantAny := walkTokens(d)
	got, gotAny := walkBytes(d)
	if gotAny != wantAny || !slices.Equal(got, want) {
		t.Fatalf("walk of %q:\n got %v %+v\nwant %v %+v", d, gotAny, got, wantAny, want)
	}
}

// walkSeeds are answers and fragments of them: every API's shape, SSE
// data, several documents in a row, escapes of every kind, and each way
// Token stops.
var walkSeeds = []string{
	`{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[{"type":"text","text":"hello"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":3,"output_tokens":5}}`,
	`{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop","logprobs":null}],"usage":{"prompt_tokens":4}}`,
	`{"type":"response.output_text.delta","item_id":"msg_1","output_index":0,"content_index":1,"delta":"ab"}`,
	`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hello "}}`,
	`{"a":[1,"x",{"index":-2.5e+3,"t":"y"},[true,false,null]],"b":{}}{"c":"d"} "e" 12 [] {}`,
	`{"t":"a\"b\\c\/d\b\f\n\r\t\u0041\u00e9\u20ac\ud83d\ude00\ud800\udc00x\ud800\u0041\udc00\ud83d"}`,
	"{\"t\":\"\xff\xfe\xc3\xa9\xed\xa0\x80\xef\xbf\xbd\xe2\x82\"}",
	`{"k\u0065y":"v","index":"i\n","item_id":"\u0000"}`,
	`[01]`, `{"index":01}`, `[1.]`, `[1e]`, `[-]`, `[1,]`, `{"a":1,}`, `{"a" "b"}`, `{1:2}`, `[tru]`, `truex`, `"a""b"`,
	`1"b"`, `{"a":"b"}x`, `{"a":1}}`, `]`, `"unterminated`, `{"a":"\x"}`, `{"a":"\u12"}`, "{\"a\":\"\x01\"}", `[nul`, ` `, ``,
	`{"a":[{"index":1,"b":[{"index":2,"t":"deep"}],"t":"after"}]}`, `{"":{"":[""]}}`, `[[["a"]],"b"]`, `-0.0E-0`, `{"a":-}`,
	"\t\r\n{\"a\" :\t\"b\" , \"c\" : [ 1 , 2 ] }\n",
}

func TestWalkJSONMatchesTokens(t *testing.T) {
	seeds := append([]string(nil), walkSeeds...)
	seeds = append(seeds, fakeprovider.AnthropicStream("claude-test")...)
	for _, s := range seeds {
		checkWalk(t, []byte(s))
		if i := strings.Index(s, "data: "); i >= 0 {
			checkWalk(t, []byte(s[i+6:]))
		}
	}
	// Mutations of the seeds: bytes dropped, doubled, replaced by JSON's
	// structural and escape bytes, and the seeds cut at every length.
	r := rand.New(rand.NewPCG(15, 15))
	alphabet := []byte("{}[]:,\"\\/ -+.0123456789eEtrufalsn\xff\xc3\x80bu")
	for _, s := range seeds {
		for cut := range len(s) + 1 {
			checkWalk(t, []byte(s[:cut]))
		}
		for range 300 {
			d := []byte(s)
			for range 1 + r.IntN(3) {
				if len(d) == 0 {
					break
				}
				i := r.IntN(len(d))
				switch r.IntN(3) {
				case 0:
					d = append(d[:i], d[i+1:]...)
				case 1:
					d = slices.Insert(d, i, d[i])
				default:
					d[i] = alphabet[r.IntN(len(alphabet))]
				}
			}
			checkWalk(t, d)
		}
	}
}

func FuzzWalkJSONTokens(f *testing.F) {
	for _, s := range walkSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, d []byte) {
		checkWalk(t, d)
	})
}

// TestUnquoteMatchesJSON: the walk's unquoting against encoding/json's on
// every string the walk accepts.
func TestUnquoteMatchesJSON(t *testing.T) {
	for _, s := range append(walkSeeds, `"\ud83d\ude00\udbff\udfff\udc00\ud800"`, "\"\xf4\x90\x80\x80\xc0\xaf\"") {
		d := []byte(s)
		for i := range d {
			if d[i] != '"' {
				continue
			}
			end, plain, ok := jsonStringEnd(d, i)
			if !ok {
				continue
			}
			var want string
			if err := json.Unmarshal(d[i:end], &want); err != nil {
				t.Fatalf("%q: encoding/json refused %q, which the walk accepts: %v", s, d[i:end], err)
			}
			var w jsonWalk
			if got := string(w.unquote(d[i+1:end-1], plain)); got != want {
				t.Fatalf("unquote %q = %q, want %q", d[i:end], got, want)
			}
		}
	}
}

// TestBase64String: the pre-effect header's encoding is the standard one,
// at every length around the chunk size.
func TestBase64String(t *testing.T) {
	b := make([]byte, 3000)
	for i := range b {
		b[i] = byte(i * 7)
	}
	for n := range len(b) {
		if got, want := base64String(b[:n]), base64.StdEncoding.EncodeToString(b[:n]); got != want {
			t.Fatalf("base64String of %d bytes = %q, want %q", n, got, want)
		}
	}
	sum := sha256.Sum256(b)
	if got, want := hexString(sum[:]), hex.EncodeToString(sum[:]); got != want {
		t.Fatalf("hexString = %q, want %q", got, want)
	}
}
