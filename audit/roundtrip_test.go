package audit

import (
	"errors"
	"math"
	"math/rand"
	"os"
	"reflect"
	"strings"
	"testing"
	"testing/quick"
	"time"
	"unicode/utf8"

	"github.com/moat-sandbox/moat/confirmation"
)

// usageEdges are provider-reported counts around the edges of what JSON
// carries exactly, including the regression range [2^63-512, 2^63-1],
// where RFC 8785 rounded the number to 2^63, which no int holds: the
// writer signed a line that its own verifier rejected.
var usageEdges = []int{
	0, 1, MaxExactInt - 1, MaxExactInt, MaxExactInt + 1, MaxExactInt + 2,
	1<<62 + 1, math.MaxInt64 - 512, math.MaxInt64 - 511, math.MaxInt64 - 256,
	math.MaxInt64 - 1, math.MaxInt64, -1, -MaxExactInt, -MaxExactInt - 1, math.MinInt64,
}

// TestUsageBeyondExactIntRoundTrips: a complete, honest journal with any
// provider-reported usage verifies as complete, and the verifier reads back
// the exact counts. Every count in [2^63-512, 2^63-1] is tried.
func TestUsageBeyondExactIntRoundTrips(t *testing.T) {
	w, _ := newTestWriter(t)
	mustAppend(t, w, runStarted(w))
	mustAppend(t, w, BoundaryConfirmed{Ready: true})
	var want []Usage
	for i, v := range usageEdges {
		want = append(want, Usage{InputTokens: v, OutputTokens: usageEdges[len(usageEdges)-1-i]})
	}
	for v := math.MaxInt64 - 511; ; v++ {
		want = append(want, Usage{InputTokens: v, OutputTokens: 7})
		if v == math.MaxInt64 {
			break
		}
	}
	for _, u := range want {
		mustAppend(t, w, InferenceCompleted{RequestID: "r", Status: 200, ResponseSHA256: strings.Repeat("e", 64), Usage: u})
	}
	mustAppend(t, w, RunTerminated{Reason: ReasonCompleted})
	w.Close()
	journal := readJournal(t, w)
	if r := Verify(journal, w.PublicKey()); r.Status != Complete {
		t.Fatalf("honest journal: %v: %s", r.Status, r.Reason)
	}
	lines := strings.Split(strings.TrimSuffix(string(journal), "\n"), "\n")
	for i, u := range want {
		e, err := VerifyLine([]byte(lines[2+i]), w.PublicKey())
		if err != nil {
			t.Fatalf("line %d: %v", 3+i, err)
		}
		if got := e.Record.(InferenceCompleted).Usage; got != u {
			t.Fatalf("usage %+v journaled, verifier read %+v", u, got)
		}
	}
	// The form, spelled out: a number up to 2^53-1, a string beyond.
	for _, c := range []struct {
		u    Usage
		want string
	}{
		{Usage{MaxExactInt, 0}, `"usage":{"input_tokens":9007199254740991,"output_tokens":0}`},
		{Usage{MaxExactInt + 1, math.MaxInt64}, `"usage":{"input_tokens":"9007199254740992","output_tokens":"9223372036854775807"}`},
		{Usage{-1, 5}, `"usage":{"input_tokens":"-1","output_tokens":5}`},
	} {
		p, err := encodePayload(Header{V: 1, Run: "r", Seq: 1, Prev: ZeroPrev, Time: time.Unix(0, 0), Type: TypeInferenceCompleted}, InferenceCompleted{Usage: c.u})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(p), c.want) {
			t.Errorf("usage %+v: payload %s, want it to contain %s", c.u, p, c.want)
		}
	}
}

// TestUsageRefusesOtherForms: the verifier accepts only the writer's form
// (the positive controls are the first two rows).
func TestUsageRefusesOtherForms(t *testing.T) {
	for _, c := range []struct {
		in string
		ok bool
	}{
		{`{"input_tokens":9007199254740991,"output_tokens":0}`, true},
		{`{"input_tokens":"9007199254740992","output_tokens":"-3"}`, true},
		{`{"input_tokens":"5","output_tokens":0}`, false},                    // in range: must be a number
		{`{"input_tokens":9007199254740992,"output_tokens":0}`, false},       // beyond: must be a string
		{`{"input_tokens":-1,"output_tokens":0}`, false},                     // negative: must be a string
		{`{"input_tokens":"09007199254740992","output_tokens":0}`, false},    // not the decimal form
		{`{"input_tokens":"9223372036854775808","output_tokens":0}`, false},  // no int holds it
		{`{"input_tokens":1.5,"output_tokens":0}`, false},                    // not an integer
		{`{"input_tokens":1e3,"output_tokens":0}`, false},                    // not the integer form
		{`{"input_tokens":1}`, false},                                        // member missing
		{`{"input_tokens":1,"output_tokens":2,"cache_tokens":3}`, false},     // unknown member
		{`{"input_tokens":true,"output_tokens":0}`, false},                   // not a number
		{`{"input_tokens":"９","output_tokens":0}`, false},                    // not ASCII digits
		{`{"input_tokens":"+9007199254740992","output_tokens":0}`, false},    // sign
		{`{"input_tokens":" 9007199254740992","output_tokens":0}`, false},    // space
		{`{"input_tokens":null,"output_tokens":0}`, false},                   // null
		{`{"input_tokens":"-9223372036854775809","output_tokens":0}`, false}, // below int64
		{`{"input_tokens":"-0","output_tokens":0}`, false},                   // not the decimal form
		{`{"input_tokens":0,"output_tokens":"18446744073709551615"}`, false}, // above int64
		{`{"input_tokens":0,"output_tokens":0,"input_tokens":0}`, false},     // duplicate
		{`["input_tokens",0]`, false},                                        // not an object
		{`{"input_tokens":"\u0039007199254740992","output_tokens":0}`, true}, // escapes are JSON's business: canonical form is checked on the payload
		{`{"input_tokens":"9007199254740992","output_tokens":"-9223372036854775808"}`, true},
	} {
		var u Usage
		err := u.UnmarshalJSON([]byte(c.in))
		if (err == nil) != c.ok {
			t.Errorf("%s: err = %v, want ok=%v", c.in, err, c.ok)
		}
	}
}

// TestWriterRefusesInexactNumbers: any other member holding an integer
// beyond ±(2^53-1) is refused by Append, nothing is written, and the
// journal stays valid (with a positive control on the same writer).
func TestWriterRefusesInexactNumbers(t *testing.T) {
	w, _ := newTestWriter(t)
	mustAppend(t, w, runStarted(w))
	mustAppend(t, w, BoundaryConfirmed{Ready: true})
	for _, r := range []Record{
		ProcessExited{ProcessID: "p", ExitCode: MaxExactInt + 1},
		ProcessStarted{ProcessID: "p", Argv: []string{"x"}, HostPID: math.MaxInt64},
		InferenceCompleted{RequestID: "r", ResponseBytes: math.MinInt64},
		InferenceRequested{RequestID: "r", ReservedTokens: -MaxExactInt - 1},
	} {
		if _, err := w.Append(r); err == nil || !strings.Contains(err.Error(), "JSON cannot carry it exactly") {
			t.Errorf("%+v: err = %v, want a refusal of the inexact number", r, err)
		}
	}
	mustAppend(t, w, ProcessExited{ProcessID: "p", ExitCode: -MaxExactInt})
	mustAppend(t, w, InferenceCompleted{RequestID: "r", ResponseBytes: MaxExactInt})
	mustAppend(t, w, RunTerminated{Reason: ReasonCompleted})
	w.Close()
	if r := Verify(readJournal(t, w), w.PublicKey()); r.Status != Complete || r.Records != 5 {
		t.Fatalf("%v, %d records: %s; want complete with 5", r.Status, r.Records, r.Reason)
	}
}

// TestLineLimitShared: the longest line the writer signs is exactly
// MaxLineBytes and verifies; a record one base64 quantum longer is refused
// by Append, and the journal stays valid.
func TestLineLimitShared(t *testing.T) {
	w, _ := newTestWriter(t)
	mustAppend(t, w, runStarted(w))
	mustAppend(t, w, BoundaryConfirmed{Ready: true})
	h := Header{V: 1, Run: w.RunID(), Seq: 3, Prev: ZeroPrev, Time: time.Date(2026, 1, 1, 0, 0, 0, 123456000, time.UTC), Type: TypeInferenceFailed}
	p0, err := encodePayload(h, InferenceFailed{RequestID: "r", Reason: "x"})
	if err != nil {
		t.Fatal(err)
	}
	overhead := len(appendEnvelope(nil, p0, w.KeyID(), make([]byte, 64))) - b64.EncodedLen(len(p0))
	// Each "a" of the detail adds one payload byte.
	lineLen := func(n int) int { return overhead + b64.EncodedLen(len(p0)+n) }
	// Largest n with lineLen(n) <= MaxLineBytes (lineLen is monotone).
	lo, hi := 0, MaxLineBytes
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if lineLen(mid) <= MaxLineBytes {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	if lineLen(lo) < MaxLineBytes-3 {
		t.Fatalf("longest line %d, want within a base64 quantum of %d", lineLen(lo), MaxLineBytes)
	}
	// The clock's fraction changes the length; pin it.
	w.now = func() time.Time { return h.Time }
	if _, err := w.Append(InferenceFailed{RequestID: "r", Reason: "x", Detail: strings.Repeat("a", lo+3)}); err == nil || !strings.Contains(err.Error(), "line limit") {
		t.Fatalf("over the line limit: err = %v, want a refusal", err)
	}
	line := mustAppend(t, w, InferenceFailed{RequestID: "r", Reason: "x", Detail: strings.Repeat("a", lo)})
	if len(line) != lineLen(lo) {
		t.Fatalf("line is %d bytes, predicted %d", len(line), lineLen(lo))
	}
	mustAppend(t, w, RunTerminated{Reason: ReasonCompleted})
	w.Close()
	if r := Verify(readJournal(t, w), w.PublicKey()); r.Status != Complete {
		t.Fatalf("journal with a %d-byte line: %v: %s", len(line), r.Status, r.Reason)
	}
}

// TestJournalSizeLimit: the writer refuses records that would take the
// journal past its limit, keeps room for run.terminated, and so never
// writes a journal that Verify calls too large.
func TestJournalSizeLimit(t *testing.T) {
	w, _ := newTestWriter(t)
	w.maxSize = terminalReserve + 8<<10
	mustAppend(t, w, runStarted(w))
	mustAppend(t, w, BoundaryConfirmed{Ready: true})
	n := 0
	for ; ; n++ {
		_, err := w.Append(InferenceFailed{RequestID: "r", Reason: "x", Detail: strings.Repeat("b", 500)})
		if errors.Is(err, ErrJournalFull) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if n > 100 {
			t.Fatal("no refusal at the size limit")
		}
	}
	if n == 0 {
		t.Fatal("nothing fit: the positive control failed")
	}
	if w.Err() != nil {
		t.Fatalf("a refusal poisoned the writer: %v", w.Err())
	}
	mustAppend(t, w, RunTerminated{Reason: "journal_full"})
	w.Close()
	j := readJournal(t, w)
	if int64(len(j)) > w.maxSize-terminalReserve+1<<10 {
		t.Fatalf("journal is %d bytes, limit %d", len(j), w.maxSize)
	}
	if r := Verify(j, w.PublicKey()); r.Status != Complete || r.Terminal.Counts.Failed != n {
		t.Fatalf("%v: %s", r.Status, r.Reason)
	}
}

// TestWriterVerifierAgree is the property: for any record, either Append
// refuses it and writes nothing, or the line it signs verifies and decodes
// to the same values. Only a non-usage integer beyond ±(2^53-1) may be
// refused; usage counts never are.
func TestWriterVerifierAgree(t *testing.T) {
	w, _ := newTestWriter(t)
	w.skipSync = true // durability is not the property here
	mustAppend(t, w, runStarted(w))
	mustAppend(t, w, BoundaryConfirmed{Ready: true})
	accepted, refused := 0, 0
	prop := func(g genRecord) bool {
		line, err := w.Append(g.r)
		if err != nil {
			if !g.inexact {
				t.Logf("%T refused: %v", g.r, err)
				return false
			}
			refused++
			return true
		}
		if g.inexact {
			t.Logf("%T with an inexact number was signed", g.r)
			return false
		}
		e, err := VerifyLine(line, w.PublicKey())
		if err != nil {
			t.Logf("the writer signed a line its verifier rejects: %v", err)
			return false
		}
		if !reflect.DeepEqual(e.Record, g.r) {
			t.Logf("journaled %#v\nverifier read %#v", g.r, e.Record)
			return false
		}
		accepted++
		return true
	}
	if err := quick.Check(prop, &quick.Config{MaxCount: 3000}); err != nil {
		t.Fatal(err)
	}
	if accepted < 1000 || refused < 50 {
		t.Fatalf("%d accepted, %d refused: the generator does not cover both sides", accepted, refused)
	}
	mustAppend(t, w, RunTerminated{Reason: ReasonCompleted})
	w.Close()
	if r := Verify(readJournal(t, w), w.PublicKey()); r.Status != Complete {
		t.Fatalf("%v: %s", r.Status, r.Reason)
	}
}

// TestInvalidUTF8Replaced: strings are journaled as JSON strings, which
// hold only Unicode text; each byte of invalid UTF-8 becomes U+FFFD.
func TestInvalidUTF8Replaced(t *testing.T) {
	w, _ := newTestWriter(t)
	mustAppend(t, w, runStarted(w))
	mustAppend(t, w, BoundaryConfirmed{Ready: true})
	line := mustAppend(t, w, InferenceFailed{RequestID: "r", Reason: "x", Detail: "a\xff\xfeb\xc3"})
	e, err := VerifyLine(line, w.PublicKey())
	if err != nil {
		t.Fatal(err)
	}
	if got := e.Record.(InferenceFailed).Detail; got != "a\uFFFD\uFFFDb\uFFFD" {
		t.Fatalf("detail %q", got)
	}
}

// genRecord is a random record after boundary.confirmed.
type genRecord struct {
	r       Record
	inexact bool // a non-usage integer is beyond ±(2^53-1)
}

func (genRecord) Generate(rng *rand.Rand, size int) reflect.Value {
	g := genRecord{}
	anyInt := func() int { // any int: provider-reported
		switch rng.Intn(4) {
		case 0:
			return usageEdges[rng.Intn(len(usageEdges))]
		case 1:
			return math.MaxInt64 - rng.Intn(512)
		case 2:
			return int(rng.Uint64())
		}
		return rng.Intn(1 << 20)
	}
	someInt := func() int { // a field the runtime fills: usually exact
		if rng.Intn(20) == 0 {
			g.inexact = true
			v := MaxExactInt + 1 + rng.Intn(1<<40)
			if rng.Intn(2) == 0 {
				v = -v
			}
			return v
		}
		if rng.Intn(3) == 0 {
			return rng.Intn(2*MaxExactInt+1) - MaxExactInt
		}
		return rng.Intn(1000) - 10
	}
	str := func() string {
		n := rng.Intn(size + 1)
		var b strings.Builder
		for range n {
			var r rune
			switch rng.Intn(5) {
			case 0:
				r = rune(rng.Intn(0x20)) // controls
			case 1:
				r = []rune{'"', '\\', '<', '>', '&', '\u2028', '\u2029', 0x7f, '\uFFFD', 0x1F600}[rng.Intn(10)]
			case 2:
				r = rune(rng.Intn(0x110000))
			default:
				r = rune(0x20 + rng.Intn(0x5f))
			}
			if !utf8.ValidRune(r) {
				r = 'x'
			}
			b.WriteRune(r)
		}
		return b.String()
	}
	attr := func() Attribution {
		if rng.Intn(2) == 0 {
			return Attribution{Status: confirmation.AttributionUnavailable, Reason: str()}
		}
		return Attribution{Status: confirmation.AttributionResolved, PID: someInt(), Executable: str(), SHA256: str()}
	}
	var strs []string
	if k := rng.Intn(4); k > 0 {
		strs = make([]string, k)
		for i := range strs {
			strs[i] = str()
		}
	}
	switch rng.Intn(6) {
	case 0:
		g.r = InferenceRequested{RequestID: str(), Provider: str(), API: str(), Endpoint: str(), Model: str(),
			BodySHA256: str(), ReservedTokens: someInt(), Stream: rng.Intn(2) == 0, Attribution: attr()}
	case 1:
		g.r = InferenceCompleted{RequestID: str(), Status: someInt(), ResponseSHA256: str(), ResponseBytes: int64(someInt()),
			Usage: Usage{InputTokens: anyInt(), OutputTokens: anyInt()}}
	case 2:
		g.r = InferenceRefused{RequestID: str(), Reason: str(), Detail: str(), Provider: str(), Endpoint: str(), Attribution: attr()}
	case 3:
		g.r = InferenceFailed{RequestID: str(), Reason: str(), Detail: str()}
	case 4:
		if strs == nil && rng.Intn(2) == 0 {
			strs = []string{}
		}
		g.r = ProcessStarted{ProcessID: str(), Argv: strs, HostPID: someInt(), Executable: str(), SHA256: str()}
	default:
		g.r = ProcessExited{ProcessID: str(), ExitCode: someInt()}
	}
	return reflect.ValueOf(g)
}

// The property test does not generate boundary records (they are only
// valid on line 2), so check that their ints are bounded by the same rule
// on a fresh writer.
func TestBoundaryRecordRoundTrips(t *testing.T) {
	w, _ := newTestWriter(t)
	mustAppend(t, w, runStarted(w))
	b := BoundaryConfirmed{Ready: false, Reason: "x\x00y", Properties: confirmation.Properties{
		FilesystemConfinement: confirmation.EnforcedProperty{Enforced: true, Mechanism: "m"}},
		Checks: []Check{{Property: "p", Name: "n", Kind: "violation", OK: true, Outcome: "o", Detail: "d"}}}
	line := mustAppend(t, w, b)
	e, err := VerifyLine(line, w.PublicKey())
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(e.Record, b) {
		t.Fatalf("journaled %#v, read %#v", b, e.Record)
	}
}

func mustAppend(t *testing.T, w *Writer, r Record) []byte {
	t.Helper()
	line, err := w.Append(r)
	if err != nil {
		t.Fatalf("Append(%s): %v", r.RecordType(), err)
	}
	return line
}

func readJournal(t *testing.T, w *Writer) []byte {
	t.Helper()
	b, err := os.ReadFile(w.JournalPath())
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// FuzzUsageJSON: the usage parser never panics; what it accepts is in the
// writer's form (it marshals back to the same bytes); and any pair of ints
// marshals to something it accepts back unchanged.
func FuzzUsageJSON(f *testing.F) {
	f.Add([]byte(`{"input_tokens":9007199254740991,"output_tokens":0}`), int64(math.MaxInt64), int64(-1))
	f.Add([]byte(`{"input_tokens":"9223372036854775807","output_tokens":"-9223372036854775808"}`), int64(MaxExactInt+1), int64(0))
	f.Add([]byte(`{"input_tokens":"5","output_tokens":1e3}`), int64(math.MaxInt64-511), int64(MaxExactInt))
	f.Fuzz(func(t *testing.T, b []byte, in, out int64) {
		var u Usage
		if err := u.UnmarshalJSON(b); err == nil {
			again, err := u.MarshalJSON()
			if err != nil {
				t.Fatal(err)
			}
			var v Usage
			if err := v.UnmarshalJSON(again); err != nil || v != u {
				t.Fatalf("accepted %q as %+v, which does not round-trip: %v", b, u, err)
			}
		}
		w := Usage{InputTokens: int(in), OutputTokens: int(out)}
		m, err := w.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		var v Usage
		if err := v.UnmarshalJSON(m); err != nil || v != w {
			t.Fatalf("%+v marshals to %s, read back as %+v (%v)", w, m, v, err)
		}
	})
}
