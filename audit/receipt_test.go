package audit

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/confirmation"
)

// receiptJournal writes a journal with one completed request on each road
// (inference at 4/5, tool at 6/7, service at 8/9), a failed inference
// (10/11), an approved inference (approval 12/13, request 14/15) and an
// unterminated tail: the run is still going.
func receiptJournal(t testing.TB) testJournal {
	t.Helper()
	w, priv := newTestWriter(t)
	attr := Attribution{Status: confirmation.AttributionResolved, PID: 7, Executable: "/usr/bin/python3", SHA256: strings.Repeat("c", 64)}
	recs := []Record{
		runStarted(w),
		sampleRecords()[0], // boundary.confirmed
		ProcessStarted{ProcessID: "p1", Argv: []string{"agent"}, HostPID: 7},
		InferenceRequested{RequestID: "moatreq_000000000000000000000001", Provider: "anthropic", API: "anthropic-messages",
			Endpoint: "/v1/messages", Model: "claude-sonnet-4-5", BodySHA256: strings.Repeat("1", 64), ReservedTokens: 100, Attribution: attr},
		InferenceCompleted{RequestID: "moatreq_000000000000000000000001", Status: 200, ResponseSHA256: strings.Repeat("2", 64),
			ResponseBytes: 99, Usage: Usage{InputTokens: 12, OutputTokens: 34}},
		ToolRequested{CallID: "moatcall_000000000000000000000002", Server: "calc", Tool: "add", ArgumentsSHA256: strings.Repeat("3", 64), ArgumentsBytes: 13, Attribution: attr},
		ToolCompleted{CallID: "moatcall_000000000000000000000002", ResultSHA256: strings.Repeat("4", 64), ResultBytes: 52},
		ServiceRequested{RequestID: "moatreq_000000000000000000000003", Service: "github", Method: "GET", Path: "/repos/x",
			HeadersSHA256: strings.Repeat("5", 64), BodySHA256: strings.Repeat("6", 64), Attribution: attr},
		ServiceCompleted{RequestID: "moatreq_000000000000000000000003", Status: 200, BodySHA256: strings.Repeat("7", 64), BodyBytes: 3},
		InferenceRequested{RequestID: "moatreq_000000000000000000000004", Provider: "anthropic", API: "anthropic-messages",
			Endpoint: "/v1/messages", Model: "claude-sonnet-4-5", BodySHA256: strings.Repeat("8", 64), ReservedTokens: 100, Attribution: attr},
		InferenceFailed{RequestID: "moatreq_000000000000000000000004", Reason: "timeout", Detail: "moat: upstream timeout"},
		// 12-15: an approved inference; 16: a denied approval of another
		ApprovalRequested{ApprovalID: "moatapr_000000000000000000000005", RequestID: "moatreq_000000000000000000000005", Road: "inference",
			Target: "anthropic", Name: "claude-sonnet-4-5", RequestSHA256: strings.Repeat("a", 64), RequestBytes: 10,
			Principal: Principal{Run: "r", Attribution: attr}, TimeoutMS: 1000},
		ApprovalDecided{ApprovalID: "moatapr_000000000000000000000005", RequestID: "moatreq_000000000000000000000005", Decision: ApprovalApproved, RequestSHA256: strings.Repeat("a", 64)},
		InferenceRequested{RequestID: "moatreq_000000000000000000000005", Provider: "anthropic", API: "anthropic-messages",
			Endpoint: "/v1/messages", Model: "claude-sonnet-4-5", BodySHA256: strings.Repeat("a", 64), ReservedTokens: 100, Attribution: attr},
		InferenceCompleted{RequestID: "moatreq_000000000000000000000005", Status: 200, ResponseSHA256: strings.Repeat("b", 64),
			ResponseBytes: 9, Usage: Usage{InputTokens: 1, OutputTokens: 2}},
	}
	lines := appendAll(t, w, recs...)
	raw, err := os.ReadFile(w.JournalPath())
	if err != nil {
		t.Fatal(err)
	}
	return testJournal{raw: raw, lines: lines, pub: w.PublicKey(), priv: priv, w: w}
}

func TestReceiptRoundTrip(t *testing.T) {
	j := receiptJournal(t)
	for _, c := range []struct {
		seq      int64
		road     string
		req, res int64
	}{
		{5, RoadInference, 4, 5}, {4, RoadInference, 4, 5},
		{7, RoadTool, 6, 7}, {6, RoadTool, 6, 7},
		{9, RoadService, 8, 9}, {8, RoadService, 8, 9},
	} {
		r, err := MakeReceipt(j.raw, c.seq, j.pub)
		if err != nil {
			t.Fatalf("MakeReceipt(%d): %v", c.seq, err)
		}
		if r.Road != c.road || r.Request.Seq != c.req || r.Response.Seq != c.res {
			t.Fatalf("MakeReceipt(%d) = %+v", c.seq, r)
		}
		if r.Request.LineSHA256 != LineHash(j.lines[c.req-1]) || r.Response.LineSHA256 != LineHash(j.lines[c.res-1]) || r.KeyID != KeyID(j.pub) {
			t.Fatalf("MakeReceipt(%d): line hashes or keyid wrong: %+v", c.seq, r)
		}
		if r.ApprovalID != "" {
			t.Fatalf("approval_id %q without an approval", r.ApprovalID)
		}
		// Both the canonical form and the CLI's indented form parse back
		// to a receipt that verifies.
		canon, err := r.Encode()
		if err != nil {
			t.Fatal(err)
		}
		indented, err := json.MarshalIndent(r, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range [][]byte{canon, indented} {
			p, err := ParseReceipt(b)
			if err != nil {
				t.Fatalf("ParseReceipt(%s): %v", b, err)
			}
			if err := VerifyReceipt(p, j.raw, j.pub); err != nil {
				t.Fatalf("VerifyReceipt(%s): %v", b, err)
			}
		}
	}
	// An approved request's receipt names its approval; tampering with it
	// (dropped) is refused, the untouched one verifies.
	ra, err := MakeReceipt(j.raw, 15, j.pub)
	if err != nil || ra.ApprovalID != "moatapr_000000000000000000000005" || ra.Request.Seq != 14 {
		t.Fatalf("approved request's receipt: %+v %v", ra, err)
	}
	if err := VerifyReceipt(ra, j.raw, j.pub); err != nil {
		t.Fatalf("approved request's receipt: %v", err)
	}
	ra.ApprovalID = ""
	if err := VerifyReceipt(ra, j.raw, j.pub); !errors.Is(err, ErrReceiptMismatch) {
		t.Fatalf("approval_id dropped: %v", err)
	}
	r, _ := MakeReceipt(j.raw, 5, j.pub)
	if r.Target != "anthropic" || r.Name != "claude-sonnet-4-5" || r.Status != 200 || r.Usage == nil ||
		*r.Usage != (Usage{InputTokens: 12, OutputTokens: 34}) || r.Request.SHA256 != strings.Repeat("1", 64) || r.Response.SHA256 != strings.Repeat("2", 64) {
		t.Fatalf("inference receipt %+v", r)
	}
	// Nothing to give a receipt for: a failed request, its pre-effect
	// record, a process record, out of range.
	for _, seq := range []int64{11, 10, 3, 1, 0, 12, 13, 16, -1} {
		if _, err := MakeReceipt(j.raw, seq, j.pub); !errors.Is(err, ErrReceiptNotCompleted) {
			t.Errorf("MakeReceipt(%d) = %v, want ErrReceiptNotCompleted", seq, err)
		}
	}
}

// TestReceiptTampered: every member changed is refused and named; the
// untouched receipt (control) verifies in the same setup.
func TestReceiptTampered(t *testing.T) {
	j := receiptJournal(t)
	good, err := MakeReceipt(j.raw, 5, j.pub)
	if err != nil {
		t.Fatal(err)
	}
	if err := VerifyReceipt(good, j.raw, j.pub); err != nil {
		t.Fatalf("control: %v", err)
	}
	other := strings.Repeat("9", 64)
	for _, c := range []struct {
		name string
		edit func(r *Receipt)
		want error
	}{
		{"request digest", func(r *Receipt) { r.Request.SHA256 = other }, ErrReceiptMismatch},
		{"response digest", func(r *Receipt) { r.Response.SHA256 = other }, ErrReceiptMismatch},
		{"input tokens", func(r *Receipt) { r.Usage = &Usage{InputTokens: 11, OutputTokens: 34} }, ErrReceiptMismatch},
		{"output tokens", func(r *Receipt) { r.Usage = &Usage{InputTokens: 12, OutputTokens: 1} }, ErrReceiptMismatch},
		{"status", func(r *Receipt) { r.Status = 201 }, ErrReceiptMismatch},
		{"model", func(r *Receipt) { r.Name = "claude-opus-4" }, ErrReceiptMismatch},
		{"provider", func(r *Receipt) { r.Target = "openai" }, ErrReceiptMismatch},
		{"id", func(r *Receipt) { r.ID = "moatreq_000000000000000000000009" }, ErrReceiptMismatch},
		{"run", func(r *Receipt) { r.Run = "another-run" }, ErrReceiptMismatch},
		{"approval id", func(r *Receipt) { r.ApprovalID = "moatappr_1" }, ErrReceiptMismatch},
		{"response line hash", func(r *Receipt) { r.Response.LineSHA256 = other }, ErrReceiptMismatch},
		{"request line hash", func(r *Receipt) { r.Request.LineSHA256 = other }, ErrReceiptMismatch},
		// wrong seq: the lines there are not the receipt's
		{"response seq to the tool completion", func(r *Receipt) { r.Response.Seq = 7 }, ErrReceiptMismatch},
		{"request seq to run.started", func(r *Receipt) { r.Request.Seq = 1 }, ErrReceiptMismatch},
		{"both seqs to the failed request", func(r *Receipt) { r.Request.Seq, r.Response.Seq = 10, 11 }, ErrReceiptMismatch},
		{"seq past the journal", func(r *Receipt) { r.Request.Seq, r.Response.Seq = 40, 41 }, ErrReceiptJournal},
		{"keyid", func(r *Receipt) { r.KeyID = other }, ErrWrongKey},
		{"road", func(r *Receipt) { r.Road = RoadTool }, ErrReceiptMalformed},
		{"usage dropped", func(r *Receipt) { r.Usage = nil }, ErrReceiptMalformed},
		{"format", func(r *Receipt) { r.Format = "moat.receipt.v2" }, ErrReceiptMalformed},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := *good
			c.edit(&r)
			// Through the byte form, as a receipt file travels.
			b, err := json.Marshal(&r)
			if err != nil {
				t.Fatal(err)
			}
			p, perr := ParseReceipt(b)
			if perr != nil {
				if !errors.Is(perr, c.want) {
					t.Fatalf("ParseReceipt: %v, want %v", perr, c.want)
				}
				return
			}
			if err := VerifyReceipt(p, j.raw, j.pub); !errors.Is(err, c.want) {
				t.Fatalf("VerifyReceipt = %v, want %v", err, c.want)
			}
		})
	}
}

func TestReceiptWrongKeyAndJournal(t *testing.T) {
	j := receiptJournal(t)
	r, err := MakeReceipt(j.raw, 7, j.pub)
	if err != nil {
		t.Fatal(err)
	}
	if err := VerifyReceipt(r, j.raw, j.pub); err != nil {
		t.Fatalf("control: %v", err)
	}
	stranger, _, _ := ed25519.GenerateKey(rand.Reader)
	if err := VerifyReceipt(r, j.raw, stranger); !errors.Is(err, ErrWrongKey) {
		t.Errorf("another key: %v, want ErrWrongKey", err)
	}
	// A receipt made up for a journal re-signed with another key: the
	// keyid matches that key, but the journal does not verify with it.
	r2 := *r
	r2.KeyID = KeyID(stranger)
	if err := VerifyReceipt(&r2, j.raw, stranger); !errors.Is(err, ErrReceiptJournal) {
		t.Errorf("keyid of the other key: %v, want ErrReceiptJournal", err)
	}
	if _, err := MakeReceipt(j.raw, 7, stranger); !errors.Is(err, ErrReceiptJournal) {
		t.Errorf("MakeReceipt with another key: %v, want ErrReceiptJournal", err)
	}
	// Truncated before the response line, and torn inside it.
	upto := func(n int) []byte { return joinLines(j.lines[:n]) }
	for name, journal := range map[string][]byte{
		"before the request":  upto(5),
		"before the response": upto(6),
		"torn response line":  append(upto(6), j.lines[6][:40]...),
		"empty":               nil,
	} {
		if err := VerifyReceipt(r, journal, j.pub); !errors.Is(err, ErrReceiptJournal) {
			t.Errorf("%s: %v, want ErrReceiptJournal", name, err)
		}
	}
	// Exactly through the response line is enough (the journal may be
	// cut right after it, or go on invalid after it).
	if err := VerifyReceipt(r, upto(7), j.pub); err != nil {
		t.Errorf("journal through the response line: %v", err)
	}
	if err := VerifyReceipt(r, append(upto(8), "garbage\n"...), j.pub); err != nil {
		t.Errorf("journal invalid only after the response line: %v", err)
	}
	// A bad line before it: the chain does not verify.
	bad := bytes.Clone(j.raw)
	i := bytes.Index(bad, j.lines[2])
	bad[i+len(envPrefix)+3] ^= 1
	if err := VerifyReceipt(r, bad, j.pub); !errors.Is(err, ErrReceiptJournal) {
		t.Errorf("line 3 altered: %v, want ErrReceiptJournal", err)
	}
	// A line re-signed with the run's own key but moved: its hash differs.
	if err := VerifyReceipt(r, joinLines(append(append([][]byte{}, j.lines[:6]...), j.lines[8])), j.pub); err == nil {
		t.Error("a journal with another line at seq 7 verified the receipt")
	}
}

func TestParseReceiptRefuses(t *testing.T) {
	j := receiptJournal(t)
	r, _ := MakeReceipt(j.raw, 5, j.pub)
	good, _ := r.Encode()
	if _, err := ParseReceipt(good); err != nil {
		t.Fatalf("control: %v", err)
	}
	for name, b := range map[string]string{
		"empty":          "",
		"not json":       "receipt",
		"array":          "[]",
		"unknown member": strings.Replace(string(good), `{`, `{"extra":1,`, 1),
		"duplicate":      strings.Replace(string(good), `"format":`, `"run":"x","format":`, 1),
		"trailing":       string(good) + "{}",
		"too large":      strings.Repeat(" ", MaxReceiptBytes+1),
		"seq zero":       strings.Replace(string(good), `"seq":4`, `"seq":0`, 1),
		"seq order":      strings.Replace(string(good), `"seq":4`, `"seq":6`, 1),
		"upper hex":      strings.Replace(string(good), r.KeyID, strings.ToUpper(r.KeyID), 1),
		"bad utf8":       strings.Replace(string(good), "anthropic", "anthr\xffopic", 1),
	} {
		if _, err := ParseReceipt([]byte(b)); !errors.Is(err, ErrReceiptMalformed) {
			t.Errorf("%s: %v, want ErrReceiptMalformed", name, err)
		}
	}
}

// FuzzParseReceipt: ParseReceipt never panics, and a receipt it accepts
// encodes to a form it accepts again, unchanged.
func FuzzParseReceipt(f *testing.F) {
	j := receiptJournal(f)
	for _, seq := range []int64{5, 7, 9} {
		r, err := MakeReceipt(j.raw, seq, j.pub)
		if err != nil {
			f.Fatal(err)
		}
		b, _ := r.Encode()
		f.Add(b)
		ind, _ := json.MarshalIndent(r, "", "  ")
		f.Add(ind)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ParseReceipt(b)
		if err != nil {
			if !errors.Is(err, ErrReceiptMalformed) {
				t.Fatalf("error %v does not wrap ErrReceiptMalformed", err)
			}
			return
		}
		enc, err := r.Encode()
		if err != nil {
			t.Fatalf("Encode of a parsed receipt: %v", err)
		}
		r2, err := ParseReceipt(enc)
		if err != nil {
			t.Fatalf("re-parse of %s: %v", enc, err)
		}
		if d := receiptDiff(r, r2); d != "" {
			t.Fatalf("%s changed through Encode", d)
		}
		// Verifying any parsed receipt against a real journal never
		// panics; only the real ones verify.
		_ = VerifyReceipt(r, j.raw, j.pub)
	})
}
