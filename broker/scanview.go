package broker

// The reflection guard's byte-level views: one text stream (the raw
// response, a header value, or the concatenation of JSON strings that a
// client rebuilds) is fed byte by byte into a textView, which matches the
// credential, case-insensitively, in:
//
//   - the text itself;
//   - its percent-decoding (%XX, either case);
//   - its hex decoding (runs of hex digits, both pair alignments);
//   - its base64 decoding (runs of the union of the standard and URL-safe
//     alphabets, all four character alignments, so the credential at any
//     of the three byte alignments of the encoded text is seen);
//   - the same again with JSON string escapes undone, nested up to
//     maxEscapeDepth levels.
//
// Views cost nothing until they differ from their parent: the unescaped
// child is created (as a copy of its parent's state) at the first '\', the
// percent view at the first '%'.

// Limits of the reflection guard.
const (
	// maxEscapeDepth is how many nested levels of JSON string escapes are
	// undone on every text stream.
	maxEscapeDepth = 4
	// maxCompressionDepth is how many content-coding layers are decoded:
	// the declared Content-Encoding list and undeclared layers inside it
	// (sniffed gzip and zlib headers) together.
	maxCompressionDepth = 4
	// MaxCredentialBytes is the longest credential the broker accepts (the
	// guard's automaton has one row per credential byte).
	MaxCredentialBytes = 1024
)

// pattern is a deterministic automaton that recognises the credential,
// ASCII case-insensitively, one byte at a time. States are 0..n-1; a step
// that reaches n is a match.
type pattern struct {
	n    int
	next []uint16 // next[s<<8|c]
}

func lowerASCII(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

func newPattern(cred string) *pattern {
	low := []byte(cred)
	for i := range low {
		low[i] = lowerASCII(low[i])
	}
	n := len(low)
	// border[s]: the longest proper border of low[:s] (KMP).
	border := make([]int, n+1)
	for i, k := 1, 0; i < n; i++ {
		for k > 0 && low[i] != low[k] {
			k = border[k]
		}
		if low[i] == low[k] {
			k++
		}
		border[i+1] = k
	}
	p := &pattern{n: n, next: make([]uint16, n*256)}
	for s := 0; s < n; s++ {
		for c := 0; c < 256; c++ {
			switch {
			case lowerASCII(byte(c)) == low[s]:
				p.next[s<<8|c] = uint16(s + 1)
			case s > 0:
				p.next[s<<8|c] = p.next[border[s]<<8|c]
			}
		}
	}
	return p
}

// step advances state m by c and reports a match.
func (p *pattern) step(m *uint16, c byte) bool {
	s := p.next[int(*m)<<8|int(c)]
	if int(s) == p.n {
		*m = 0
		return true
	}
	*m = s
	return false
}

// Digit values of the encodings; -1 is "not in the alphabet".
var hexDigit, b64Digit [256]int8

func init() {
	for i := range hexDigit {
		hexDigit[i], b64Digit[i] = -1, -1
	}
	for i, c := range "0123456789abcdef" {
		hexDigit[c] = int8(i)
	}
	for i, c := range "ABCDEF" {
		hexDigit[c] = int8(10 + i)
	}
	for i, c := range "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/" {
		b64Digit[c] = int8(i)
	}
	b64Digit['-'], b64Digit['_'] = 62, 63
}

// Hex and base64 runs. A run of digits is decoded at every alignment:
// hex from its first and from its second digit, base64 from each of its
// first four. Each decoded byte is made of two neighbouring digits only
// (hex: prev<<4|d; base64: the three ways 6-bit digits straddle a byte,
// by the digit's place in its group of four), so a view keeps the run's
// length and its last digit, and each alignment its own match state:
// a hex digit after the first completes one byte (for the alignment the
// run's length picks) and a base64 digit after the first completes one
// byte for each of up to three alignments. Any other byte ends the run
// and resets every alignment's match.

// radixRun is the run of digits of one alphabet seen last.
type radixRun struct {
	n    uint64 // digits in the run
	prev byte   // the last digit's value
}

// next counts digit d and returns the run's length before it.
func (r *radixRun) next(d byte) uint64 {
	n := r.n
	r.n, r.prev = n+1, d
	return n
}

// pctDecoder undoes percent-encoding; malformed escapes pass as written.
type pctDecoder struct {
	n    uint8 // bytes held: '%' and up to one digit
	held [2]byte
}

func (d *pctDecoder) feed(c byte, out []byte) int {
	switch {
	case d.n == 0 && c == '%':
		d.held[0], d.n = c, 1
		return 0
	case d.n == 0:
		out[0] = c
		return 1
	case hexDigit[c] >= 0 && d.n == 1:
		d.held[1], d.n = c, 2
		return 0
	case hexDigit[c] >= 0:
		d.n = 0
		out[0] = byte(hexDigit[d.held[1]])<<4 | byte(hexDigit[c])
		return 1
	}
	k := copy(out, d.held[:d.n])
	d.n = 0
	return k + d.feed(c, out[k:])
}

// unescaper undoes JSON string escapes in a stream, one byte at a time.
// Bytes outside escapes pass through; a malformed escape passes through
// as written. A \u escape of a code point above 0x7f becomes 0xff, which
// is never part of a credential (checkCredential).
type unescaper struct {
	state int // 0 normal, 1 after '\', 2..5 reading \u hex digits
	cp    rune
	held  [6]byte
	nheld int
}

// feed consumes c and writes at most 7 output bytes to out.
func (u *unescaper) feed(c byte, out []byte) int {
	switch u.state {
	case 0:
		if c == '\\' {
			u.state, u.nheld = 1, 1
			u.held[0] = c
			return 0
		}
		out[0] = c
		return 1
	case 1:
		u.state = 0
		var e byte
		switch c {
		case 'u':
			u.state, u.cp = 2, 0
			u.held[1], u.nheld = c, 2
			return 0
		case '/', '\\', '"':
			e = c
		case 'n':
			e = '\n'
		case 't':
			e = '\t'
		case 'r':
			e = '\r'
		case 'b':
			e = '\b'
		case 'f':
			e = '\f'
		default:
			out[0] = '\\'
			return 1 + u.feed(c, out[1:])
		}
		out[0] = e
		return 1
	}
	d := hexDigit[c]
	if d < 0 {
		k := copy(out, u.held[:u.nheld])
		u.state = 0
		return k + u.feed(c, out[k:])
	}
	u.cp = u.cp<<4 | rune(d)
	u.held[u.nheld] = c
	u.nheld++
	u.state++
	if u.state < 6 {
		return 0
	}
	u.state = 0
	if u.cp < 0x80 {
		out[0] = byte(u.cp)
	} else {
		out[0] = 0xff
	}
	return 1
}

// textView matches the credential in one text stream and in its decoded
// and unescaped forms (see the top of this file).
type textView struct {
	p     *pattern
	depth int
	m     uint16 // the text itself
	pctOn bool
	pct   pctDecoder
	mPct  uint16
	hex   radixRun
	mHex  [2]uint16 // by alignment: from the run's first, second digit
	b64   radixRun
	mB64  [4]uint16 // by alignment: from the run's first … fourth digit
	un    unescaper
	child *textView // the text with one more level of escapes undone
}

func newTextView(p *pattern) *textView {
	v := &textView{}
	v.reset(p)
	return v
}

// reset makes v a fresh view for p, as newTextView makes one.
func (v *textView) reset(p *pattern) {
	*v = textView{p: p}
}

// write feeds every byte of b and reports whether the credential was seen.
func (v *textView) write(b []byte) bool {
	for _, c := range b {
		if v.feed(c) {
			return true
		}
	}
	return false
}

// writeString is write for a string.
func (v *textView) writeString(s string) bool {
	for i := 0; i < len(s); i++ {
		if v.feed(s[i]) {
			return true
		}
	}
	return false
}

func (v *textView) feed(c byte) bool {
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
	if d := hexDigit[c]; d < 0 {
		if v.hex.n > 0 {
			v.hex.n, v.mHex = 0, [2]uint16{}
		}
	} else {
		// The alignment from the first digit completes a byte at the
		// run's 2nd, 4th, … digit; the one from the second at its 3rd,
		// 5th, ….
		prev := v.hex.prev
		if n := v.hex.next(byte(d)); n >= 1 {
			hit = p.step(&v.mHex[(n+1)&1], prev<<4|byte(d)) || hit
		}
	}
	if d := b64Digit[c]; d < 0 {
		if v.b64.n > 0 {
			v.b64.n, v.mB64 = 0, [4]uint16{}
		}
	} else {
		// This is the run's digit k = n+1. The alignment that started at
		// digit s+1 is at place k-s of its group: place 2 completes
		// prev<<2|d>>4, place 3 (prev&15)<<4|d>>2, place 4 (prev&3)<<6|d.
		db, prev := byte(d), v.b64.prev
		n := v.b64.next(db)
		if n >= 1 {
			hit = p.step(&v.mB64[(n-1)&3], prev<<2|db>>4) || hit
		}
		if n >= 2 {
			hit = p.step(&v.mB64[(n-2)&3], prev<<4|db>>2) || hit
		}
		if n >= 3 {
			hit = p.step(&v.mB64[(n-3)&3], prev<<6|db) || hit
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
