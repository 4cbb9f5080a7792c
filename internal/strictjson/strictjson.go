// Package strictjson decodes JSON strictly (RFC 8259, with duplicate object
// names, invalid UTF-8, lone surrogates and trailing data refused) and
// encodes it canonically (RFC 8785, JCS). Decode wraps
// github.com/go-json-experiment/json/jsontext, whose defaults already refuse
// duplicate names (compared after unescaping, so "a" and "\u0061" collide),
// invalid UTF-8 and unpaired surrogate escapes. Canonicalize, which the
// broker runs on every request body and the journal on every record, reads
// the document once with a reader of its own (canon.go) that accepts
// exactly what that strict decoding accepts and writes exactly what
// jsontext's canonical form is; the jsontext pair it replaced is its
// oracle in the tests (FuzzCanonicalizeOracle). It is written here
// because jsontext offers the two steps only as two passes, the second
// re-reading and re-checking the first's input, in about four times the
// time (BenchmarkCanonicalize). A document it refuses is read again by the
// jsontext decoding, whose error it returns.
//
// On top of that strict decoding this package adds what a security
// boundary needs:
//   - a size cap (MaxBytes) and a nesting cap (MaxDepth), checked before any
//     tree is built;
//   - numbers outside the IEEE 754 double range (e.g. 1e400) are refused,
//     because RFC 8785 would otherwise silently clamp them to ±MaxFloat64
//     and the bytes we sign would say something the client did not;
//   - a decoded tree (Decode) whose numbers keep their exact text (Number),
//     and an encoder (Encode) that turns such a tree back into canonical
//     bytes.
//
// Numbers inside the double range are canonicalized as RFC 8785 requires:
// they are parsed as IEEE 754 doubles and printed in the ECMAScript form, so
// 1.0 becomes 1 and an integer above 2^53 may be rounded
// (12345678901234567890 becomes 12345678901234567000). The canonical bytes
// are what moat signs and forwards, so what is recorded is exactly what the
// provider receives.
package strictjson

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/go-json-experiment/json/jsontext"
)

// MaxDepth caps nesting so that hostile input cannot exhaust the stack.
// The top-level value is depth 1 when it is an object or array.
const MaxDepth = 128

// MaxBytes caps the size of a document (32 MiB, the largest request body
// Anthropic's Messages API accepts).
const MaxBytes = 32 << 20

// Number is a JSON number, kept as its exact text.
type Number string

// Int64 returns n as an int64 if it is an integer written without fraction
// or exponent and in range.
func (n Number) Int64() (int64, error) { return strconv.ParseInt(string(n), 10, 64) }

// Float64 returns n as a float64.
func (n Number) Float64() (float64, error) { return strconv.ParseFloat(string(n), 64) }

// Error is the error type of this package. Offset is the byte offset in the
// input at which the problem was found, or -1.
type Error struct {
	Offset int64
	Reason string
	Err    error
}

// Error returns the reason, stripped of the "jsontext: " prefix of the
// underlying library.
func (e *Error) Error() string {
	reason := strings.TrimPrefix(e.Reason, "jsontext: ")
	if e.Offset >= 0 {
		return fmt.Sprintf("strictjson: %s (at byte %d)", reason, e.Offset)
	}
	return "strictjson: " + reason
}

func (e *Error) Unwrap() error { return e.Err }

// Sentinel errors, matched with errors.Is.
var (
	ErrTooLarge     = errors.New("document too large")
	ErrTooDeep      = errors.New("nesting too deep")
	ErrNumberRange  = errors.New("number out of range")
	ErrUnsupported  = errors.New("unsupported Go value")
	errTrailingData = errors.New("trailing data after top-level value")
)

// Canonicalize validates b strictly and returns its RFC 8785 canonical form.
// It reads b once (canon.go); a refused document is read again by the
// jsontext walk that Decode uses, so that the error is that walk's.
func Canonicalize(b []byte) ([]byte, error) {
	if len(b) > MaxBytes {
		return nil, tooLarge(len(b))
	}
	if out, ok := canon(b); ok {
		return out, nil
	}
	if err := walk(b, nil); err != nil {
		return nil, err
	}
	// canon refused what walk accepts: refuse it (the two are held to the
	// same answers by FuzzCanonicalizeOracle).
	return nil, &Error{Offset: -1, Reason: "BUG: the canonical encoder refused a document the strict decoder accepts"}
}

func tooLarge(n int) *Error {
	return &Error{Offset: -1, Reason: fmt.Sprintf("%v: %d bytes, limit %d", ErrTooLarge, n, MaxBytes), Err: ErrTooLarge}
}

// Decode parses b strictly. Objects become map[string]any, arrays []any,
// strings string, numbers Number, booleans bool and null nil.
func Decode(b []byte) (any, error) {
	var out any
	if err := walk(b, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// Encode returns the RFC 8785 canonical encoding of v, a tree of the types
// Decode produces (map[string]any, []any, string, Number, bool, nil).
// Float64, int and int64 are accepted too, for convenience.
func Encode(v any) ([]byte, error) {
	var buf []byte
	buf, err := appendValue(buf, v, 0)
	if err != nil {
		return nil, err
	}
	return Canonicalize(buf)
}

func appendValue(buf []byte, v any, depth int) ([]byte, error) {
	if depth > MaxDepth {
		return nil, &Error{Offset: -1, Reason: ErrTooDeep.Error(), Err: ErrTooDeep}
	}
	switch v := v.(type) {
	case nil:
		return append(buf, "null"...), nil
	case bool:
		return strconv.AppendBool(buf, v), nil
	case string:
		return jsontext.AppendQuote(buf, v)
	case Number:
		return append(buf, v...), nil
	case int:
		return strconv.AppendInt(buf, int64(v), 10), nil
	case int64:
		return strconv.AppendInt(buf, v, 10), nil
	case float64:
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return nil, &Error{Offset: -1, Reason: "NaN or Inf", Err: ErrNumberRange}
		}
		return strconv.AppendFloat(buf, v, 'g', -1, 64), nil
	case []any:
		buf = append(buf, '[')
		for i, e := range v {
			if i > 0 {
				buf = append(buf, ',')
			}
			var err error
			if buf, err = appendValue(buf, e, depth+1); err != nil {
				return nil, err
			}
		}
		return append(buf, ']'), nil
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys) // canonical order is applied by Canonicalize; this keeps output deterministic
		buf = append(buf, '{')
		for i, k := range keys {
			if i > 0 {
				buf = append(buf, ',')
			}
			var err error
			if buf, err = jsontext.AppendQuote(buf, k); err != nil {
				return nil, err
			}
			buf = append(buf, ':')
			if buf, err = appendValue(buf, v[k], depth+1); err != nil {
				return nil, err
			}
		}
		return append(buf, '}'), nil
	default:
		return nil, &Error{Offset: -1, Reason: fmt.Sprintf("cannot encode %T", v), Err: ErrUnsupported}
	}
}

// walk validates b token by token (size, depth, number range, and all of
// jsontext's strict checks) and, when out is non-nil, builds the tree.
// Validation alone (out nil) allocates nothing per token: member names
// and strings are checked by the decoder without being copied out, and a
// number's text is read in place.
func walk(b []byte, out *any) error {
	if len(b) > MaxBytes {
		return tooLarge(len(b))
	}
	d := getDecoder(b)
	defer putDecoder(d)
	dec := &d.dec
	v, err := readValue(dec, out != nil)
	if err != nil {
		return err
	}
	// Anything but whitespace after the value is refused.
	if _, err := dec.ReadToken(); err != io.EOF {
		if err == nil {
			return &Error{Offset: dec.InputOffset(), Reason: errTrailingData.Error(), Err: errTrailingData}
		}
		return &Error{Offset: -1, Reason: err.Error(), Err: err} // jsontext errors carry their offset
	}
	if out != nil {
		*out = v
	}
	return nil
}

// decoder is a strict jsontext.Decoder with the buffer it reads, reused
// through a pool so that its state (the name sets of the objects it is
// in, its token stack) keeps its storage from one document to the next.
type decoder struct {
	buf bytes.Buffer
	dec jsontext.Decoder
}

// strict is the decoder's configuration. jsontext's defaults already
// refuse duplicate names and invalid UTF-8; they are stated so that no
// change of default can weaken them.
var strict = []jsontext.Options{jsontext.AllowDuplicateNames(false), jsontext.AllowInvalidUTF8(false)}

var decoders = sync.Pool{New: func() any { return new(decoder) }}

func getDecoder(b []byte) *decoder {
	d := decoders.Get().(*decoder)
	d.buf = *bytes.NewBuffer(b) // jsontext reads a bytes.Buffer in place
	d.dec.Reset(&d.buf, strict...)
	return d
}

// putDecoder returns d to the pool, pointing at nothing of the document.
func putDecoder(d *decoder) {
	d.buf = bytes.Buffer{}
	d.dec.Reset(&d.buf, strict...)
	decoders.Put(d)
}

// checkNumber refuses the number s (valid JSON, just read by dec) when
// it is outside the double range.
func checkNumber(dec *jsontext.Decoder, s string) error {
	if _, err := strconv.ParseFloat(s, 64); err != nil {
		var ne *strconv.NumError
		if errors.As(err, &ne) && ne.Err == strconv.ErrRange {
			return &Error{Offset: dec.InputOffset(), Reason: fmt.Sprintf("%v: %.40q", ErrNumberRange, s), Err: ErrNumberRange}
		}
		return &Error{Offset: -1, Reason: err.Error(), Err: err} // jsontext errors carry their offset
	}
	return nil
}

func readValue(dec *jsontext.Decoder, build bool) (any, error) {
	if !build && dec.PeekKind() == '0' {
		// The number's bytes, in the decoder's buffer: string(raw) is
		// passed to ParseFloat, which keeps nothing of it, so short
		// numbers are converted without an allocation.
		raw, err := dec.ReadValue()
		if err != nil {
			return nil, &Error{Offset: -1, Reason: err.Error(), Err: err} // jsontext errors carry their offset
		}
		return nil, checkNumber(dec, string(raw))
	}
	tok, err := dec.ReadToken()
	if err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, &Error{Offset: -1, Reason: err.Error(), Err: err} // jsontext errors carry their offset
	}
	switch tok.Kind() {
	case 'n':
		return nil, nil
	case 't':
		return true, nil
	case 'f':
		return false, nil
	case '"':
		if !build {
			return nil, nil
		}
		return tok.String(), nil
	case '0':
		s := tok.String()
		if err := checkNumber(dec, s); err != nil {
			return nil, err
		}
		return Number(s), nil
	case '{', '[':
		if dec.StackDepth() > MaxDepth {
			return nil, &Error{Offset: dec.InputOffset(), Reason: fmt.Sprintf("%v: limit %d", ErrTooDeep, MaxDepth), Err: ErrTooDeep}
		}
		if tok.Kind() == '{' {
			return readObject(dec, build)
		}
		return readArray(dec, build)
	default:
		return nil, &Error{Offset: dec.InputOffset(), Reason: fmt.Sprintf("BUG: unexpected token kind %v", tok.Kind())}
	}
}

func readObject(dec *jsontext.Decoder, build bool) (any, error) {
	var m map[string]any
	if build {
		m = map[string]any{}
	}
	for dec.PeekKind() != '}' {
		tok, err := dec.ReadToken()
		if err != nil {
			return nil, &Error{Offset: -1, Reason: err.Error(), Err: err} // jsontext errors carry their offset
		}
		if !build {
			// The decoder has checked the name (UTF-8, not a duplicate).
			if _, err := readValue(dec, false); err != nil {
				return nil, err
			}
			continue
		}
		name := tok.String()
		v, err := readValue(dec, build)
		if err != nil {
			return nil, err
		}
		m[name] = v
	}
	if _, err := dec.ReadToken(); err != nil {
		return nil, &Error{Offset: -1, Reason: err.Error(), Err: err} // jsontext errors carry their offset
	}
	if !build {
		return nil, nil
	}
	return m, nil
}

func readArray(dec *jsontext.Decoder, build bool) (any, error) {
	var a []any
	if build {
		a = []any{}
	}
	for dec.PeekKind() != ']' {
		v, err := readValue(dec, build)
		if err != nil {
			return nil, err
		}
		if build {
			a = append(a, v)
		}
	}
	if _, err := dec.ReadToken(); err != nil {
		return nil, &Error{Offset: -1, Reason: err.Error(), Err: err} // jsontext errors carry their offset
	}
	if !build {
		return nil, nil
	}
	return a, nil
}
