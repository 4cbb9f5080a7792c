package audit

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"fmt"

	jsonv2 "github.com/go-json-experiment/json"

	"github.com/moat-sandbox/moat/internal/strictjson"
)

// ReceiptFormat is the format member of every receipt.
const ReceiptFormat = "moat.receipt.v1"

// MaxReceiptBytes caps the size of a receipt that ParseReceipt accepts.
const MaxReceiptBytes = 16 << 10

// Roads of a receipt: which kind of request it covers.
const (
	RoadInference = "inference"
	RoadTool      = "tool"
	RoadService   = "service"
)

// Receipt errors. VerifyReceipt's errors wrap one of them.
var (
	// ErrReceiptMalformed: the receipt is not a receipt (bad JSON, an
	// unknown or missing member, a member out of its form).
	ErrReceiptMalformed = errors.New("malformed receipt")
	// ErrReceiptNotCompleted: the line named is not (the request of) a
	// completed request, so there is nothing to give a receipt for.
	ErrReceiptNotCompleted = errors.New("no completed request at that seq")
	// ErrReceiptJournal: the journal does not hold the receipt's lines
	// (it ends before them) or does not verify up to them with the key.
	ErrReceiptJournal = errors.New("journal does not back the receipt")
	// ErrReceiptMismatch: the journal holds the lines, but a member of
	// the receipt differs from what they say.
	ErrReceiptMismatch = errors.New("receipt does not match the journal")
)

// Receipt is the proof that one request was made and answered, derived
// from two signed journal lines: the request's pre-effect record and its
// completion record. The package doc's "Receipts" section specifies it.
type Receipt struct {
	Format   string      `json:"format"`
	Run      string      `json:"run"`
	KeyID    string      `json:"keyid"`
	Road     string      `json:"road"`
	ID       string      `json:"id"`
	Target   string      `json:"target"`
	Name     string      `json:"name"`
	Request  ReceiptLine `json:"request"`
	Response ReceiptLine `json:"response"`
	Status   int         `json:"status,omitempty"`
	Usage    *Usage      `json:"usage,omitempty"`
	// ApprovalID is the approval that let the request leave (the
	// approval.decided with decision approved for its id, before its
	// pre-effect record); absent when none was needed.
	ApprovalID string `json:"approval_id,omitempty"`
}

// ReceiptLine names one journal line of a receipt and the digest it holds.
type ReceiptLine struct {
	Seq        int64  `json:"seq"`
	Type       string `json:"type"`
	LineSHA256 string `json:"line_sha256"`
	SHA256     string `json:"sha256"`
}

// ParseReceipt parses a receipt: one JSON object (any whitespace) with
// exactly the members of Receipt, no duplicate or unknown member, each in
// its form. It does not check the receipt against a journal: VerifyReceipt
// does.
func ParseReceipt(b []byte) (*Receipt, error) {
	if len(b) > MaxReceiptBytes {
		return nil, fmt.Errorf("%w: %d bytes, more than %d", ErrReceiptMalformed, len(b), MaxReceiptBytes)
	}
	var r Receipt
	if err := jsonv2.Unmarshal(bytes.TrimSpace(b), &r, jsonv2.RejectUnknownMembers(true)); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrReceiptMalformed, err)
	}
	if err := r.check(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrReceiptMalformed, err)
	}
	return &r, nil
}

func (r *Receipt) check() error {
	hex64 := func(name, s string) error {
		if len(s) != keyIDLen || !isLowerHex([]byte(s)) {
			return fmt.Errorf("%s is not 64 lowercase hex digits", name)
		}
		return nil
	}
	if r.Format != ReceiptFormat {
		return fmt.Errorf("format is %q, want %q", r.Format, ReceiptFormat)
	}
	if !validRunID(r.Run) {
		return fmt.Errorf("run %q is not a run id", r.Run)
	}
	if err := hex64("keyid", r.KeyID); err != nil {
		return err
	}
	kinds, ok := receiptRoads[r.Road]
	if !ok {
		return fmt.Errorf("road %q is not one of inference, tool, service", r.Road)
	}
	if r.ID == "" {
		return errors.New("id is empty")
	}
	for i, l := range []ReceiptLine{r.Request, r.Response} {
		name := [2]string{"request", "response"}[i]
		if l.Seq < 1 || l.Seq > MaxRecords {
			return fmt.Errorf("%s.seq %d is not in [1, %d]", name, l.Seq, MaxRecords)
		}
		if l.Type != kinds[i] {
			return fmt.Errorf("%s.type is %q, want %q for road %s", name, l.Type, kinds[i], r.Road)
		}
		if err := hex64(name+".line_sha256", l.LineSHA256); err != nil {
			return err
		}
		if err := hex64(name+".sha256", l.SHA256); err != nil {
			return err
		}
	}
	if r.Request.Seq >= r.Response.Seq {
		return fmt.Errorf("request.seq %d is not before response.seq %d", r.Request.Seq, r.Response.Seq)
	}
	if (r.Usage != nil) != (r.Road == RoadInference) {
		return errors.New("usage is present exactly for road inference")
	}
	return nil
}

// receiptRoads maps a road to its request and completion record types.
var receiptRoads = map[string][2]string{
	RoadInference: {TypeInferenceRequested, TypeInferenceCompleted},
	RoadTool:      {TypeToolRequested, TypeToolCompleted},
	RoadService:   {TypeServiceRequested, TypeServiceCompleted},
}

// Encode is the receipt's canonical byte form (RFC 8785 JSON, no LF), as
// `moat audit receipt -o json` prints it.
func (r *Receipt) Encode() ([]byte, error) {
	b, err := jsonv2.Marshal(r)
	if err != nil {
		return nil, err
	}
	return strictjson.Canonicalize(b)
}

// journalLines splits journal into its complete lines (without LF); a torn
// tail is left out.
func journalLines(journal []byte) [][]byte {
	var lines [][]byte
	for len(journal) > 0 {
		nl := bytes.IndexByte(journal, '\n')
		if nl < 0 {
			break
		}
		lines = append(lines, journal[:nl])
		journal = journal[nl+1:]
	}
	return lines
}

// MakeReceipt derives the receipt of the request that journal line seq
// belongs to: seq names its completion record or its pre-effect record.
// The journal must verify with pub at least through the completion line
// (what follows it is not looked at).
func MakeReceipt(journal []byte, seq int64, pub ed25519.PublicKey) (*Receipt, error) {
	lines := journalLines(journal)
	if seq < 1 || seq > int64(len(lines)) {
		return nil, fmt.Errorf("%w: seq %d: the journal has %d complete lines", ErrReceiptNotCompleted, seq, len(lines))
	}
	e, err := ParseLine(lines[seq-1])
	if err != nil {
		return nil, fmt.Errorf("%w: line %d: %v", ErrReceiptJournal, seq, err)
	}
	done := seq
	if road, id := requestOf(e.Record); road != "" {
		done = 0
		want := receiptRoads[road][1]
		for i := seq; i < int64(len(lines)); i++ {
			c, err := ParseLine(lines[i])
			if err != nil {
				return nil, fmt.Errorf("%w: line %d: %v", ErrReceiptJournal, i+1, err)
			}
			if cr, cid := completionOf(c.Record); cr == road && cid == id && c.Header.Type == want {
				done = i + 1
				break
			}
		}
		if done == 0 {
			return nil, fmt.Errorf("%w: seq %d is a %s whose request (%s) has no %s in the journal", ErrReceiptNotCompleted, seq, e.Header.Type, id, want)
		}
	}
	if err := verifyThrough(journal, lines, done, pub); err != nil {
		return nil, err
	}
	return deriveReceipt(lines, done, KeyID(pub))
}

// verifyThrough checks that the journal verifies with pub through line n.
func verifyThrough(journal []byte, lines [][]byte, n int64, pub ed25519.PublicKey) error {
	if n > int64(len(lines)) {
		return fmt.Errorf("%w: the journal ends after %d complete lines, before line %d", ErrReceiptJournal, len(lines), n)
	}
	end := 0
	for _, l := range lines[:n] {
		end += len(l) + 1
	}
	res := Verify(journal[:end], pub)
	if res.Status == Invalid || int64(res.Records) != n {
		return fmt.Errorf("%w: the journal does not verify through line %d with key %s: %s", ErrReceiptJournal, n, KeyID(pub), res.Reason)
	}
	return nil
}

// requestOf returns the road and id of a pre-effect record, or "".
func requestOf(r Record) (road, id string) {
	switch r := r.(type) {
	case InferenceRequested:
		return RoadInference, r.RequestID
	case ToolRequested:
		return RoadTool, r.CallID
	case ServiceRequested:
		return RoadService, r.RequestID
	}
	return "", ""
}

// completionOf returns the road and id of a completion record, or "".
func completionOf(r Record) (road, id string) {
	switch r := r.(type) {
	case InferenceCompleted:
		return RoadInference, r.RequestID
	case ToolCompleted:
		return RoadTool, r.CallID
	case ServiceCompleted:
		return RoadService, r.RequestID
	}
	return "", ""
}

// deriveReceipt builds the receipt of the completion record on line done
// from the journal's (already verified) lines.
func deriveReceipt(lines [][]byte, done int64, keyID string) (*Receipt, error) {
	c, err := ParseLine(lines[done-1])
	if err != nil {
		return nil, fmt.Errorf("%w: line %d: %v", ErrReceiptJournal, done, err)
	}
	road, id := completionOf(c.Record)
	if road == "" {
		return nil, fmt.Errorf("%w: line %d is %s, not the completion (inference.completed, tool.completed, service.completed) or pre-effect record of a request", ErrReceiptNotCompleted, done, c.Header.Type)
	}
	var q *Entry
	for i := done - 1; i >= 1; i-- {
		e, err := ParseLine(lines[i-1])
		if err != nil {
			return nil, fmt.Errorf("%w: line %d: %v", ErrReceiptJournal, i, err)
		}
		if qr, qid := requestOf(e.Record); qr == road && qid == id {
			q = e
			break
		}
	}
	if q == nil {
		return nil, fmt.Errorf("%w: line %d completes %s, which has no %s before it", ErrReceiptNotCompleted, done, id, receiptRoads[road][0])
	}
	// The approval that let it leave: approval.decided (approved) for the
	// same request, before its pre-effect record.
	approval := ""
	for i := q.Header.Seq - 1; i >= 1 && approval == ""; i-- {
		e, err := ParseLine(lines[i-1])
		if err != nil {
			return nil, fmt.Errorf("%w: line %d: %v", ErrReceiptJournal, i, err)
		}
		if d, ok := e.Record.(ApprovalDecided); ok && d.RequestID == id && d.Decision == ApprovalApproved {
			approval = d.ApprovalID
		}
	}
	r := &Receipt{Format: ReceiptFormat, Run: c.Header.Run, KeyID: keyID, Road: road, ID: id,
		Request:    ReceiptLine{Seq: q.Header.Seq, Type: q.Header.Type, LineSHA256: LineHash(q.Line)},
		Response:   ReceiptLine{Seq: c.Header.Seq, Type: c.Header.Type, LineSHA256: LineHash(c.Line)},
		ApprovalID: approval,
	}
	switch qr := q.Record.(type) {
	case InferenceRequested:
		cr := c.Record.(InferenceCompleted)
		u := cr.Usage
		r.Target, r.Name, r.Request.SHA256 = qr.Provider, qr.Model, qr.BodySHA256
		r.Response.SHA256, r.Status, r.Usage = cr.ResponseSHA256, cr.Status, &u
	case ToolRequested:
		cr := c.Record.(ToolCompleted)
		r.Target, r.Name, r.Request.SHA256 = qr.Server, qr.Tool, qr.ArgumentsSHA256
		r.Response.SHA256 = cr.ResultSHA256
	case ServiceRequested:
		cr := c.Record.(ServiceCompleted)
		r.Target, r.Name, r.Request.SHA256 = qr.Service, qr.Method+" "+qr.Path, qr.BodySHA256
		r.Response.SHA256, r.Status = cr.BodySHA256, cr.Status
	}
	if err := r.check(); err != nil {
		// A journal line the verifier accepted but a receipt cannot
		// carry (e.g. a digest out of form): refuse rather than print
		// a receipt that ParseReceipt would reject.
		return nil, fmt.Errorf("%w: %v", ErrReceiptNotCompleted, err)
	}
	return r, nil
}

// VerifyReceipt checks r against journal and pub, offline: r's keyid is
// pub's, the journal verifies with pub through r's response line, the
// lines at r's two seqs have r's line hashes, and every member of r is
// what those lines say. A nil error means the run whose key is pub
// journaled, durably and before the request left, exactly the request
// and answer that r names.
func VerifyReceipt(r *Receipt, journal []byte, pub ed25519.PublicKey) error {
	if err := r.check(); err != nil {
		return fmt.Errorf("%w: %v", ErrReceiptMalformed, err)
	}
	if k := KeyID(pub); r.KeyID != k {
		return fmt.Errorf("%w: the receipt's keyid is %s, the key's is %s", ErrWrongKey, r.KeyID, k)
	}
	lines := journalLines(journal)
	if err := verifyThrough(journal, lines, r.Response.Seq, pub); err != nil {
		return err
	}
	for _, l := range []ReceiptLine{r.Request, r.Response} {
		if h := LineHash(lines[l.Seq-1]); h != l.LineSHA256 {
			return fmt.Errorf("%w: line %d has sha256 %s, the receipt says %s", ErrReceiptMismatch, l.Seq, h, l.LineSHA256)
		}
	}
	d, err := deriveReceipt(lines, r.Response.Seq, r.KeyID)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrReceiptMismatch, err)
	}
	if field := receiptDiff(d, r); field != "" {
		return fmt.Errorf("%w: %s differs from the journal's lines %d and %d", ErrReceiptMismatch, field, r.Request.Seq, r.Response.Seq)
	}
	return nil
}

// receiptDiff names the first member in which a and b differ, or "".
func receiptDiff(a, b *Receipt) string {
	usage := func(u *Usage) string {
		if u == nil {
			return "-"
		}
		return fmt.Sprint(*u)
	}
	for _, f := range []struct {
		name string
		x, y any
	}{
		{"format", a.Format, b.Format}, {"run", a.Run, b.Run}, {"keyid", a.KeyID, b.KeyID},
		{"road", a.Road, b.Road}, {"id", a.ID, b.ID}, {"target", a.Target, b.Target}, {"name", a.Name, b.Name},
		{"request", a.Request, b.Request}, {"response", a.Response, b.Response},
		{"status", a.Status, b.Status}, {"usage", usage(a.Usage), usage(b.Usage)},
		{"approval_id", a.ApprovalID, b.ApprovalID},
	} {
		if f.x != f.y {
			return f.name
		}
	}
	return ""
}
