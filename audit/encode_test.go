package audit

import (
	"bytes"
	"fmt"
	"math"
	"math/rand"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// recordTypeNames are the known record types, sorted.
func recordTypeNames() []string {
	var names []string
	for k := range recordTypes {
		names = append(names, k)
	}
	slices.Sort(names)
	return names
}

// zeroRecord returns the zero record of type typ (decoded from {}).
func zeroRecord(t testing.TB, typ string) Record {
	t.Helper()
	r, err := recordTypes[typ]([]byte(`{}`))
	if err != nil {
		t.Fatalf("%s: decoding {}: %v", typ, err)
	}
	return r
}

// filler sets every field of a record, at any depth, from rng and, for
// strings, from text (the fuzzer's input), so that every member of every
// record type is written: strings with escapes, controls, U+2028,
// supplementary characters and invalid UTF-8; integers small, at the
// edges of MaxExactInt and beyond them; slices nil, empty and full.
type filler struct {
	rng  *rand.Rand
	text string
}

var intEdges = []int64{0, 1, -1, MaxExactInt, -MaxExactInt, MaxExactInt + 1, -MaxExactInt - 1, math.MaxInt64, math.MinInt64, 1 << 31, 4242}

func (f *filler) str() string {
	if f.text != "" && f.rng.Intn(2) == 0 {
		i := f.rng.Intn(len(f.text))
		return f.text[i:min(len(f.text), i+f.rng.Intn(64))]
	}
	parts := []string{"a", "é", "\x00", "\n", `"`, `\`, "<&>", "\u2028", "\U0001F600", "\uE000", "\xff", "moat: refused: x", "/usr/bin/python3", strings.Repeat("c", 64)}
	var b strings.Builder
	for range f.rng.Intn(5) {
		b.WriteString(parts[f.rng.Intn(len(parts))])
	}
	return b.String()
}

func (f *filler) int() int64 {
	switch f.rng.Intn(4) {
	case 0:
		return intEdges[f.rng.Intn(len(intEdges))]
	case 1:
		return f.rng.Int63n(2*MaxExactInt+1) - MaxExactInt
	}
	return f.rng.Int63n(2000) - 10
}

// exact reports whether f should keep integers exact (most records).
func (f *filler) fill(v reflect.Value, depth int, exact bool) {
	switch v.Kind() {
	case reflect.String:
		v.SetString(f.str())
	case reflect.Bool:
		v.SetBool(f.rng.Intn(2) == 0)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		n := f.int()
		if exact && (n > MaxExactInt || n < -MaxExactInt) {
			n = 7
		}
		if v.OverflowInt(n) {
			n = int64(f.rng.Intn(100))
		}
		v.SetInt(n)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		n := uint64(f.int())
		if exact && n > MaxExactInt {
			n = 7
		}
		if v.OverflowUint(n) {
			n = uint64(f.rng.Intn(100))
		}
		v.SetUint(n)
	case reflect.Float32, reflect.Float64:
		v.SetFloat([]float64{0, 1, 0.5, 1e21, -3, 1e-7}[f.rng.Intn(6)])
	case reflect.Struct:
		if v.Type() == reflect.TypeFor[time.Time]() {
			v.Set(reflect.ValueOf(time.Unix(f.rng.Int63n(1<<32), f.rng.Int63n(1e9)).UTC()))
			return
		}
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				f.fill(v.Field(i), depth+1, exact)
			}
		}
	case reflect.Slice:
		switch k := f.rng.Intn(4); {
		case k == 0 || depth > 6:
			v.SetZero()
		case k == 1:
			v.Set(reflect.MakeSlice(v.Type(), 0, 0))
		default:
			s := reflect.MakeSlice(v.Type(), 1+f.rng.Intn(3), 3)
			for i := range s.Len() {
				f.fill(s.Index(i), depth+1, exact)
			}
			v.Set(s)
		}
	case reflect.Map:
		if f.rng.Intn(3) == 0 || depth > 6 {
			v.SetZero()
			return
		}
		m := reflect.MakeMap(v.Type())
		for range f.rng.Intn(4) {
			k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
			f.fill(k, depth+1, exact)
			f.fill(e, depth+1, exact)
			m.SetMapIndex(k, e)
		}
		v.Set(m)
	case reflect.Pointer:
		if f.rng.Intn(3) == 0 || depth > 6 {
			v.SetZero()
			return
		}
		p := reflect.New(v.Type().Elem())
		f.fill(p.Elem(), depth+1, exact)
		v.Set(p)
	case reflect.Interface:
		// Left nil: no record has a member of an open type.
	default:
		panic(fmt.Sprintf("filler: unhandled %s", v.Type()))
	}
}

// randomRecord returns a record of type typ with every field filled.
func randomRecord(t testing.TB, typ string, f *filler, exact bool) Record {
	t.Helper()
	r := zeroRecord(t, typ)
	v := reflect.New(reflect.TypeOf(r)).Elem()
	f.fill(v, 0, exact)
	return v.Interface().(Record)
}

var memberName = regexp.MustCompile(`member \S+ is \S+, not`)

// checkSameEncoding holds encodePayload to encodePayloadTree: the same
// bytes, or the same error.
func checkSameEncoding(t *testing.T, h Header, r Record) (ok bool) {
	t.Helper()
	got, gerr := encodePayload(h, r)
	want, werr := encodePayloadTree(h, r)
	switch {
	case gerr != nil || werr != nil:
		// The tree path names the first bad member it meets in a map's
		// order, which varies from call to call: compare without it.
		if gerr == nil || werr == nil || memberName.ReplaceAllString(gerr.Error(), "member _ is _, not") != memberName.ReplaceAllString(werr.Error(), "member _ is _, not") {
			t.Fatalf("%T %+v: error %v, tree's %v", r, r, gerr, werr)
		}
		return false
	case !bytes.Equal(got, want):
		t.Fatalf("%T: payload\n%s\ntree's\n%s", r, got, want)
	}
	return true
}

func testHeader(rng *rand.Rand, typ string) Header {
	return Header{V: 1, Run: "run-" + fmt.Sprint(rng.Intn(1000)), Seq: 1 + rng.Int63n(MaxRecords),
		Prev: strings.Repeat("0", 64), Time: time.Unix(1.7e9+rng.Int63n(1e8), rng.Int63n(1e9)), Type: typ}
}

// TestEncodePayloadMatchesTree: for every record type, random records
// (every field set, at every depth) encode to the tree path's bytes, and
// the records it refuses are refused with its error. Each type must be
// both written and, with an inexact integer, refused (controls that the
// comparison saw both answers).
func TestEncodePayloadMatchesTree(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	for _, typ := range recordTypeNames() {
		f := &filler{rng: rng}
		written := 0
		for range 300 {
			if checkSameEncoding(t, testHeader(rng, typ), randomRecord(t, typ, f, true)) {
				written++
			}
		}
		refused := 0
		for range 300 {
			if !checkSameEncoding(t, testHeader(rng, typ), randomRecord(t, typ, f, false)) {
				refused++
			}
		}
		if written == 0 {
			t.Errorf("%s: no random record was written", typ)
		}
		if refused == 0 && hasInt(reflect.TypeOf(zeroRecord(t, typ)), 0) {
			t.Errorf("%s: no record with an inexact integer was refused", typ)
		}
	}
	// The samples of the other tests, as they are.
	for _, r := range append(sampleRecords(), RunTerminated{Reason: ReasonCompleted, ExitCode: 3}) {
		if !checkSameEncoding(t, testHeader(rng, r.RecordType()), r) {
			t.Errorf("%T refused", r)
		}
	}
	// A header member in the record is the tree path's BUG error.
	h := testHeader(rng, TypeInferenceFailed)
	h.Run = "a\xffb"
	checkSameEncoding(t, h, InferenceFailed{RequestID: "r", Reason: "x"})
}

// hasInt reports whether t has an integer field that the filler can make
// inexact (at any depth).
func hasInt(t reflect.Type, depth int) bool {
	if depth > 6 {
		return false
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int64, reflect.Uint64, reflect.Uint:
		return true
	case reflect.Struct:
		if t == reflect.TypeFor[time.Time]() {
			return false
		}
		for i := range t.NumField() {
			if t.Field(i).IsExported() && hasInt(t.Field(i).Type, depth+1) {
				return true
			}
		}
	case reflect.Slice, reflect.Pointer, reflect.Map:
		return hasInt(t.Elem(), depth+1)
	}
	return false
}

// FuzzEncodePayload compares the two encodings on records of every type
// filled from the fuzzer's seed and text.
func FuzzEncodePayload(f *testing.F) {
	f.Add(uint8(0), int64(1), "", false)
	f.Add(uint8(3), int64(7), "ünïcode <&> \u2028 \U0001F600 \xff", true)
	f.Add(uint8(9), int64(-5), `"\u0000\\`, false)
	names := recordTypeNames()
	f.Fuzz(func(t *testing.T, typ uint8, seed int64, text string, exact bool) {
		rng := rand.New(rand.NewSource(seed))
		name := names[int(typ)%len(names)]
		checkSameEncoding(t, testHeader(rng, name), randomRecord(t, name, &filler{rng: rng, text: text}, exact))
	})
}

// BenchmarkEncodePayload is the payload of a typical record, canonical in
// one pass (direct) and through a decoded tree (the oracle).
func BenchmarkEncodePayload(b *testing.B) {
	h := Header{V: 1, Run: "run-0123456789", Seq: 2, Prev: ZeroPrev, Time: time.Unix(1.7e9, 123456789), Type: TypeInferenceRequested}
	for _, c := range []struct {
		name string
		enc  func(Header, Record) ([]byte, error)
	}{{"direct", encodePayload}, {"tree", encodePayloadTree}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.enc(h, benchRecord()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
