package audit

import (
	"encoding/json"
	"strconv"
	"time"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/moat-sandbox/moat/internal/strictjson"
)

// encodePayload returns the canonical payload for h and r: the record's
// members as encoding/json writes them, the header's members written in
// front of them, and the whole canonicalized once (strictjson's strict
// reading and RFC 8785 form), with no tree decoded and encoded again.
//
// It is encodePayloadTree's answer, byte for byte, by construction: both
// canonicalize the same members with the same values (RFC 8785 gives one
// form per value), and the numbers check here reads the same number texts
// as checkNumbers. Whatever this path refuses (a number out of range, a
// member the header owns, a string that is not UTF-8) goes to
// encodePayloadTree, so that errors are its errors, word for word.
// TestEncodePayloadMatchesTree and FuzzEncodePayload hold the two to it.
func encodePayload(h Header, r Record) ([]byte, error) {
	fields, err := json.Marshal(r)
	if err != nil || !exactInts(fields) {
		return encodePayloadTree(h, r)
	}
	if len(fields) < 2 || fields[0] != '{' || fields[len(fields)-1] != '}' {
		return encodePayloadTree(h, r)
	}
	buf := make([]byte, 0, len(fields)+160+len(h.Run)+len(h.Prev)+len(h.Type))
	buf = append(buf, `{"v":`...)
	buf = strconv.AppendInt(buf, int64(h.V), 10)
	buf = append(buf, `,"run":`...)
	if buf, err = jsontext.AppendQuote(buf, h.Run); err != nil {
		return encodePayloadTree(h, r)
	}
	buf = append(buf, `,"seq":`...)
	buf = strconv.AppendInt(buf, h.Seq, 10)
	buf = append(buf, `,"prev":`...)
	if buf, err = jsontext.AppendQuote(buf, h.Prev); err != nil {
		return encodePayloadTree(h, r)
	}
	buf = append(buf, `,"time":`...)
	buf = h.Time.UTC().AppendFormat(append(buf, '"'), time.RFC3339Nano) // formatTime's form: digits and -:.TZ only
	buf = append(buf, `","type":`...)
	if buf, err = jsontext.AppendQuote(buf, h.Type); err != nil {
		return encodePayloadTree(h, r)
	}
	if len(fields) > 2 {
		buf = append(buf, ',')
		buf = append(buf, fields[1:]...)
	} else {
		buf = append(buf, '}')
	}
	// A record member named like a header member is a duplicate name,
	// which Canonicalize refuses.
	out, err := strictjson.Canonicalize(buf)
	if err != nil {
		return encodePayloadTree(h, r)
	}
	return out, nil
}

// exactInts reports whether every number in b (encoding/json's compact
// output) is an integer in [-MaxExactInt, MaxExactInt] written without
// fraction or exponent: checkNumbers' rule, on the same texts. Bytes it
// cannot read as that output make it report false.
func exactInts(b []byte) bool {
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			for i++; i < len(b) && b[i] != '"'; i++ {
				if b[i] == '\\' {
					i++
				}
			}
			if i >= len(b) {
				return false
			}
		case c == '-' || '0' <= c && c <= '9':
			j := i
			for j < len(b) && (b[j] == '-' || b[j] == '+' || b[j] == '.' || b[j] == 'e' || b[j] == 'E' || '0' <= b[j] && b[j] <= '9') {
				j++
			}
			n, err := strconv.ParseInt(string(b[i:j]), 10, 64)
			if err != nil || n < -MaxExactInt || n > MaxExactInt {
				return false
			}
			i = j - 1
		}
	}
	return true
}
