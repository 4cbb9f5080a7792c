package strictjson

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestCanonicalize(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want string
	}{
		{"key order by UTF-16 code units", `{"b":1,"a":2,"€":3,"\r":4,"A":5}`, `{"\r":4,"A":5,"a":2,"b":1,"€":3}`},
		{"nested key order", `{"z":{"y":1,"x":[{"d":1,"c":2}]}}`, `{"z":{"x":[{"c":2,"d":1}],"y":1}}`},
		{"whitespace removed", " {\n\t\"a\" : [ 1 , 2 ] } \n", `{"a":[1,2]}`},
		{"number forms", `[1.0,1e3,-0,0.000001,1e-7,1e21,123456789012345678901,1E2,2.50]`, `[1,1000,0,0.000001,1e-7,1e+21,123456789012345680000,100,2.5]`},
		{"escaped keys unescaped", `{"\u0061b":1,"\u00e9":2}`, `{"ab":1,"é":2}`},
		{"control chars escaped minimally", `"\u0000\u001f\u007f\/\b\t"`, `"\u0000\u001f` + "\x7f" + `/\b\t"`},
		{"literals", `[true,false,null]`, `[true,false,null]`},
		{"surrogate pair", `"\ud83d\ude00"`, `"😀"`},
		{"utf-16 ordering: supplementary before BMP high", `{"\ufb33":1,"\ud83d\ude00":2}`, `{"😀":2,"דּ":1}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Canonicalize([]byte(tt.in))
			if err != nil {
				t.Fatalf("Canonicalize(%q): %v", tt.in, err)
			}
			if string(got) != tt.want {
				t.Fatalf("Canonicalize(%q) = %s, want %s", tt.in, got, tt.want)
			}
			again, err := Canonicalize(got)
			if err != nil || !bytes.Equal(again, got) {
				t.Fatalf("not idempotent: %s -> %s, %v", got, again, err)
			}
		})
	}
}

func TestRefused(t *testing.T) {
	tests := []struct {
		name  string
		in    string
		valid string // the closest variant that is accepted
		is    error
	}{
		{"duplicate key", `{"a":1,"a":2}`, `{"a":1,"b":2}`, nil},
		{"duplicate key via escape", `{"a":1,"\u0061":2}`, `{"a":1,"\u0062":2}`, nil},
		{"duplicate key via escaped non-ASCII", `{"é":1,"\u00e9":2}`, `{"é":1,"\u00e8":2}`, nil},
		{"duplicate nested", `{"x":{"model":"a","mod\u0065l":"b"}}`, `{"x":{"model":"a"}}`, nil},
		{"invalid UTF-8 in string", "\"\xff\"", `"\u00ff"`, nil},
		{"invalid UTF-8 in key", "{\"a\xc3\":1}", `{"aé":1}`, nil},
		{"overlong UTF-8", "\"\xc0\xaf\"", `"/"`, nil},
		{"lone high surrogate", `"\ud800"`, `"\ud800\udc00"`, nil},
		{"lone low surrogate", `"\udc00"`, `"\ud800\udc00"`, nil},
		{"reversed surrogates", `"\udc00\ud800"`, `"\ud800\udc00"`, nil},
		{"lone surrogate in key", `{"\ud800":1}`, `{"\ud800\udc00":1}`, nil},
		{"trailing data", `{"a":1} {"a":2}`, `{"a":1} `, nil},
		{"trailing garbage", `{"a":1}x`, `{"a":1}`, nil},
		{"trailing comma", `[1,2,]`, `[1,2]`, nil},
		{"trailing NUL", "{}\x00", "{} \r\n\t", nil},
		{"byte order mark", "\xef\xbb\xbf{}", "{}", nil},
		{"leading zero", `01`, `1`, nil},
		{"NaN", `NaN`, `0`, nil},
		{"number overflow", `1e400`, `1e300`, ErrNumberRange},
		{"negative overflow", `[-1e309]`, `[-1e308]`, ErrNumberRange},
		{"single quotes", `{'a':1}`, `{"a":1}`, nil},
		{"raw control char", "\"a\tb\"", `"a\tb"`, nil},
		{"empty", ``, `null`, nil},
		{"too deep", strings.Repeat("[", MaxDepth+1) + strings.Repeat("]", MaxDepth+1), strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth), ErrTooDeep},
		{"too deep objects", strings.Repeat(`{"a":`, MaxDepth+1) + "1" + strings.Repeat("}", MaxDepth+1), strings.Repeat(`{"a":`, MaxDepth) + "1" + strings.Repeat("}", MaxDepth), ErrTooDeep},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for name, f := range map[string]func([]byte) error{
				"Canonicalize": func(b []byte) error { _, err := Canonicalize(b); return err },
				"Decode":       func(b []byte) error { _, err := Decode(b); return err },
			} {
				err := f([]byte(tt.in))
				if err == nil {
					t.Errorf("%s(%q) accepted, want refusal", name, tt.in)
				} else if tt.is != nil && !errors.Is(err, tt.is) {
					t.Errorf("%s(%q) = %v, want errors.Is %v", name, tt.in, err, tt.is)
				}
				if err := f([]byte(tt.valid)); err != nil {
					t.Errorf("%s(%q) (valid variant) = %v, want accepted", name, tt.valid, err)
				}
			}
		})
	}
}

func TestTooLarge(t *testing.T) {
	ok := make([]byte, MaxBytes)
	ok[0], ok[len(ok)-1] = '"', '"'
	for i := 1; i < len(ok)-1; i++ {
		ok[i] = 'a'
	}
	if _, err := Canonicalize(ok); err != nil {
		t.Fatalf("document of exactly MaxBytes refused: %v", err)
	}
	big := append(ok[:len(ok)-1:len(ok)-1], 'a', '"')
	if _, err := Canonicalize(big); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("got %v, want ErrTooLarge", err)
	}
	if _, err := Decode(big); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("got %v, want ErrTooLarge", err)
	}
}

func TestDecode(t *testing.T) {
	got, err := Decode([]byte(`{"a":[1.50,"x",true,null,{"\u0062":-0}],"n":12345678901234567890}`))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"a": []any{Number("1.50"), "x", true, nil, map[string]any{"b": Number("-0")}},
		"n": Number("12345678901234567890"),
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %#v, want %#v", got, want)
	}
	if _, err := Number("1.5").Int64(); err == nil {
		t.Errorf("Number(1.5).Int64() accepted")
	}
	if n, err := Number("8192").Int64(); err != nil || n != 8192 {
		t.Errorf("Number(8192).Int64() = %d, %v", n, err)
	}
}

func TestEncode(t *testing.T) {
	in := `{"b":[1.0,"\u00e9",{"y":null,"x":false}],"a":"\ud83d\ude00","c":1e2}`
	v, err := Decode([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	got, err := Encode(v)
	if err != nil {
		t.Fatal(err)
	}
	want, err := Canonicalize([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("Encode = %s, want %s", got, want)
	}
	if _, err := Encode(map[string]any{"x": struct{}{}}); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("Encode(struct) = %v, want ErrUnsupported", err)
	}
	if got, err := Encode(map[string]any{"n": 8192, "f": 0.5}); err != nil || string(got) != `{"f":0.5,"n":8192}` {
		t.Fatalf("Encode(ints) = %s, %v", got, err)
	}
}

func FuzzCanonicalize(f *testing.F) {
	for _, s := range []string{`{"a":1}`, `[1.0,1e21,"\u00e9"]`, `{"a":1,"\u0061":2}`, `"\ud800"`, `{"b":{"a":[]}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := Canonicalize(b)
		if err != nil {
			if _, derr := Decode(b); derr == nil {
				t.Fatalf("Canonicalize refused %q (%v) but Decode accepted it", b, err)
			}
			return
		}
		c2, err := Canonicalize(c)
		if err != nil {
			t.Fatalf("canonical form %q refused: %v", c, err)
		}
		if !bytes.Equal(c, c2) {
			t.Fatalf("not idempotent: %q -> %q -> %q", b, c, c2)
		}
	})
}

func FuzzDecode(f *testing.F) {
	for _, s := range []string{`{"a":[1,2,{"b":null}]}`, `"x"`, `{"a":1} 2`, "\"\xff\"", `[[[[]]]]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := Decode(b)
		if err != nil {
			return
		}
		enc, err := Encode(v)
		if err != nil {
			t.Fatalf("Encode(Decode(%q)): %v", b, err)
		}
		c, err := Canonicalize(b)
		if err != nil {
			t.Fatalf("Decode accepted %q but Canonicalize refused: %v", b, err)
		}
		if !bytes.Equal(enc, c) {
			t.Fatalf("Encode(Decode(x)) = %q, Canonicalize(x) = %q", enc, c)
		}
	})
}

func benchDoc() []byte {
	var b strings.Builder
	b.WriteString(`{"model":"claude-sonnet-4-5","max_tokens":1024,"messages":[`)
	for i := 0; b.Len() < 8<<10; i++ {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString(`{"role":"user","content":[{"type":"text","text":"Please refactor the function below so that it handles errors and returns early. \u00e9\n"},{"type":"tool_result","tool_use_id":"toolu_01","content":"exit status 0","is_error":false}]}`)
	}
	b.WriteString(`],"temperature":0.7}`)
	return []byte(b.String())
}

func BenchmarkCanonicalize(b *testing.B) {
	doc := benchDoc()
	b.SetBytes(int64(len(doc)))
	for b.Loop() {
		if _, err := Canonicalize(doc); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecode(b *testing.B) {
	doc := benchDoc()
	b.SetBytes(int64(len(doc)))
	for b.Loop() {
		if _, err := Decode(doc); err != nil {
			b.Fatal(err)
		}
	}
}

func TestErrorMessages(t *testing.T) {
	for in, want := range map[string]string{
		`{"a":1,"\u0061":2}`: `strictjson: duplicate object member name "a"`,
		`{"a":1} {}`:         `strictjson: trailing data after top-level value (at byte 9)`,
		`{"a":1} x`:          `strictjson: invalid character 'x'`,
		`[1e999]`:            `strictjson: number out of range: "1e999"`,
	} {
		_, err := Decode([]byte(in))
		if err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("Decode(%s) error = %v, want prefix %q", in, err, want)
		}
	}
}
