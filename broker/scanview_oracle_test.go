package broker

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"net/url"
	"strings"
	"testing"
)

// oracleView is textView as it was before it kept one run per alphabet:
// a radix decoder per alignment (two hex, four base64), each decoding its
// own run bit by bit. textView must answer as it does after every byte.
type oracleView struct {
	p     *pattern
	depth int
	m     uint16
	pctOn bool
	pct   pctDecoder
	mPct  uint16
	hex   [2]oracleRadixDec
	mHex  [2]uint16
	b64   [4]oracleRadixDec
	mB64  [4]uint16
	un    unescaper
	child *oracleView
}

type oracleRadixDec struct {
	skip, pos uint8
	bits      uint8
	acc       uint16
}

func (r *oracleRadixDec) feed(d int8, width uint8) (out byte, ok, broken bool) {
	if d < 0 {
		r.pos, r.bits, r.acc = 0, 0, 0
		return 0, false, true
	}
	if r.pos < r.skip {
		r.pos++
		return 0, false, false
	}
	r.acc = r.acc<<width | uint16(d)
	r.bits += width
	if r.bits >= 8 {
		r.bits -= 8
		out = byte(r.acc >> r.bits)
		r.acc &= 1<<r.bits - 1
		return out, true, false
	}
	return 0, false, false
}

func newOracleView(p *pattern) *oracleView {
	v := &oracleView{p: p}
	for i := range v.hex {
		v.hex[i].skip = uint8(i)
	}
	for i := range v.b64 {
		v.b64[i].skip = uint8(i)
	}
	return v
}

func (v *oracleView) feed(c byte) bool {
	if c == '\\' && v.child == nil && v.depth < maxEscapeDepth {
		cl := *v
		cl.depth++
		cl.un = unescaper{}
		v.child = &cl
	}
	if c == '%' && !v.pctOn {
		v.pctOn, v.mPct = true, v.m
	}
	p := v.p
	hit := p.step(&v.m, c)
	var out [8]byte
	if v.pctOn {
		n := v.pct.feed(c, out[:])
		for _, o := range out[:n] {
			hit = p.step(&v.mPct, o) || hit
		}
	}
	hd := hexDigit[c]
	for i := range v.hex {
		o, ok, broken := v.hex[i].feed(hd, 4)
		if broken {
			v.mHex[i] = 0
		} else if ok {
			hit = p.step(&v.mHex[i], o) || hit
		}
	}
	bd := b64Digit[c]
	for i := range v.b64 {
		o, ok, broken := v.b64[i].feed(bd, 6)
		if broken {
			v.mB64[i] = 0
		} else if ok {
			hit = p.step(&v.mB64[i], o) || hit
		}
	}
	if v.child != nil {
		n := v.un.feed(c, out[:])
		for _, o := range out[:n] {
			hit = v.child.feed(o) || hit
		}
	}
	return hit
}

// checkViewOracle feeds data to a textView and to the oracle and
// compares their answers byte by byte; it returns how many bytes hit.
func checkViewOracle(t *testing.T, cred string, data []byte) int {
	t.Helper()
	p := newPattern(cred)
	v, o := newTextView(p), newOracleView(p)
	hits := 0
	for i, c := range data {
		got, want := v.feed(c), o.feed(c)
		if got != want {
			t.Fatalf("credential %q, byte %d of %q: textView %v, oracle %v", cred, i, data, got, want)
		}
		if got {
			hits++
		}
	}
	return hits
}

// viewEncodings are the credential's forms the views decode, each at
// several alignments within runs of digits of its alphabet.
func viewEncodings(cred string) []string {
	b := []byte(cred)
	var out []string
	for pad := 0; pad < 4; pad++ {
		pre := []byte("xyz"[:pad])
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding, base64.RawStdEncoding, base64.RawURLEncoding} {
			e := enc.EncodeToString(append(pre, b...))
			out = append(out, e, "AAAA"[:pad]+e, "\\u00"+hex.EncodeToString([]byte(e[:1]))+e[1:])
		}
		h := hex.EncodeToString(b)
		out = append(out, h, "0123"[:pad]+h, strings.ToUpper(h), "f"+h)
	}
	var esc, pct strings.Builder
	for i := 0; i < len(b); i++ {
		fmt.Fprintf(&esc, `\u%04x`, b[i])
		fmt.Fprintf(&pct, "%%%02X", b[i])
	}
	out = append(out, cred, strings.ToUpper(cred), esc.String(), pct.String(), url.QueryEscape(cred),
		strings.ReplaceAll(esc.String(), `\`, `\\`), `"`+strings.ReplaceAll(esc.String(), `\`, `\\\\`)+`"`)
	return out
}

var viewCreds = []string{testCred, "0123456789abcdef", "ABCDEFGH", "deadbeefcafe", "////++++----____", "a%41b%2Gc\\u00", "zzzzzzzz"}

func TestTextViewMatchesOracle(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	alphabets := []string{"0123456789abcdefABCDEF", "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/-_=",
		`\u00%"x `, "\x00\xff\n"}
	hits := 0
	for _, cred := range viewCreds {
		for _, e := range viewEncodings(cred) {
			if n := checkViewOracle(t, cred, []byte("text "+e+" more")); n > 0 {
				hits++
			}
		}
		for range 200 {
			var b []byte
			for range rng.IntN(400) {
				a := alphabets[rng.IntN(len(alphabets))]
				for range rng.IntN(20) + 1 {
					b = append(b, a[rng.IntN(len(a))])
				}
				if rng.IntN(8) == 0 {
					es := viewEncodings(cred)
					b = append(b, es[rng.IntN(len(es))]...)
				}
			}
			checkViewOracle(t, cred, b)
		}
	}
	// The comparison is not vacuous: the credential's forms are found.
	if hits < len(viewCreds)*40 {
		t.Fatalf("only %d encoded credentials found", hits)
	}
}

// FuzzTextViewOracle holds textView to the oracle on any bytes, for a
// credential picked by the input (or given by it, when it is one the
// broker accepts).
func FuzzTextViewOracle(f *testing.F) {
	for i, cred := range viewCreds {
		for _, e := range viewEncodings(cred) {
			f.Add(uint8(i), "", []byte("x "+e))
		}
	}
	f.Add(uint8(0), "sk-ant-0123", []byte(`c2stYW50LTAxMjM=`))
	f.Fuzz(func(t *testing.T, pick uint8, given string, data []byte) {
		cred := viewCreds[int(pick)%len(viewCreds)]
		if checkCredential("fuzz", given) == nil {
			cred = given
		}
		checkViewOracle(t, cred, data)
		if bytes.Contains(bytes.ToLower(data), bytes.ToLower([]byte(cred))) && checkViewOracle(t, cred, data) == 0 {
			t.Fatalf("credential %q in %q not found", cred, data)
		}
	})
}
