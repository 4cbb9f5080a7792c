package evidence

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf16"
	"unicode/utf8"
)

// Journal format constants (DESIGN.md, The journal). This file is the
// evidence suite's own reading of the format, independent of package audit
// (see the package doc) and as strict as it: it refuses what audit's
// verifier refuses in the envelope, the payload's form, the header and the
// public key file, each checked here by other code.
const (
	auditPayloadType = "application/vnd.moat.audit.v1+json"
	// maxJournalBytes caps a journal read by the verifier.
	maxJournalBytes = 64 << 20
	// maxJournalLine caps one journal line.
	maxJournalLine = 4 << 20
	// maxPublicKeyPEM caps a public key file.
	maxPublicKeyPEM = 4 << 10
	// maxRecords caps the records of one journal (seq runs 1..maxRecords).
	maxRecords = 1 << 20
	// maxExactInt is 2^53-1: every number in a payload is an integer
	// within ±maxExactInt (RFC 8785 numbers are IEEE 754 doubles).
	maxExactInt = 1<<53 - 1
	zeroPrev    = "0000000000000000000000000000000000000000000000000000000000000000"
)

// recordTypes are the journal's record types; a payload of any other type
// is refused.
var recordTypes = []string{
	"run.started", "boundary.confirmed", "inference.requested", "inference.completed",
	"inference.refused", "inference.failed", "process.started", "process.exited",
	"process.failed", "run.terminated",
	"tool.requested", "tool.completed", "tool.refused", "tool.failed", "tool.server_confirmed",
	"egress.opened", "egress.closed", "egress.refused",
	"service.requested", "service.completed", "service.refused", "service.failed",
	"approval.requested", "approval.decided", "approval.substitution", "budget.updated",
}

// Journal statuses, as `moat audit verify` reports them.
const (
	JournalMissing    = "missing"
	JournalInvalid    = "invalid"
	JournalIncomplete = "incomplete" // a valid prefix without its terminal record
	JournalComplete   = "complete"
)

// envelope is a DSSE envelope. Its members are exported for encoding/json.
type envelope struct {
	PayloadType string      `json:"payloadType"`
	Payload     string      `json:"payload"`
	Signatures  []signature `json:"signatures"`
}

// signature is one DSSE signature.
type signature struct {
	KeyID string `json:"keyid"`
	Sig   string `json:"sig"`
}

// dssePAE is DSSE's pre-authentication encoding:
// "DSSEv1" SP len(type) SP type SP len(body) SP body, lengths in ASCII decimal.
func dssePAE(payloadType string, payload []byte) []byte {
	var b bytes.Buffer
	b.WriteString("DSSEv1 ")
	b.WriteString(strconv.Itoa(len(payloadType)))
	b.WriteByte(' ')
	b.WriteString(payloadType)
	b.WriteByte(' ')
	b.WriteString(strconv.Itoa(len(payload)))
	b.WriteByte(' ')
	b.Write(payload)
	return b.Bytes()
}

// keyIDOf is the hex sha256 of a raw Ed25519 public key.
func keyIDOf(pub ed25519.PublicKey) string {
	s := sha256.Sum256(pub)
	return hex.EncodeToString(s[:])
}

// parsePublicKeyPEM parses a file that is exactly one PKIX "PUBLIC KEY"
// PEM block, without headers, holding an Ed25519 key; only whitespace may
// surround the block.
func parsePublicKeyPEM(b []byte) (ed25519.PublicKey, error) {
	if len(b) > maxPublicKeyPEM {
		return nil, fmt.Errorf("public key file is %d bytes, more than %d", len(b), maxPublicKeyPEM)
	}
	blk, rest := pem.Decode(b)
	switch {
	case blk == nil || blk.Type != "PUBLIC KEY":
		return nil, errors.New("no PUBLIC KEY PEM block")
	case !bytes.HasPrefix(bytes.TrimLeft(b, " \t\r\n"), []byte("-----BEGIN PUBLIC KEY-----")) ||
		bytes.Count(b[:len(b)-len(rest)], []byte("-----BEGIN")) != 1:
		// pem.Decode skips what it cannot parse before a block, even a
		// line that looks like a block's start.
		return nil, errors.New("data before the PUBLIC KEY PEM block")
	case len(blk.Headers) != 0:
		return nil, errors.New("the PUBLIC KEY PEM block has headers")
	case len(bytes.TrimSpace(rest)) != 0:
		return nil, errors.New("data after the PUBLIC KEY PEM block")
	}
	k, err := x509.ParsePKIXPublicKey(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("public key: %w", err)
	}
	pub, ok := k.(ed25519.PublicKey)
	if !ok {
		return nil, fmt.Errorf("public key is %T, want Ed25519", k)
	}
	return pub, nil
}

// publicKeyPEM encodes an Ed25519 public key as PKIX PEM.
func publicKeyPEM(pub ed25519.PublicKey) []byte {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		panic("BUG: marshal ed25519 public key: " + err.Error())
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}

// verifyEnvelope checks a DSSE envelope line against pub and returns its
// decoded payload and the PAE bytes that were signed. The line must be
// exactly the compact JSON that encoding/json makes of the envelope (member
// order payloadType, payload, signatures; one signature; no whitespace or
// anything after it), the one form moat writes.
func verifyEnvelope(line []byte, payloadType string, pub ed25519.PublicKey) (payload, pae, sig []byte, err error) {
	var env envelope
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&env); err != nil {
		return nil, nil, nil, fmt.Errorf("envelope: %w", err)
	}
	if again, err := json.Marshal(env); err != nil || !bytes.Equal(again, line) {
		return nil, nil, nil, errors.New("envelope: not in its one form (compact JSON, members in order, one signature, nothing after it)")
	}
	if env.PayloadType != payloadType {
		return nil, nil, nil, fmt.Errorf("payloadType %q, want %q", env.PayloadType, payloadType)
	}
	if len(env.Signatures) != 1 {
		return nil, nil, nil, fmt.Errorf("%d signatures, want 1", len(env.Signatures))
	}
	if env.Signatures[0].KeyID != keyIDOf(pub) {
		return nil, nil, nil, fmt.Errorf("keyid %q is not the pinned key %s", env.Signatures[0].KeyID, keyIDOf(pub))
	}
	payload, err = base64.StdEncoding.Strict().DecodeString(env.Payload)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("payload: %w", err)
	}
	sig, err = base64.StdEncoding.Strict().DecodeString(env.Signatures[0].Sig)
	if err != nil || len(sig) != ed25519.SignatureSize {
		return nil, nil, nil, fmt.Errorf("signature: not base64 of %d bytes", ed25519.SignatureSize)
	}
	pae = dssePAE(env.PayloadType, payload)
	if !ed25519.Verify(pub, pae, sig) {
		return nil, nil, nil, errors.New("signature does not verify against the pinned key")
	}
	return payload, pae, sig, nil
}

// journalRecord is one verified journal line.
type journalRecord struct {
	Line    string         // the exact line, without its LF
	Seq     int            // its seq
	Type    string         // its type
	Fields  map[string]any // the whole payload
	Payload []byte
}

// journalResult is what verifyJournal found.
type journalResult struct {
	Status   string
	Records  []journalRecord
	FirstBad int    // 1-based line number of the first bad line (invalid only)
	Reason   string // why invalid or incomplete
}

// verifyJournal verifies a journal's exact bytes against the pinned key:
// complete when its last line is run.terminated, incomplete for a valid
// prefix (possibly followed by one torn line without LF), invalid otherwise.
func verifyJournal(data []byte, pub ed25519.PublicKey) journalResult {
	var res journalResult
	if len(data) > maxJournalBytes {
		return journalResult{Status: JournalInvalid, FirstBad: 1, Reason: "journal exceeds maxJournalBytes"}
	}
	prev := zeroPrev
	run := ""
	rest := data
	for n := 1; len(rest) > 0; n++ {
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			// A torn last line: the prefix stays valid, the run is incomplete.
			if res.terminal() {
				return invalidAt(res, n, "bytes after the terminal record")
			}
			res.Status, res.Reason = JournalIncomplete, fmt.Sprintf("line %d is torn (no LF)", n)
			return res
		}
		line := rest[:i]
		rest = rest[i+1:]
		if res.terminal() {
			return invalidAt(res, n, "bytes after the terminal record")
		}
		if len(line) > maxJournalLine {
			return invalidAt(res, n, "line exceeds maxJournalLine")
		}
		payload, _, _, err := verifyEnvelope(line, auditPayloadType, pub)
		if err != nil {
			return invalidAt(res, n, err.Error())
		}
		f, err := decodePayload(payload)
		if err != nil {
			return invalidAt(res, n, "payload: "+err.Error())
		}
		if v, _ := f["v"].(json.Number); v != "1" {
			return invalidAt(res, n, fmt.Sprintf("v %v, want 1", f["v"]))
		}
		num, _ := f["seq"].(json.Number)
		seq, err := num.Int64()
		if err != nil || seq != int64(n) || seq > maxRecords {
			return invalidAt(res, n, fmt.Sprintf("seq %v, want %d (at most %d)", f["seq"], n, maxRecords))
		}
		if p, _ := f["prev"].(string); p != prev {
			return invalidAt(res, n, fmt.Sprintf("prev %q does not chain to the previous line (%s)", p, prev))
		}
		r, _ := f["run"].(string)
		if n == 1 {
			if !runIDForm(r) {
				return invalidAt(res, n, fmt.Sprintf("run %q is not a run id", f["run"]))
			}
			run = r
		} else if r != run {
			return invalidAt(res, n, fmt.Sprintf("run %q differs from the journal's %q", r, run))
		}
		if ts, _ := f["time"].(string); !timeForm(ts) {
			return invalidAt(res, n, fmt.Sprintf("time %q is not RFC 3339 UTC in the writer's form", f["time"]))
		}
		typ, _ := f["type"].(string)
		if !slices.Contains(recordTypes, typ) {
			return invalidAt(res, n, fmt.Sprintf("type %q is not a record type", f["type"]))
		}
		if (n == 1) != (typ == "run.started") {
			return invalidAt(res, n, fmt.Sprintf("record %d is %q: run.started is the first record and only that", n, typ))
		}
		if typ == "boundary.confirmed" && n != 2 {
			return invalidAt(res, n, "boundary.confirmed is record 2 or absent")
		}
		if n == 2 && typ != "boundary.confirmed" && typ != "run.terminated" {
			return invalidAt(res, n, fmt.Sprintf("record 2 is %q, want boundary.confirmed (or run.terminated)", typ))
		}
		if typ == "run.terminated" {
			if err := checkCounts(f["counts"], res.Records); err != nil {
				return invalidAt(res, n, "run.terminated: "+err.Error())
			}
		}
		h := sha256.Sum256(line)
		prev = hex.EncodeToString(h[:])
		res.Records = append(res.Records, journalRecord{Line: string(line), Seq: int(seq), Type: typ, Fields: f, Payload: payload})
	}
	if len(res.Records) == 0 {
		return journalResult{Status: JournalIncomplete, Reason: "empty journal"}
	}
	if res.terminal() {
		res.Status = JournalComplete
	} else {
		res.Status, res.Reason = JournalIncomplete, "no run.terminated record"
	}
	return res
}

// countedTypes are the record types that run.terminated's counts count,
// by their member names there.
var countedTypes = map[string]string{
	"requested": "inference.requested",
	"completed": "inference.completed",
	"refused":   "inference.refused",
	"failed":    "inference.failed",
	"processes": "process.started",
}

// toolCountedTypes are the record types that counts.tools counts; the
// member is present exactly when one of them precedes run.terminated.
var toolCountedTypes = map[string]string{
	"requested": "tool.requested",
	"completed": "tool.completed",
	"refused":   "tool.refused",
	"failed":    "tool.failed",
}

// checkCounts: run.terminated's counts are exactly the numbers of records
// of each counted type before it.
func checkCounts(v any, before []journalRecord) error {
	counts, ok := v.(map[string]any)
	if !ok {
		return fmt.Errorf("counts %v is not an object", v)
	}
	// Only the four types counts.tools counts make it present:
	// tool.server_confirmed (and the egress and service records) count
	// nowhere.
	tools := 0
	for _, r := range before {
		for _, typ := range toolCountedTypes {
			if r.Type == typ {
				tools++
			}
		}
	}
	want := len(countedTypes)
	if tools > 0 {
		want++
		if err := checkCountMembers("counts.tools", counts["tools"], toolCountedTypes, before); err != nil {
			return err
		}
	}
	if len(counts) != want {
		return fmt.Errorf("counts %v is not an object of exactly %d members (%d tool records precede it)", v, want, tools)
	}
	return checkCountMembers("counts", v, countedTypes, before)
}

// checkCountMembers: v holds every member of types with the number of
// records of its type in before.
func checkCountMembers(name string, v any, types map[string]string, before []journalRecord) error {
	m, ok := v.(map[string]any)
	if !ok {
		return fmt.Errorf("%s %v is not an object", name, v)
	}
	if name != "counts" && len(m) != len(types) {
		return fmt.Errorf("%s %v is not an object of exactly %d members", name, v, len(types))
	}
	for member, typ := range types {
		want := 0
		for _, r := range before {
			if r.Type == typ {
				want++
			}
		}
		if got, _ := m[member].(json.Number); got != json.Number(strconv.Itoa(want)) {
			return fmt.Errorf("%s.%s is %v, but %d %s records precede it", name, member, m[member], want, typ)
		}
	}
	return nil
}

func (r journalResult) terminal() bool {
	return len(r.Records) > 0 && r.Records[len(r.Records)-1].Type == "run.terminated"
}

func invalidAt(r journalResult, n int, why string) journalResult {
	return journalResult{Status: JournalInvalid, Records: r.Records, FirstBad: n, Reason: fmt.Sprintf("line %d: %s", n, why)}
}

// decodePayload decodes a payload that must be one JSON object in RFC 8785
// canonical form: it is decoded, encoded again by canonical below, and must
// come out byte for byte the same. That refuses trailing data, whitespace,
// duplicate or unsorted members, other escapes and invalid UTF-8.
func decodePayload(payload []byte) (map[string]any, error) {
	d := json.NewDecoder(bytes.NewReader(payload))
	d.UseNumber()
	var f map[string]any
	if err := d.Decode(&f); err != nil {
		return nil, err
	}
	if f == nil {
		return nil, errors.New("not a JSON object")
	}
	b, err := canonical(nil, f)
	if err != nil {
		return nil, err
	}
	if !bytes.Equal(b, payload) {
		return nil, errors.New("not one JSON object in RFC 8785 canonical form")
	}
	return f, nil
}

// canonical appends the RFC 8785 form of v (as encoding/json decodes it
// with UseNumber) to b. Numbers must be integers within ±maxExactInt, as
// the writer makes them; for those, RFC 8785's form is the shortest
// decimal, which is the only one allowed.
func canonical(b []byte, v any) ([]byte, error) {
	switch v := v.(type) {
	case nil:
		return append(b, "null"...), nil
	case bool:
		return strconv.AppendBool(b, v), nil
	case json.Number:
		n, err := strconv.ParseInt(string(v), 10, 64)
		if err != nil || n < -maxExactInt || n > maxExactInt {
			return nil, fmt.Errorf("number %.40s is not an integer within ±%d", v, int64(maxExactInt))
		}
		return strconv.AppendInt(b, n, 10), nil
	case string:
		return appendJSONString(b, v), nil
	case []any:
		b = append(b, '[')
		for i, e := range v {
			if i > 0 {
				b = append(b, ',')
			}
			var err error
			if b, err = canonical(b, e); err != nil {
				return nil, err
			}
		}
		return append(b, ']'), nil
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		// RFC 8785 3.2.3: members sorted by their names as UTF-16 code units.
		slices.SortFunc(keys, func(x, y string) int { return slices.Compare(utf16.Encode([]rune(x)), utf16.Encode([]rune(y))) })
		b = append(b, '{')
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, k)
			b = append(b, ':')
			var err error
			if b, err = canonical(b, v[k]); err != nil {
				return nil, err
			}
		}
		return append(b, '}'), nil
	}
	return nil, fmt.Errorf("BUG: unexpected JSON value %T", v)
}

// appendJSONString appends s as RFC 8785 (ECMAScript JSON.stringify)
// writes it: the two-character escapes for " \ \b \f \n \r \t, \u00xx
// (lowercase hex) for the other control characters, everything else as is.
func appendJSONString(b []byte, s string) []byte {
	const hexDigits = "0123456789abcdef"
	b = append(b, '"')
	for _, r := range s {
		switch r {
		case '"':
			b = append(b, `\"`...)
		case '\\':
			b = append(b, `\\`...)
		case '\b':
			b = append(b, `\b`...)
		case '\f':
			b = append(b, `\f`...)
		case '\n':
			b = append(b, `\n`...)
		case '\r':
			b = append(b, `\r`...)
		case '\t':
			b = append(b, `\t`...)
		default:
			if r < 0x20 {
				b = append(b, '\\', 'u', '0', '0', hexDigits[r>>4], hexDigits[r&0xf])
			} else {
				b = utf8.AppendRune(b, r)
			}
		}
	}
	return append(b, '"')
}

// runIDForm: 1..128 bytes of [A-Za-z0-9._:-], as moat makes run ids.
func runIDForm(s string) bool {
	if len(s) == 0 || len(s) > 128 {
		return false
	}
	for _, c := range []byte(s) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("._:-", c) >= 0) {
			return false
		}
	}
	return true
}

// timeForm: RFC 3339 in UTC as time.RFC3339Nano formats it (trailing
// zeros of the fraction dropped, "Z").
func timeForm(s string) bool {
	t, err := time.Parse(time.RFC3339Nano, s)
	return err == nil && t.UTC().Format(time.RFC3339Nano) == s
}
