package audit

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	jsonv2 "github.com/go-json-experiment/json"

	"github.com/moat-sandbox/moat/internal/strictjson"
)

// Limits.
const (
	// MaxLineBytes caps one journal line (an argv can be long). It is the
	// one limit that both the writer (which refuses to sign a longer line)
	// and the verifier (which rejects one) apply.
	MaxLineBytes = 4 << 20
	// MaxExactInt is 2^53-1, the largest integer that RFC 8785 (whose
	// numbers are IEEE 754 doubles) and every JSON reader carry exactly.
	// Every JSON number in a payload is an integer in
	// [-MaxExactInt, MaxExactInt]; the writer refuses a record with any
	// other number, and Usage journals its counts outside [0, MaxExactInt]
	// as decimal strings.
	MaxExactInt = 1<<53 - 1
	// MaxRecords caps the records of one journal. The last slot is kept
	// for run.terminated.
	MaxRecords = 1 << 20
	// MaxRunIDBytes caps a run id.
	MaxRunIDBytes = 128
	// formatVersion is the payload's "v".
	formatVersion = 1
)

// Header is the common header of every payload.
type Header struct {
	V    int       // always 1
	Run  string    // the run id
	Seq  int64     // 1 for the first record, then +1 per line
	Prev string    // LineHash of the previous line; ZeroPrev for the first
	Time time.Time // when the writer appended the record (UTC)
	Type string    // the record type, e.g. "inference.requested"
}

// headerKeys are the payload members that belong to Header.
var headerKeys = []string{"v", "run", "seq", "prev", "time", "type"}

// Entry is one parsed journal line.
type Entry struct {
	Line      []byte // the exact line, without LF
	Payload   []byte // the decoded payload (canonical JSON)
	KeyID     string
	Signature []byte
	Header    Header
	Record    Record // the typed record: RunStarted, InferenceRequested, …
}

// recordTypes decodes the type-specific members of a payload. The set of
// keys is the set of known record types.
var recordTypes = map[string]func([]byte) (Record, error){
	TypeRunStarted:         decodeAs[RunStarted],
	TypeBoundaryConfirmed:  decodeAs[BoundaryConfirmed],
	TypeInferenceRequested: decodeAs[InferenceRequested],
	TypeInferenceCompleted: decodeAs[InferenceCompleted],
	TypeInferenceRefused:   decodeAs[InferenceRefused],
	TypeInferenceFailed:    decodeAs[InferenceFailed],
	TypeProcessStarted:     decodeAs[ProcessStarted],
	TypeProcessExited:      decodeAs[ProcessExited],
	TypeProcessFailed:      decodeAs[ProcessFailed],
	TypeRunTerminated:      decodeAs[RunTerminated],
	TypeToolRequested:      decodeAs[ToolRequested],
	TypeToolCompleted:      decodeAs[ToolCompleted],
	TypeToolRefused:        decodeAs[ToolRefused],
	TypeToolFailed:         decodeAs[ToolFailed],
	TypeServiceRequested:   decodeAs[ServiceRequested],
	TypeServiceCompleted:   decodeAs[ServiceCompleted],
	TypeServiceRefused:     decodeAs[ServiceRefused],
	TypeServiceFailed:      decodeAs[ServiceFailed],
}

func decodeAs[T Record](b []byte) (Record, error) {
	var v T
	if err := jsonv2.Unmarshal(b, &v, jsonv2.RejectUnknownMembers(true)); err != nil {
		return nil, err
	}
	return v, nil
}

// knownRecord reports whether r is one of this package's record types
// (a value, not a pointer), so that its payload decodes back to it.
func knownRecord(r Record) bool {
	switch r.(type) {
	case RunStarted, BoundaryConfirmed, InferenceRequested, InferenceCompleted,
		InferenceRefused, InferenceFailed, ProcessStarted, ProcessExited, ProcessFailed, RunTerminated,
		ToolRequested, ToolCompleted, ToolRefused, ToolFailed, ToolServerConfirmed,
		ServiceRequested, ServiceCompleted, ServiceRefused, ServiceFailed,
		EgressOpened, EgressClosed, EgressRefused,
		PackageRequested, PackageCompleted, PackageRefused, PackageFailed, PackageLockfile, PackageReload,
		ApprovalRequested, ApprovalDecided, ApprovalSubstitution,
		BudgetUpdated:
		return true
	}
	return false
}

// formatTime is the payload's time form: RFC 3339 in UTC with the
// fractional seconds of time.RFC3339Nano (trailing zeros dropped).
func formatTime(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// encodePayloadTree returns the canonical payload for h and r through a
// decoded tree: encodePayload's oracle, and its answer when it refuses.
func encodePayloadTree(h Header, r Record) ([]byte, error) {
	fields, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("audit: encoding %s record: %w", r.RecordType(), err)
	}
	tree, err := strictjson.Decode(fields)
	if err != nil {
		return nil, fmt.Errorf("audit: encoding %s record: %w", r.RecordType(), err)
	}
	m, ok := tree.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("BUG: audit: %s record encodes as %T, not an object", r.RecordType(), tree)
	}
	if err := checkNumbers(m, ""); err != nil {
		return nil, fmt.Errorf("audit: refused: %s record: %w", r.RecordType(), err)
	}
	for _, k := range headerKeys {
		if _, dup := m[k]; dup {
			return nil, fmt.Errorf("BUG: audit: %s record has a member %q that the header owns", r.RecordType(), k)
		}
	}
	m["v"] = h.V
	m["run"] = h.Run
	m["seq"] = h.Seq
	m["prev"] = h.Prev
	m["time"] = formatTime(h.Time)
	m["type"] = h.Type
	return strictjson.Encode(m)
}

// checkNumbers refuses any number in the tree that is not an integer in
// [-MaxExactInt, MaxExactInt]: RFC 8785 would round it, and the writer
// would sign a value other than the record's (or, near 2^63, one that no
// longer fits the record's field, which its own verifier then rejects).
func checkNumbers(v any, path string) error {
	switch v := v.(type) {
	case strictjson.Number:
		n, err := v.Int64()
		if err != nil || n < -MaxExactInt || n > MaxExactInt {
			return fmt.Errorf("member %s is %.40s, not an integer in [-%d, %d] (JSON cannot carry it exactly)", strings.TrimPrefix(path, "."), v, int64(MaxExactInt), int64(MaxExactInt))
		}
	case map[string]any:
		for k, e := range v {
			if err := checkNumbers(e, path+"."+k); err != nil {
				return err
			}
		}
	case []any:
		for i, e := range v {
			if err := checkNumbers(e, fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	}
	return nil
}

// ParseLine parses one journal line (without LF) and its payload, and
// checks everything that does not need a key or the neighbouring lines:
// the envelope's exact form, a canonical payload, a well-formed header, a
// known record type and its members. It does NOT check the signature; use
// VerifyLine for that.
func ParseLine(line []byte) (*Entry, error) {
	env, err := parseEnvelope(line)
	if err != nil {
		return nil, err
	}
	e := &Entry{Line: line, Payload: env.payload, KeyID: env.keyID, Signature: env.sig}
	if err := parsePayload(e); err != nil {
		return nil, err
	}
	return e, nil
}

// VerifyLine is ParseLine plus the signature: the line's keyid must be
// KeyID(pub) and its signature must verify under pub. It is how a detached
// line (the broker's Moat-Pre-Effect header) is checked. It cannot check
// the line's place in a chain.
func VerifyLine(line []byte, pub ed25519.PublicKey) (*Entry, error) {
	env, err := parseEnvelope(line)
	if err != nil {
		return nil, err
	}
	if err := checkSig(env, pub); err != nil {
		return nil, err
	}
	e := &Entry{Line: line, Payload: env.payload, KeyID: env.keyID, Signature: env.sig}
	if err := parsePayload(e); err != nil {
		return nil, err
	}
	return e, nil
}

func checkSig(env envelope, pub ed25519.PublicKey) error {
	if len(pub) != ed25519.PublicKeySize {
		return lineErr(ErrWrongKey, "public key is %d bytes, want %d", len(pub), ed25519.PublicKeySize)
	}
	if want := KeyID(pub); env.keyID != want {
		return lineErr(ErrWrongKey, "keyid %s, want %s (the given public key)", env.keyID, want)
	}
	if !ed25519.Verify(pub, PAE(PayloadType, env.payload), env.sig) {
		return lineErr(ErrBadSignature, "Ed25519 signature over the PAE of the payload does not verify")
	}
	return nil
}

func parsePayload(e *Entry) error {
	canon, err := strictjson.Canonicalize(e.Payload)
	if err != nil {
		return lineErr(ErrNonCanonical, "payload is not valid JSON: %v", err)
	}
	if !bytes.Equal(canon, e.Payload) {
		return lineErr(ErrNonCanonical, "payload is valid JSON but not in RFC 8785 canonical form")
	}
	tree, err := strictjson.Decode(e.Payload)
	if err != nil {
		return lineErr(ErrNonCanonical, "payload: %v", err)
	}
	m, ok := tree.(map[string]any)
	if !ok {
		return lineErr(ErrBadHeader, "payload is not a JSON object")
	}
	h, err := parseHeader(m)
	if err != nil {
		return err
	}
	e.Header = h
	dec, ok := recordTypes[h.Type]
	if !ok {
		return lineErr(ErrUnknownType, "type %q", h.Type)
	}
	for _, k := range headerKeys {
		delete(m, k)
	}
	fields, err := strictjson.Encode(m)
	if err != nil {
		return lineErr(ErrBadRecord, "%s: %v", h.Type, err)
	}
	rec, err := dec(fields)
	if err != nil {
		return lineErr(ErrBadRecord, "%s: %v", h.Type, err)
	}
	// The payload must be exactly what the writer makes of this record:
	// no member the writer would omit, no other spelling of a value.
	again, err := encodePayload(h, rec)
	if err != nil || !bytes.Equal(again, e.Payload) {
		return lineErr(ErrBadRecord, "%s: members are not in the form the writer produces (e.g. an empty optional member, or a value out of range)", h.Type)
	}
	e.Record = rec
	return nil
}

func parseHeader(m map[string]any) (Header, error) {
	var h Header
	for _, k := range headerKeys {
		if _, ok := m[k]; !ok {
			return h, lineErr(ErrBadHeader, "payload has no %q member", k)
		}
	}
	v, ok := m["v"].(strictjson.Number)
	if !ok || v != "1" {
		return h, lineErr(ErrBadHeader, "v is %v, want %d", m["v"], formatVersion)
	}
	h.V = formatVersion
	run, ok := m["run"].(string)
	if !ok || !validRunID(run) {
		return h, lineErr(ErrBadHeader, "run %q is not a run id", m["run"])
	}
	h.Run = run
	seqN, ok := m["seq"].(strictjson.Number)
	if !ok {
		return h, lineErr(ErrBadHeader, "seq is not a number")
	}
	seq, err := seqN.Int64()
	if err != nil || seq < 1 || seq > MaxRecords {
		return h, lineErr(ErrBadHeader, "seq %s is not an integer in [1, %d]", seqN, MaxRecords)
	}
	h.Seq = seq
	prev, ok := m["prev"].(string)
	if !ok || len(prev) != keyIDLen || !isLowerHex([]byte(prev)) {
		return h, lineErr(ErrBadHeader, "prev is not %d lowercase hex digits", keyIDLen)
	}
	h.Prev = prev
	ts, ok := m["time"].(string)
	if !ok {
		return h, lineErr(ErrBadHeader, "time is not a string")
	}
	t, err := time.Parse(time.RFC3339Nano, ts)
	if err != nil || formatTime(t) != ts {
		return h, lineErr(ErrBadHeader, "time %q is not RFC 3339 UTC in the writer's form", ts)
	}
	h.Time = t
	typ, ok := m["type"].(string)
	if !ok {
		return h, lineErr(ErrBadHeader, "type is not a string")
	}
	h.Type = typ
	return h, nil
}

// validRunID: 1..MaxRunIDBytes of [A-Za-z0-9._:-].
func validRunID(s string) bool {
	if len(s) == 0 || len(s) > MaxRunIDBytes {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == ':' || c == '-') {
			return false
		}
	}
	return true
}
