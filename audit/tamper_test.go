package audit

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/internal/strictjson"
)

// resign decodes line's payload, lets edit change it, and signs the
// canonical result with priv: a well-signed line with chosen content.
func resign(t *testing.T, priv ed25519.PrivateKey, line []byte, edit func(m map[string]any)) []byte {
	t.Helper()
	env, err := parseEnvelope(line)
	if err != nil {
		t.Fatal(err)
	}
	tree, err := strictjson.Decode(env.payload)
	if err != nil {
		t.Fatal(err)
	}
	m := tree.(map[string]any)
	edit(m)
	p, err := strictjson.Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	return signLine(priv, p)
}

// flip returns a copy of line with the byte at off replaced by a different
// character of the same class (base64 or hex), so that only content changes.
func flip(line []byte, off int) []byte {
	out := bytes.Clone(line)
	if out[off] == 'A' {
		out[off] = 'B'
	} else {
		out[off] = 'A'
	}
	return out
}

func replaceLine(lines [][]byte, i int, l []byte) [][]byte {
	out := append([][]byte(nil), lines...)
	out[i] = l
	return out
}

func TestTamperMatrix(t *testing.T) {
	j := buildJournal(t)
	L := j.lines
	n := len(L)
	_, otherPriv, _ := ed25519.GenerateKey(rand.Reader)
	payloadOff := len(envPrefix) + 20
	sigOff := len(L[3]) - len(envSuffix) - 40

	// A payload re-encoded with its members in a non-canonical order and
	// whitespace, signed with the right key.
	env3, _ := parseEnvelope(L[3])
	nonCanon := append([]byte("{ "), env3.payload[1:]...)

	cases := []struct {
		name    string
		journal []byte
		pub     ed25519.PublicKey
		status  Status
		kind    error
		line    int
	}{
		{"intact", j.raw, nil, Complete, nil, 0},
		{"flipped byte in a payload", joinLines(replaceLine(L, 3, flip(L[3], payloadOff))), nil, Invalid, ErrBadSignature, 4},
		{"flipped byte in a signature", joinLines(replaceLine(L, 3, flip(L[3], sigOff))), nil, Invalid, ErrBadSignature, 4},
		{"flipped byte in prev, signature kept", joinLines(replaceLine(L, 3, func() []byte {
			env, _ := parseEnvelope(L[3])
			p := bytes.Replace(env.payload, []byte(`"prev":"`), []byte(`"prev":"`), 1)
			i := bytes.Index(p, []byte(`"prev":"`)) + 8
			p[i] ^= 1
			return appendEnvelope(nil, p, env.keyID, env.sig)
		}())), nil, Invalid, ErrBadSignature, 4},
		{"flipped byte in prev, re-signed", joinLines(replaceLine(L, 3, resign(t, j.priv, L[3], func(m map[string]any) {
			p := []byte(m["prev"].(string))
			if p[0] == '0' { // another lowercase hex digit
				p[0] = '1'
			} else {
				p[0] = '0'
			}
			m["prev"] = string(p)
		}))), nil, Invalid, ErrBrokenLink, 4},
		{"two lines swapped", joinLines(append(append(append([][]byte{}, L[:3]...), L[4], L[3]), L[5:]...)), nil, Invalid, ErrSequence, 4},
		{"middle line dropped", joinLines(append(append([][]byte{}, L[:4]...), L[5:]...)), nil, Invalid, ErrSequence, 5},
		{"terminal line dropped", joinLines(L[:n-1]), nil, Incomplete, ErrNoTerminal, 0},
		{"only the first line", joinLines(L[:1]), nil, Incomplete, ErrNoTerminal, 0},
		{"line duplicated", joinLines(append(append(append([][]byte{}, L[:4]...), L[3]), L[4:]...)), nil, Invalid, ErrDuplicate, 5},
		{"torn last line", append(joinLines(L[:n-1]), L[n-1][:37]...), nil, Incomplete, ErrTornTail, n},
		{"torn: last line without its LF", bytes.TrimSuffix(j.raw, []byte("\n")), nil, Incomplete, ErrTornTail, n},
		{"torn: zeros after the last LF", append(joinLines(L[:n-1]), make([]byte, 300)...), nil, Incomplete, ErrTornTail, n},
		{"line signed by another key", joinLines(replaceLine(L, 3, resign(t, otherPriv, L[3], func(map[string]any) {}))), nil, Invalid, ErrWrongKey, 4},
		{"another key's signature under the right keyid", joinLines(replaceLine(L, 3, func() []byte {
			env, _ := parseEnvelope(L[3])
			return appendEnvelope(nil, env.payload, j.w.KeyID(), ed25519.Sign(otherPriv, PAE(PayloadType, env.payload)))
		}())), nil, Invalid, ErrBadSignature, 4},
		{"verified with another public key", j.raw, otherPriv.Public().(ed25519.PublicKey), Invalid, ErrWrongKey, 1},
		{"non-canonical payload, right key", joinLines(replaceLine(L, 3, signLine(j.priv, nonCanon))), nil, Invalid, ErrNonCanonical, 4},
		{"CRLF line endings", bytes.ReplaceAll(j.raw, []byte("\n"), []byte("\r\n")), nil, Invalid, ErrMalformed, 1},
		{"garbage after the terminal record", append(bytes.Clone(j.raw), "garbage"...), nil, Invalid, ErrAfterTerminal, n + 1},
		{"a line after the terminal record", joinLines(append(append([][]byte{}, L...), L[3])), nil, Invalid, ErrAfterTerminal, n + 1},
		{"an empty line", joinLines(append(append(append([][]byte{}, L[:3]...), []byte{}), L[3:]...)), nil, Invalid, ErrMalformed, 4},
		{"garbage tail before the terminal record", append(joinLines(L[:n-1]), "garbage"...), nil, Invalid, ErrMalformed, n},
		{"unknown record type, right key", joinLines(replaceLine(L, 3, resign(t, j.priv, L[3], func(m map[string]any) { m["type"] = "inference.sneaked" }))), nil, Invalid, ErrUnknownType, 4},
		{"extra member, right key", joinLines(replaceLine(L, 3, resign(t, j.priv, L[3], func(m map[string]any) { m["note"] = "x" }))), nil, Invalid, ErrBadRecord, 4},
		{"empty optional member, right key", joinLines(replaceLine(L, 1, resign(t, j.priv, L[1], func(m map[string]any) { m["reason"] = "" }))), nil, Invalid, ErrBadRecord, 2},
		{"seq changed, right key", joinLines(replaceLine(L, 3, resign(t, j.priv, L[3], func(m map[string]any) { m["seq"] = 40 }))), nil, Invalid, ErrSequence, 4},
		{"run id changed, right key", joinLines(replaceLine(L, 3, resign(t, j.priv, L[3], func(m map[string]any) { m["run"] = "other" }))), nil, Invalid, ErrWrongRun, 4},
		{"time not UTC, right key", joinLines(replaceLine(L, 3, resign(t, j.priv, L[3], func(m map[string]any) { m["time"] = "2026-11-29T09:30:00+01:00" }))), nil, Invalid, ErrBadHeader, 4},
		{"terminal counts changed, right key", joinLines(replaceLine(L, n-1, resign(t, j.priv, L[n-1], func(m map[string]any) {
			m["counts"].(map[string]any)["requested"] = 1
		}))), nil, Invalid, ErrCounts, n},
		{"payloadType changed", bytes.Replace(j.raw, []byte("audit.v1+json"), []byte("audit.v2+json"), 1), nil, Invalid, ErrMalformed, 1},
		{"envelope with a space", bytes.Replace(j.raw, []byte(`,"signatures"`), []byte(`, "signatures"`), 1), nil, Invalid, ErrMalformed, 1},
		{"two signatures", joinLines(replaceLine(L, 0, func() []byte {
			s := string(L[0])
			i := strings.LastIndex(s, `}]}`)
			sig := s[strings.Index(s, `{"keyid"`) : i+1]
			return []byte(s[:i+1] + "," + sig + "]}")
		}())), nil, Invalid, ErrMalformed, 1},
		{"boundary.confirmed repeated on line 3, right key", joinLines(replaceLine(L, 2, resign(t, j.priv, L[1], func(m map[string]any) {
			m["seq"], m["prev"] = 3, LineHash(L[1])
		}))), nil, Invalid, ErrRecordOrder, 3},
		{"process.started on line 2, right key", joinLines(replaceLine(L, 1, resign(t, j.priv, L[2], func(m map[string]any) {
			m["seq"], m["prev"] = 2, LineHash(L[0])
		}))), nil, Invalid, ErrRecordOrder, 2},
		{"run.terminated first, right key", joinLines([][]byte{resign(t, j.priv, L[n-1], func(m map[string]any) {
			m["seq"], m["prev"] = 1, ZeroPrev
			m["counts"] = map[string]any{"requested": 0, "completed": 0, "refused": 0, "failed": 0, "processes": 0}
		})}), nil, Invalid, ErrRecordOrder, 1},
		{"empty journal", nil, nil, Incomplete, ErrEmpty, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pub := c.pub
			if pub == nil {
				pub = j.pub
			}
			r := Verify(c.journal, pub)
			if r.Status != c.status {
				t.Fatalf("status %v (%s), want %v", r.Status, r.Reason, c.status)
			}
			if c.kind != nil && !errors.Is(r.Err, c.kind) {
				t.Errorf("err %v, want %v", r.Err, c.kind)
			}
			if r.Line != c.line {
				t.Errorf("line %d (%s), want %d", r.Line, r.Reason, c.line)
			}
			if r.Status != Complete && r.Reason == "" {
				t.Error("no reason given")
			}
		})
	}
}

func TestTornTailReason(t *testing.T) {
	j := buildJournal(t)
	r := Verify(append(joinLines(j.lines[:5]), j.lines[5][:37]...), j.pub)
	if r.Status != Incomplete || !strings.Contains(r.Reason, "torn tail of 37 bytes") || r.Records != 5 {
		t.Fatalf("got %+v, want incomplete with a torn tail of 37 bytes after 5 records", r)
	}
	if r.Status.ExitCode() != 2 {
		t.Errorf("exit %d, want 2", r.Status.ExitCode())
	}
}
