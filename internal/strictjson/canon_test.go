package strictjson

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"
)

// oracleCanonicalize is Canonicalize as it was before canon.go: walk's
// strict validation, then jsontext's Value.Canonicalize of a copy.
// Canonicalize must accept exactly what it accepts, write the same bytes
// and refuse with the same error.
func oracleCanonicalize(b []byte) ([]byte, error) {
	if err := walk(b, nil); err != nil {
		return nil, err
	}
	v := jsontext.Value(append([]byte(nil), b...))
	if err := v.Canonicalize(); err != nil {
		return nil, &Error{Offset: -1, Reason: err.Error(), Err: err}
	}
	return v, nil
}

func checkCanonOracle(t *testing.T, b []byte) {
	t.Helper()
	want, werr := oracleCanonicalize(b)
	got, err := Canonicalize(b)
	if !sameError(err, werr) {
		t.Fatalf("Canonicalize(%q): error %v, oracle %v", b, err, werr)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("Canonicalize(%q) = %q, oracle %q", b, got, want)
	}
}

// canonEdgeCases are documents at the edges of what is accepted and of
// what the canonical form rewrites.
func canonEdgeCases() []string {
	deep := func(n int, open, close string) string {
		return strings.Repeat(open, n) + "1" + strings.Repeat(close, n)
	}
	return []string{
		``, ` `, `{`, `}`, `[`, `]`, `"`, `""`, `{}`, `[]`, ` {} `, "\t[\r\n]\n", "\v[]", "\f[]", "\u00a0[]",
		"\xef\xbb\xbf{}", "{}\xef\xbb\xbf", "{}\x00", `{}{}`, `[] []`, `1 2`, `"a""b"`, `nul`, `truex`, `[truex]`, `[true,]`,
		`true`, `false`, `null`, `tRue`, `[null,true,false]`, `{"a":nul}`,
		// Numbers.
		`0`, `-0`, `-0.0`, `0.0`, `-`, `01`, `-01`, `1.`, `.1`, `1e`, `1e+`, `1E-`, `+1`, `1.5e`, `0x10`, `1_000`,
		`[1x]`, `1x`, `[1,2]`, `1.0`, `1e3`, `1E2`, `2.50`, `0.000001`, `0.0000001`, `1e-7`, `1e20`, `1e21`, `-1e21`,
		`123456789012345`, `1234567890123456`, `12345678901234567`, `-123456789012345`, `-12345678901234`,
		`9007199254740993`, `123456789012345678901`, `1e308`, `1.7976931348623157e308`, `1.7976931348623159e308`,
		`1.8e308`, `1e309`, `-1e309`, `1e400`, `[1e999]`, `1e-400`, `-1e-400`, `4.9e-324`, `2.4e-324`, `5e-324`,
		`1` + strings.Repeat("0", 400), `0.` + strings.Repeat("0", 400) + `1`, `1.` + strings.Repeat("9", 40),
		`-0e0`, `0e-0`, `1E+2`, `100e-2`, `0.1`, `0.30000000000000004`, `[1.0,1e3,-0,0.000001,1e-7,1e21,123456789012345678901,1E2,2.50]`,
		// Strings.
		`"\u0000\u001f\u007f\/\b\t"`, `"\u0008\u000c\u000a\u000d\u0009"`, `"\u001F\u001f\u00e9\u00E9"`, `"\"\\\/"`,
		`"\u0022\u005c\u002f"`, `"\a"`, `"\x41"`, `"\u12"`, `"\u12g4"`, `"\`, `"\u"`, `"abc`, "\"a\tb\"", "\"a\x7fb\"",
		"\"\x00\"", "\"\x1f\"", "\"\xff\"", "\"\xc0\xaf\"", "\"\xed\xa0\x80\"", "\"\xf4\x90\x80\x80\"", "\"\xe2\x82\"",
		"\"\xef\xbf\xbd\"", "\"\xe2\x80\xa8\xe2\x80\xa9\"", `"\u2028\u2029"`, `"\ufffd\uffff\ufeff"`, "\"<>&\"",
		`"\ud83d\ude00"`, `"\ud800"`, `"\udc00"`, `"\udc00\ud800"`, `"\ud800\ud800"`, `"\ud800x"`, `"\ud800\u0041"`,
		`"\ud800\n"`, `"\ud800\udc0"`, `"\uD83D\uDE00"`, `"\ud800\udc00"`, `"\udbff\udfff"`, "\"😀\"",
		// Objects: order, duplicates, names.
		`{"b":1,"a":2,"€":3,"\r":4,"A":5}`, `{"z":{"y":1,"x":[{"d":1,"c":2}]}}`, `{"a":1,"a":2}`, `{"a":1,"\u0061":2}`,
		`{"é":1,"\u00e9":2}`, `{"x":{"model":"a","mod\u0065l":"b"}}`, `{"a":{"b":1,"b":2}}`, `{"a":{"b":1},"b":{"b":2}}`,
		`{"\ufb33":1,"\ud83d\ude00":2}`, `{"😀":1,"😁":2,"\ue000":3,"\uffff":4,"\u0100":5}`, `{"😁":1,"😀":2}`,
		`{"\ud83d\ude00":1,"😀":2}`, `{"ab":1,"a":2,"":3}`, `{"":1,"":2}`, `{"a\u0000":1,"a":2}`, `{"\"":1,"\\":2,"/":3,"\/":4}`,
		`{"a":1,}`, `{,}`, `{"a"}`, `{"a":}`, `{"a" 1}`, `{"a":1 "b":2}`, `{1:1}`, `{'a':1}`, `{"a":1]`, `[1}`,
		`{"\ud800":1}`, "{\"\xff\":1}", "{\"a\xc3\":1}", `{"b":{"a":[]},"a":{"d":[1.0,2e3,-0],"c":"\u00e9"}}`,
		`{"c":3,"b":2,"a":1,"c":4}`, `{"c":{"z":1,"y":2},"b":[{"q":1,"p":2}],"a":"\n"}`,
		// Depth.
		deep(MaxDepth, "[", "]"), deep(MaxDepth+1, "[", "]"), deep(MaxDepth, `{"a":`, "}"), deep(MaxDepth+1, `{"a":`, "}"),
		deep(MaxDepth-1, "[", "]"), strings.Repeat("[", MaxDepth+1), strings.Repeat("[", 10000),
	}
}

// corpusInputs reads the []byte inputs of this package's fuzz corpora.
func corpusInputs(t testing.TB) [][]byte {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", "fuzz", "*", "*"))
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for _, name := range files {
		data, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			lit, ok := strings.CutPrefix(line, "[]byte(")
			if !ok || !strings.HasSuffix(lit, ")") {
				continue
			}
			s, err := strconv.Unquote(strings.TrimSuffix(lit, ")"))
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			out = append(out, []byte(s))
		}
	}
	if len(out) == 0 {
		t.Fatal("no fuzz corpus found under testdata/fuzz")
	}
	return out
}

func TestCanonicalizeMatchesOracle(t *testing.T) {
	inputs := [][]byte{benchDoc()}
	for _, s := range canonEdgeCases() {
		inputs = append(inputs, []byte(s))
	}
	inputs = append(inputs, corpusInputs(t)...)
	for _, b := range inputs {
		checkCanonOracle(t, b)
		// The same document with whitespace around every token, and cut
		// short at every byte (only for the short ones).
		checkCanonOracle(t, spaced(b))
		if len(b) < 300 {
			for i := range b {
				checkCanonOracle(t, b[:i])
			}
		}
	}
	// The pooled state keeps nothing from one document to the next.
	for range 3 {
		checkCanonOracle(t, []byte(`{"b":{"\u0061":1,"a":2},"a":1}`))
		checkCanonOracle(t, []byte(`{"b":{"\u0061":1},"a":1}`))
		checkCanonOracle(t, []byte(`[[[`))
		checkCanonOracle(t, []byte(`{"a":1}`))
	}
}

// spaced inserts whitespace after every structural byte outside strings.
func spaced(b []byte) []byte {
	var out []byte
	in := false
	for i := 0; i < len(b); i++ {
		c := b[i]
		out = append(out, c)
		switch {
		case in && c == '\\' && i+1 < len(b):
			i++
			out = append(out, b[i])
		case c == '"':
			in = !in
		case !in && strings.IndexByte("{}[]:,", c) >= 0:
			out = append(out, " \t\r\n"[i%4])
		}
	}
	return out
}

func TestCompareUTF16(t *testing.T) {
	names := []string{"", "a", "ab", "b", "\u007f", "\u0080", "é", "\u07ff", "\u0800", "\ud7ff", "\ue000", "\ufb33", "\uffff",
		"\U00010000", "😀", "😁", "\U0010ffff", "a😀", "a\uffff", "a\U0010ffff"}
	for _, x := range names {
		for _, y := range names {
			got, want := sign(compareUTF16([]byte(x), []byte(y))), sign(compareUTF16Simple(x, y))
			if got != want {
				t.Errorf("compareUTF16(%q, %q) = %d, want %d", x, y, got, want)
			}
		}
	}
}

func sign(n int) int {
	switch {
	case n < 0:
		return -1
	case n > 0:
		return 1
	}
	return 0
}

// compareUTF16Simple compares by UTF-16 code units, by converting.
func compareUTF16Simple(x, y string) int {
	a, b := utf16.Encode([]rune(x)), utf16.Encode([]rune(y))
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			return int(a[i]) - int(b[i])
		}
	}
	return len(a) - len(b)
}

// FuzzCanonicalizeOracle holds Canonicalize to oracleCanonicalize on any
// input: the same acceptance, the same bytes, the same error. It also
// checks compareUTF16 on the input's two halves.
func FuzzCanonicalizeOracle(f *testing.F) {
	for _, s := range canonEdgeCases() {
		f.Add([]byte(s))
	}
	for _, b := range corpusInputs(f) {
		f.Add(b)
	}
	f.Add(benchDoc())
	f.Fuzz(func(t *testing.T, b []byte) {
		checkCanonOracle(t, b)
		x, y := b[:len(b)/2], b[len(b)/2:]
		if utf8.Valid(x) && utf8.Valid(y) {
			if got, want := sign(compareUTF16(x, y)), sign(compareUTF16Simple(string(x), string(y))); got != want {
				t.Fatalf("compareUTF16(%q, %q) = %d, want %d", x, y, got, want)
			}
		}
	})
}
