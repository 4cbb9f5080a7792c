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
	"strconv"
)

// Journal format constants (DESIGN.md, The journal).
const (
	AuditPayloadType = "application/vnd.moat.audit.v1+json"
	// MaxJournalBytes caps a journal read by the verifier.
	MaxJournalBytes = 64 << 20
	// MaxJournalLine caps one journal line.
	MaxJournalLine = 1 << 20
	zeroPrev       = "0000000000000000000000000000000000000000000000000000000000000000"
)

// Journal statuses, as `moat audit verify` reports them.
const (
	JournalMissing    = "missing"
	JournalInvalid    = "invalid"
	JournalIncomplete = "incomplete" // a valid prefix without its terminal record
	JournalComplete   = "complete"
)

// Envelope is a DSSE envelope.
type Envelope struct {
	PayloadType string      `json:"payloadType"`
	Payload     string      `json:"payload"`
	Signatures  []Signature `json:"signatures"`
}

// Signature is one DSSE signature.
type Signature struct {
	KeyID string `json:"keyid"`
	Sig   string `json:"sig"`
}

// PAE is DSSE's pre-authentication encoding:
// "DSSEv1" SP len(type) SP type SP len(body) SP body, lengths in ASCII decimal.
func PAE(payloadType string, payload []byte) []byte {
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

// KeyID is the hex sha256 of a raw Ed25519 public key.
func KeyID(pub ed25519.PublicKey) string {
	s := sha256.Sum256(pub)
	return hex.EncodeToString(s[:])
}

// ParsePublicKeyPEM parses a PKIX "PUBLIC KEY" PEM block holding an Ed25519 key.
func ParsePublicKeyPEM(b []byte) (ed25519.PublicKey, error) {
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "PUBLIC KEY" {
		return nil, errors.New("no PUBLIC KEY PEM block")
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

// PublicKeyPEM encodes an Ed25519 public key as PKIX PEM.
func PublicKeyPEM(pub ed25519.PublicKey) []byte {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		panic("BUG: marshal ed25519 public key: " + err.Error())
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}

// VerifyEnvelope checks a DSSE envelope line against pub and returns its
// decoded payload and the PAE bytes that were signed.
func VerifyEnvelope(line []byte, payloadType string, pub ed25519.PublicKey) (payload, pae, sig []byte, err error) {
	var env Envelope
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&env); err != nil {
		return nil, nil, nil, fmt.Errorf("envelope: %w", err)
	}
	if dec.More() {
		return nil, nil, nil, errors.New("envelope: trailing data")
	}
	if env.PayloadType != payloadType {
		return nil, nil, nil, fmt.Errorf("payloadType %q, want %q", env.PayloadType, payloadType)
	}
	if len(env.Signatures) != 1 {
		return nil, nil, nil, fmt.Errorf("%d signatures, want 1", len(env.Signatures))
	}
	if env.Signatures[0].KeyID != KeyID(pub) {
		return nil, nil, nil, fmt.Errorf("keyid %q is not the pinned key %s", env.Signatures[0].KeyID, KeyID(pub))
	}
	payload, err = base64.StdEncoding.Strict().DecodeString(env.Payload)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("payload: %w", err)
	}
	sig, err = base64.StdEncoding.Strict().DecodeString(env.Signatures[0].Sig)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("signature: %w", err)
	}
	pae = PAE(env.PayloadType, payload)
	if !ed25519.Verify(pub, pae, sig) {
		return nil, nil, nil, errors.New("signature does not verify against the pinned key")
	}
	return payload, pae, sig, nil
}

// JournalRecord is one verified journal line.
type JournalRecord struct {
	Line    string         // the exact line, without its LF
	Seq     int            // its seq
	Type    string         // its type
	Fields  map[string]any // the whole payload
	Payload []byte
}

// JournalResult is what VerifyJournal found.
type JournalResult struct {
	Status   string
	Records  []JournalRecord
	FirstBad int    // 1-based line number of the first bad line (invalid only)
	Reason   string // why invalid or incomplete
}

// VerifyJournal verifies a journal's exact bytes against the pinned key:
// complete when its last line is run.terminated, incomplete for a valid
// prefix (possibly followed by one torn line without LF), invalid otherwise.
func VerifyJournal(data []byte, pub ed25519.PublicKey) JournalResult {
	var res JournalResult
	if len(data) > MaxJournalBytes {
		return JournalResult{Status: JournalInvalid, FirstBad: 1, Reason: "journal exceeds MaxJournalBytes"}
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
		if len(line) > MaxJournalLine {
			return invalidAt(res, n, "line exceeds MaxJournalLine")
		}
		payload, _, _, err := VerifyEnvelope(line, AuditPayloadType, pub)
		if err != nil {
			return invalidAt(res, n, err.Error())
		}
		var f map[string]any
		d := json.NewDecoder(bytes.NewReader(payload))
		d.UseNumber()
		if err := d.Decode(&f); err != nil {
			return invalidAt(res, n, "payload: "+err.Error())
		}
		num, _ := f["seq"].(json.Number)
		seq, err := num.Int64()
		if err != nil || seq != int64(n) {
			return invalidAt(res, n, fmt.Sprintf("seq %v, want %d", f["seq"], n))
		}
		if p, _ := f["prev"].(string); p != prev {
			return invalidAt(res, n, fmt.Sprintf("prev %q does not chain to the previous line (%s)", p, prev))
		}
		r, _ := f["run"].(string)
		if n == 1 {
			run = r
		} else if r != run {
			return invalidAt(res, n, fmt.Sprintf("run %q differs from the journal's %q", r, run))
		}
		typ, _ := f["type"].(string)
		if n == 1 && typ != "run.started" {
			return invalidAt(res, n, fmt.Sprintf("first record is %q, want run.started", typ))
		}
		h := sha256.Sum256(line)
		prev = hex.EncodeToString(h[:])
		res.Records = append(res.Records, JournalRecord{Line: string(line), Seq: int(seq), Type: typ, Fields: f, Payload: payload})
	}
	if len(res.Records) == 0 {
		return JournalResult{Status: JournalIncomplete, Reason: "empty journal"}
	}
	if res.terminal() {
		res.Status = JournalComplete
	} else {
		res.Status, res.Reason = JournalIncomplete, "no run.terminated record"
	}
	return res
}

func (r JournalResult) terminal() bool {
	return len(r.Records) > 0 && r.Records[len(r.Records)-1].Type == "run.terminated"
}

func invalidAt(r JournalResult, n int, why string) JournalResult {
	return JournalResult{Status: JournalInvalid, Records: r.Records, FirstBad: n, Reason: fmt.Sprintf("line %d: %s", n, why)}
}
