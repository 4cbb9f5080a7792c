package strictjson

import (
	"slices"
	"sync"
	"unicode/utf16"
	"unicode/utf8"
)

// Canonicalize in one pass.
//
// canon reads the document once, byte by byte, and writes its RFC 8785
// form as it goes: whitespace dropped, strings and numbers rewritten only
// where their canonical form differs, and each object's members, written
// in input order, moved into UTF-16 order when the object closes. It
// refuses exactly what walk refuses (the same grammar, duplicate names
// compared after unescaping, invalid UTF-8, unpaired surrogate escapes,
// MaxDepth, numbers outside the double range, trailing data) and writes
// byte for byte what jsontext's Value.Canonicalize wrote after walk had
// accepted the document. That two-step form stays in the tests as the
// oracle (oracleCanonicalize, FuzzCanonicalizeOracle).
//
// canon only says whether the document is accepted. A refused document
// is read again by walk, whose error (jsontext's wording and offset) is
// the one Canonicalize returns, as it returned before canon existed.

// canonState is one Canonicalize: the input, the output and the reused
// buffers of the open objects.
type canonState struct {
	src   []byte
	i     int
	out   []byte
	mem   []canonMember // members of the open objects, innermost last
	names []byte        // decoded names that held an escape
	tmp   []byte        // scratch for reordering members
}

// canonMember is one member written to out: its decoded name and where
// `"name":value` is in out.
type canonMember struct {
	name       []byte
	start, end int
}

// canonPoolMaxBytes: buffers larger than this are not kept in the pool,
// so that one large document does not stay in memory.
const canonPoolMaxBytes = 1 << 20

var canonStates = sync.Pool{New: func() any { return new(canonState) }}

// canon returns the canonical form of b, or false when b is refused.
func canon(b []byte) ([]byte, bool) {
	s := canonStates.Get().(*canonState)
	s.src, s.i = b, 0
	s.out = make([]byte, 0, len(b)+8)
	ok := s.document()
	out := s.out
	s.src, s.out = nil, nil
	clear(s.mem[:cap(s.mem)]) // names that are slices of b
	// No byte of this document stays in the pool.
	clear(s.names[:cap(s.names)])
	clear(s.tmp[:cap(s.tmp)])
	s.mem, s.names, s.tmp = s.mem[:0], s.names[:0], s.tmp[:0]
	if cap(s.names) <= canonPoolMaxBytes && cap(s.tmp) <= canonPoolMaxBytes && cap(s.mem) <= canonPoolMaxBytes/64 {
		canonStates.Put(s)
	}
	if !ok {
		return nil, false
	}
	return out, true
}

func (s *canonState) document() bool {
	s.space()
	if !s.value(0) {
		return false
	}
	s.space()
	return s.i == len(s.src)
}

func (s *canonState) space() {
	for s.i < len(s.src) {
		switch s.src[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// value reads the value at s.i, inside depth open containers.
func (s *canonState) value(depth int) bool {
	if s.i >= len(s.src) {
		return false
	}
	switch c := s.src[s.i]; c {
	case '{':
		return depth < MaxDepth && s.object(depth+1)
	case '[':
		return depth < MaxDepth && s.array(depth+1)
	case '"':
		_, ok := s.str(false)
		return ok
	case 't':
		return s.literal("true")
	case 'f':
		return s.literal("false")
	case 'n':
		return s.literal("null")
	default:
		if c == '-' || '0' <= c && c <= '9' {
			return s.number()
		}
		return false
	}
}

func (s *canonState) literal(lit string) bool {
	if len(s.src)-s.i < len(lit) || string(s.src[s.i:s.i+len(lit)]) != lit {
		return false
	}
	s.out = append(s.out, lit...)
	s.i += len(lit)
	return true
}

func (s *canonState) array(depth int) bool {
	s.i++ // '['
	s.out = append(s.out, '[')
	s.space()
	if s.i < len(s.src) && s.src[s.i] == ']' {
		s.i++
		s.out = append(s.out, ']')
		return true
	}
	for {
		s.space()
		if !s.value(depth) {
			return false
		}
		s.space()
		if s.i >= len(s.src) {
			return false
		}
		switch s.src[s.i] {
		case ',':
			s.i++
			s.out = append(s.out, ',')
		case ']':
			s.i++
			s.out = append(s.out, ']')
			return true
		default:
			return false
		}
	}
}

func (s *canonState) object(depth int) bool {
	s.i++ // '{'
	s.out = append(s.out, '{')
	s.space()
	if s.i < len(s.src) && s.src[s.i] == '}' {
		s.i++
		s.out = append(s.out, '}')
		return true
	}
	base, names, body := len(s.mem), len(s.names), len(s.out)
	for {
		s.space()
		if s.i >= len(s.src) || s.src[s.i] != '"' {
			return false
		}
		start := len(s.out)
		name, ok := s.str(true)
		if !ok {
			return false
		}
		s.space()
		if s.i >= len(s.src) || s.src[s.i] != ':' {
			return false
		}
		s.i++
		s.out = append(s.out, ':')
		s.space()
		if !s.value(depth) {
			return false
		}
		s.mem = append(s.mem, canonMember{name: name, start: start, end: len(s.out)})
		s.space()
		if s.i >= len(s.src) {
			return false
		}
		if s.src[s.i] == ',' {
			s.i++
			s.out = append(s.out, ',')
			continue
		}
		if s.src[s.i] != '}' {
			return false
		}
		s.i++
		break
	}
	ok := s.order(base, body)
	s.mem, s.names = s.mem[:base], s.names[:names]
	s.out = append(s.out, '}')
	return ok
}

// order puts the members s.mem[base:], written from out[body:], in
// RFC 8785 order (by the UTF-16 code units of their decoded names), and
// refuses duplicate names.
func (s *canonState) order(base, body int) bool {
	ms := s.mem[base:]
	sorted := true
	for k := 1; k < len(ms); k++ {
		if c := compareUTF16(ms[k-1].name, ms[k].name); c == 0 {
			return false
		} else if c > 0 {
			sorted = false
		}
	}
	if sorted {
		return true
	}
	slices.SortFunc(ms, func(a, b canonMember) int { return compareUTF16(a.name, b.name) })
	for k := 1; k < len(ms); k++ {
		if compareUTF16(ms[k-1].name, ms[k].name) == 0 {
			return false
		}
	}
	tmp := s.tmp[:0]
	for k, m := range ms {
		if k > 0 {
			tmp = append(tmp, ',')
		}
		tmp = append(tmp, s.out[m.start:m.end]...)
	}
	if len(tmp) != len(s.out)-body {
		return false // BUG (the members and commas are all of out[body:]): Canonicalize says so
	}
	copy(s.out[body:], tmp)
	s.tmp = tmp
	return true
}

// compareUTF16 compares two valid UTF-8 strings by their UTF-16 code
// units (RFC 8785, section 3.2.3). That order is the order of code points
// (and of UTF-8 bytes) except that a code point above U+FFFF, written
// with surrogates (U+D800-U+DFFF), sorts before U+E000-U+FFFF.
func compareUTF16(x, y []byte) int {
	n := min(len(x), len(y))
	k := 0
	for k < n && x[k] == y[k] {
		k++
	}
	if k == n {
		return len(x) - len(y)
	}
	if x[k] < utf8.RuneSelf || y[k] < utf8.RuneSelf {
		return int(x[k]) - int(y[k])
	}
	for k > 0 && !utf8.RuneStart(x[k]) {
		k-- // the same bytes in y: the runes differ from their first byte on
	}
	rx, _ := utf8.DecodeRune(x[k:])
	ry, _ := utf8.DecodeRune(y[k:])
	if kx, ky := utf16Key(rx), utf16Key(ry); kx != ky {
		return int(kx - ky)
	}
	return int(rx - ry) // both above U+FFFF, with the same high surrogate
}

// utf16Key is the first UTF-16 code unit of r.
func utf16Key(r rune) rune {
	if r >= 0x10000 {
		r1, _ := utf16.EncodeRune(r)
		return r1
	}
	return r
}

// plainByte: an ASCII byte that a string holds and its canonical form
// writes as itself (not a control character, quote or backslash).
var plainByte = func() (t [256]bool) {
	for c := 0x20; c < 0x80; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// str reads the string at s.i and writes its canonical form. For a
// member name (name), it returns the decoded name: a slice of the input
// when the name holds no escape, else of s.names.
func (s *canonState) str(name bool) ([]byte, bool) {
	src := s.src
	start := s.i
	j := start + 1
	for j < len(src) {
		c := src[j]
		if plainByte[c] {
			j++
			continue
		}
		switch {
		case c == '"':
			s.out = append(s.out, src[start:j+1]...)
			s.i = j + 1
			return src[start+1 : j], true
		case c >= utf8.RuneSelf:
			r, size := utf8.DecodeRune(src[j:])
			if r == utf8.RuneError && size == 1 {
				return nil, false
			}
			j += size
		case c == '\\':
			return s.escapedStr(name)
		default: // a control character
			return nil, false
		}
	}
	return nil, false
}

// escapedStr is str for a string that holds an escape: escapes are
// undone and the text written again in the canonical form (RFC 8785,
// section 3.2.2.2: only '"', '\\' and control characters are escaped,
// as \b \t \n \f \r or \u00xx).
func (s *canonState) escapedStr(name bool) ([]byte, bool) {
	src := s.src
	j := s.i + 1
	s.out = append(s.out, '"')
	nameStart := len(s.names)
	lit := j // start of the pending run of bytes written as they are
	flush := func(to int) {
		s.out = append(s.out, src[lit:to]...)
		if name {
			s.names = append(s.names, src[lit:to]...)
		}
	}
	for j < len(src) {
		c := src[j]
		if plainByte[c] {
			j++
			continue
		}
		switch {
		case c == '"':
			flush(j)
			s.out = append(s.out, '"')
			s.i = j + 1
			if !name {
				return nil, true
			}
			return s.names[nameStart:len(s.names):len(s.names)], true
		case c >= utf8.RuneSelf:
			r, size := utf8.DecodeRune(src[j:])
			if r == utf8.RuneError && size == 1 {
				return nil, false
			}
			j += size
		case c == '\\':
			flush(j)
			r, n := unescape(src[j:])
			if n == 0 {
				return nil, false
			}
			j += n
			lit = j
			s.out = appendCanonicalRune(s.out, r)
			if name {
				s.names = utf8.AppendRune(s.names, r)
			}
		default:
			return nil, false
		}
	}
	return nil, false
}

// unescape decodes the escape at the start of b (a backslash): the rune
// and the bytes read, or 0 when the escape is invalid (an unknown escape,
// bad hex digits, a surrogate escape not in a high-low pair).
func unescape(b []byte) (rune, int) {
	if len(b) < 2 {
		return 0, 0
	}
	switch b[1] {
	case '"', '\\', '/':
		return rune(b[1]), 2
	case 'b':
		return '\b', 2
	case 'f':
		return '\f', 2
	case 'n':
		return '\n', 2
	case 'r':
		return '\r', 2
	case 't':
		return '\t', 2
	case 'u':
		r1, ok := hex4(b[2:])
		if !ok {
			return 0, 0
		}
		if !utf16.IsSurrogate(r1) {
			return r1, 6
		}
		if len(b) < 12 || b[6] != '\\' || b[7] != 'u' {
			return 0, 0
		}
		r2, ok := hex4(b[8:])
		if !ok {
			return 0, 0
		}
		r := utf16.DecodeRune(r1, r2)
		if r == utf8.RuneError {
			return 0, 0
		}
		return r, 12
	}
	return 0, 0
}

// hex4 decodes four hexadecimal digits at the start of b.
func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// appendCanonicalRune writes r inside a canonical string.
func appendCanonicalRune(dst []byte, r rune) []byte {
	switch r {
	case '"', '\\':
		return append(dst, '\\', byte(r))
	case '\b':
		return append(dst, '\\', 'b')
	case '\f':
		return append(dst, '\\', 'f')
	case '\n':
		return append(dst, '\\', 'n')
	case '\r':
		return append(dst, '\\', 'r')
	case '\t':
		return append(dst, '\\', 't')
	}
	if r < 0x20 {
		const hex = "0123456789abcdef"
		return append(dst, '\\', 'u', '0', '0', hex[r>>4], hex[r&0xf])
	}
	return utf8.AppendRune(dst, r)
}
