package strictjson

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"testing"

	"github.com/go-json-experiment/json/jsontext"
)

// oracleValidate is the validation pass as it was before it stopped
// copying names and numbers out of the decoder (a fresh decoder per
// document, every token's text taken with Token.String): Canonicalize
// and Decode must refuse exactly what it refuses, with the same error.
func oracleValidate(b []byte) error {
	if len(b) > MaxBytes {
		return &Error{Offset: -1, Reason: fmt.Sprintf("%v: %d bytes, limit %d", ErrTooLarge, len(b), MaxBytes), Err: ErrTooLarge}
	}
	dec := jsontext.NewDecoder(bytes.NewBuffer(b), jsontext.AllowDuplicateNames(false), jsontext.AllowInvalidUTF8(false))
	if err := oracleValue(dec); err != nil {
		return err
	}
	if _, err := dec.ReadToken(); err != io.EOF {
		if err == nil {
			return &Error{Offset: dec.InputOffset(), Reason: errTrailingData.Error(), Err: errTrailingData}
		}
		return &Error{Offset: -1, Reason: err.Error(), Err: err}
	}
	return nil
}

func oracleValue(dec *jsontext.Decoder) error {
	tok, err := dec.ReadToken()
	if err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return &Error{Offset: -1, Reason: err.Error(), Err: err}
	}
	switch tok.Kind() {
	case 'n', 't', 'f':
		return nil
	case '"':
		_ = tok.String()
		return nil
	case '0':
		s := tok.String()
		if _, err := strconv.ParseFloat(s, 64); err != nil {
			var ne *strconv.NumError
			if errors.As(err, &ne) && ne.Err == strconv.ErrRange {
				return &Error{Offset: dec.InputOffset(), Reason: fmt.Sprintf("%v: %.40q", ErrNumberRange, s), Err: ErrNumberRange}
			}
			return &Error{Offset: -1, Reason: err.Error(), Err: err}
		}
		return nil
	case '{', '[':
		if dec.StackDepth() > MaxDepth {
			return &Error{Offset: dec.InputOffset(), Reason: fmt.Sprintf("%v: limit %d", ErrTooDeep, MaxDepth), Err: ErrTooDeep}
		}
		end := jsontext.Kind(']')
		if tok.Kind() == '{' {
			end = '}'
		}
		for dec.PeekKind() != end {
			if tok.Kind() == '{' {
				name, err := dec.ReadToken()
				if err != nil {
					return &Error{Offset: -1, Reason: err.Error(), Err: err}
				}
				_ = name.String()
			}
			if err := oracleValue(dec); err != nil {
				return err
			}
		}
		if _, err := dec.ReadToken(); err != nil {
			return &Error{Offset: -1, Reason: err.Error(), Err: err}
		}
		return nil
	}
	return &Error{Offset: dec.InputOffset(), Reason: fmt.Sprintf("BUG: unexpected token kind %v", tok.Kind())}
}

func sameError(a, b error) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return a.Error() == b.Error()
}

// checkOracle holds walk, without and with the tree, to oracleValidate.
func checkOracle(t *testing.T, b []byte) {
	t.Helper()
	want := oracleValidate(b)
	if got := walk(b, nil); !sameError(got, want) {
		t.Fatalf("validating %q: got %v, oracle %v", b, got, want)
	}
	var out any
	if got := walk(b, &out); !sameError(got, want) {
		t.Fatalf("decoding %q: got %v, oracle %v", b, got, want)
	}
}

func TestValidateMatchesOracle(t *testing.T) {
	for _, s := range []string{
		`{"a":1}`, `{"a":1,"\u0061":2}`, `{"a":{"b":1,"b":2}}`, `{"a":{"b":1},"b":{"b":2}}`,
		`[1e999]`, `{"n":-1e400}`, `{"n":1e308}`, `{"n":1.7976931348623157e308}`, `{"n":1.8e308}`,
		`{"n":0.0000000000000000000000000000000000000001e-400}`, `{"n":123456789012345678901234567890123456789012345678901234567890}`,
		`{"a":1} {}`, `{"a":1} x`, `{"a":1}  `, `"\ud800"`, "\"\xff\"", "{\"\xff\":1}", `{"a":01}`, `{"a":-}`, `{"a":1.}`,
		`[` + string(bytes.Repeat([]byte("["), MaxDepth)) + string(bytes.Repeat([]byte("]"), MaxDepth+1)),
		string(bytes.Repeat([]byte("["), MaxDepth)) + string(bytes.Repeat([]byte("]"), MaxDepth)),
		`{"a":[1,2,{"b":null,"c":[true,false,"x",-0.5e-3]}],"d":{}}`, ``, ` `, `{`, `{"a"`, `{"a":`, `[1,]`, `{"a":1,}`,
	} {
		checkOracle(t, []byte(s))
	}
	// The pooled decoder keeps nothing from one document to the next: a
	// name seen in one is no duplicate in the next, and a refused one
	// leaves no state behind.
	for range 3 {
		checkOracle(t, []byte(`{"a":1,"a":2}`))
		checkOracle(t, []byte(`{"a":1}`))
		checkOracle(t, []byte(`[[[`))
		checkOracle(t, []byte(`{"a":1}`))
	}
}

func FuzzValidateOracle(f *testing.F) {
	for _, s := range []string{`{"a":1}`, `{"a":1,"\u0061":2}`, `[1e999,1]`, `{"a":[{"b":1}],"c":"\ud83d\ude00"}`, `1 2`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		checkOracle(t, b)
	})
}

func TestCanonicalizeAllocs(t *testing.T) {
	doc := benchDoc()
	if _, err := Canonicalize(doc); err != nil {
		t.Fatal(err)
	}
	// Before the validation pass stopped copying names and numbers out,
	// this document cost about 350 allocations; then about 40 (most of
	// them jsontext's canonical re-encoding of escaped strings). The
	// one-pass reader (canon.go) allocates the output only: 1, about 3
	// under the race detector, whose sync.Pool drops entries at random.
	if n := testing.AllocsPerRun(20, func() { _, _ = Canonicalize(doc) }); n > 8 {
		t.Errorf("Canonicalize of %d bytes: %.0f allocations, want at most 8", len(doc), n)
	}
}
