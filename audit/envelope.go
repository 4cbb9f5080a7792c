package audit

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"strconv"
)

// PayloadType is the DSSE payloadType of every journal line.
const PayloadType = "application/vnd.moat.audit.v1+json"

// The fixed bytes of an envelope line, in order. A line is
//
//	envPrefix || base64(payload) || envMiddle || keyid || envSig || base64(sig) || envSuffix
//
// and nothing else: no whitespace, no other member order, no second
// signature.
const (
	envPrefix = `{"payloadType":"` + PayloadType + `","payload":"`
	envMiddle = `","signatures":[{"keyid":"`
	envSig    = `","sig":"`
	envSuffix = `"}]}`
)

// keyIDLen is the length of a keyid: hex of a sha256.
const keyIDLen = 2 * sha256.Size

// sigB64Len is the length of a base64-encoded (padded) Ed25519 signature.
var sigB64Len = base64.StdEncoding.EncodedLen(ed25519.SignatureSize)

// b64 is the only base64 the format accepts: standard alphabet, padded,
// with zero padding bits (so that each byte string has one encoding).
var b64 = base64.StdEncoding.Strict()

// PAE is DSSE's pre-authentication encoding of (payloadType, payload):
//
//	"DSSEv1" SP LEN(payloadType) SP payloadType SP LEN(payload) SP payload
//
// where SP is one 0x20 byte and LEN is the byte length in ASCII decimal
// without leading zeros. The Ed25519 signature of a line is over these bytes.
func PAE(payloadType string, payload []byte) []byte {
	b := make([]byte, 0, len("DSSEv1 ")+len(payloadType)+len(payload)+24)
	b = append(b, "DSSEv1 "...)
	b = strconv.AppendInt(b, int64(len(payloadType)), 10)
	b = append(b, ' ')
	b = append(b, payloadType...)
	b = append(b, ' ')
	b = strconv.AppendInt(b, int64(len(payload)), 10)
	b = append(b, ' ')
	return append(b, payload...)
}

// KeyID returns the keyid of pub: the lowercase hex sha256 of its raw 32
// bytes.
func KeyID(pub ed25519.PublicKey) string {
	s := sha256.Sum256(pub)
	return hex.EncodeToString(s[:])
}

// LineHash returns the value that the next record's prev holds: the
// lowercase hex sha256 of line, which is a journal line without its LF.
func LineHash(line []byte) string {
	s := sha256.Sum256(line)
	return hex.EncodeToString(s[:])
}

// ZeroPrev is the prev of the first record.
const ZeroPrev = "0000000000000000000000000000000000000000000000000000000000000000"

// MarshalPublicKeyPEM encodes pub as a PEM block of type "PUBLIC KEY"
// holding its PKIX (RFC 8410) DER encoding, as openssl expects.
func MarshalPublicKeyPEM(pub ed25519.PublicKey) ([]byte, error) {
	if len(pub) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("audit: public key is %d bytes, want %d", len(pub), ed25519.PublicKeySize)
	}
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, fmt.Errorf("audit: encoding public key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), nil
}

// MaxPublicKeyPEM caps the size of a public key file.
const MaxPublicKeyPEM = 4 << 10

// ParsePublicKeyPEM parses one PEM block of type "PUBLIC KEY" holding a PKIX
// Ed25519 public key. Anything else in the input, before or after the block,
// is refused.
func ParsePublicKeyPEM(b []byte) (ed25519.PublicKey, error) {
	if len(b) > MaxPublicKeyPEM {
		return nil, fmt.Errorf("audit: public key file is %d bytes, more than %d: not a PEM public key", len(b), MaxPublicKeyPEM)
	}
	if !bytes.HasPrefix(bytes.TrimLeft(b, " \t\r\n"), []byte("-----BEGIN ")) {
		return nil, errors.New(`audit: not a PEM file: want the run's pubkey.pem, starting "-----BEGIN PUBLIC KEY-----"`)
	}
	blk, rest := pem.Decode(b)
	if blk == nil {
		return nil, errors.New(`audit: no PEM block found; want the run's pubkey.pem ("-----BEGIN PUBLIC KEY-----")`)
	}
	if blk.Type != "PUBLIC KEY" {
		return nil, fmt.Errorf("audit: PEM block is %q, want \"PUBLIC KEY\"", blk.Type)
	}
	// pem.Decode skips what it cannot parse before a block, including a
	// line that only looks like a block's start: the block must be the
	// first thing in the file.
	if bytes.Count(b[:len(b)-len(rest)], []byte("-----BEGIN")) != 1 {
		return nil, errors.New("audit: data before the PUBLIC KEY block; want exactly one block")
	}
	if len(blk.Headers) != 0 {
		return nil, errors.New("audit: PEM block has headers; want a plain PUBLIC KEY block")
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		return nil, errors.New("audit: data after the PUBLIC KEY block; want exactly one block")
	}
	k, err := x509.ParsePKIXPublicKey(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("audit: parsing public key: %w", err)
	}
	pub, ok := k.(ed25519.PublicKey)
	if !ok {
		return nil, fmt.Errorf("audit: public key is %T, want Ed25519", k)
	}
	return pub, nil
}

// appendEnvelope appends the envelope line (without LF) for payload and sig.
func appendEnvelope(b []byte, payload []byte, keyID string, sig []byte) []byte {
	b = append(b, envPrefix...)
	b = b64.AppendEncode(b, payload)
	b = append(b, envMiddle...)
	b = append(b, keyID...)
	b = append(b, envSig...)
	b = b64.AppendEncode(b, sig)
	return append(b, envSuffix...)
}

// envelope is a parsed line, before any check of its contents.
type envelope struct {
	payload []byte
	keyID   string
	sig     []byte
}

// parseEnvelope splits line into its parts, insisting on the exact form that
// appendEnvelope produces.
func parseEnvelope(line []byte) (envelope, error) {
	var e envelope
	if len(line) > MaxLineBytes {
		return e, lineErr(ErrMalformed, "line is %d bytes, more than the limit of %d", len(line), MaxLineBytes)
	}
	if bytes.HasSuffix(line, []byte("\r")) {
		return e, lineErr(ErrMalformed, "line ends with CR (CRLF line endings are not allowed)")
	}
	rest, ok := bytes.CutPrefix(line, []byte(envPrefix))
	if !ok {
		if bytes.HasPrefix(line, []byte(`{"payloadType":"`)) {
			return e, lineErr(ErrMalformed, "not an envelope of payloadType %q (or not in its canonical form)", PayloadType)
		}
		return e, lineErr(ErrMalformed, "not a DSSE envelope line: must begin with %q", envPrefix)
	}
	p64, rest, ok := bytes.Cut(rest, []byte(envMiddle))
	if !ok {
		return e, lineErr(ErrMalformed, "envelope: signatures member missing or not in canonical form")
	}
	payload, err := b64.DecodeString(string(p64))
	if err != nil {
		return e, lineErr(ErrMalformed, "envelope: payload is not canonical padded base64: %v", err)
	}
	if len(rest) < keyIDLen || !isLowerHex(rest[:keyIDLen]) {
		return e, lineErr(ErrMalformed, "envelope: keyid is not %d lowercase hex digits", keyIDLen)
	}
	keyID := string(rest[:keyIDLen])
	rest, ok = bytes.CutPrefix(rest[keyIDLen:], []byte(envSig))
	if !ok {
		return e, lineErr(ErrMalformed, "envelope: sig member missing after keyid, or a second signature")
	}
	if len(rest) != sigB64Len+len(envSuffix) || !bytes.Equal(rest[sigB64Len:], []byte(envSuffix)) {
		return e, lineErr(ErrMalformed, "envelope: want exactly one %d-character base64 Ed25519 signature, then %q", sigB64Len, envSuffix)
	}
	sig, err := b64.DecodeString(string(rest[:sigB64Len]))
	if err != nil || len(sig) != ed25519.SignatureSize {
		return e, lineErr(ErrMalformed, "envelope: sig is not canonical base64 of %d bytes", ed25519.SignatureSize)
	}
	return envelope{payload: payload, keyID: keyID, sig: sig}, nil
}

func isLowerHex(b []byte) bool {
	for _, c := range b {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}
