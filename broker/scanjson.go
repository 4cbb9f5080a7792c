package broker

import (
	"hash/maphash"
	"unicode/utf16"
	"unicode/utf8"
)

// The reflection guard's JSON walk, over the bytes themselves.
//
// walkJSON finds every string of every JSON document in a text, with the
// member path, the enclosing objects and their block members, exactly as
// encoding/json's Decoder.Token (UseNumber) would return them one token at
// a time: the same documents one after another, the same tokens, the same
// decoded string values (encoding/json's unquoting: escapes undone, each
// invalid UTF-8 byte and each unpaired surrogate U+FFFD), and the same
// place to stop at the first token that Token would refuse. It allocates
// nothing per token: strings without escapes are slices of the text, the
// others and the paths are written into a buffer the scanner keeps. The
// token walk it replaced stays in the tests as the oracle
// (TestWalkJSONMatchesTokens, FuzzWalkJSONTokens).

// jsonString is one decoded string of a JSON document and where it was.
type jsonString struct {
	val   []byte // decoded: a slice of the text or of jsonWalk.buf
	path  []byte // the enclosing container's path ("" at the top)
	sep   uint8  // how the string's path goes on: sepNone (top), sepMember ("." field), sepElem ("[]")
	obj   int    // innermost enclosing object, index into objs, or -1
	field []byte // the member it is the value of ("" in arrays and at the top)
}

const (
	sepNone = iota
	sepMember
	sepElem
)

type jsonObj struct {
	parent int
	block  []byte // its blockNames members, "name=value;"
}

// jsonFrame is one open container.
type jsonFrame struct {
	obj    int    // index into objs for an object, -1 for an array
	owner  int    // innermost object around (or being) this container
	saved  uint8  // the token state to return to when it closes
	member []byte // objects: the current member's name
	path   []byte
}

// jsonWalk holds one walk's results and its reusable buffers.
type jsonWalk struct {
	strs  []jsonString
	objs  []jsonObj
	stack []jsonFrame
	buf   []byte
}

// Token states, as encoding/json's Decoder keeps them.
const (
	tsTopValue = iota
	tsArrayStart
	tsArrayValue
	tsArrayComma
	tsObjectStart
	tsObjectKey
	tsObjectColon
	tsObjectValue
	tsObjectComma
)

func tsValueAllowed(st uint8) bool {
	switch st {
	case tsTopValue, tsArrayStart, tsArrayValue, tsObjectValue:
		return true
	}
	return false
}

// tsValueEnd is the state after a value completes.
func tsValueEnd(st uint8) uint8 {
	switch st {
	case tsArrayStart, tsArrayValue:
		return tsArrayComma
	case tsObjectValue:
		return tsObjectComma
	}
	return st
}

func isJSONSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\n' }

// run walks d and reports whether it yielded at least one token.
func (w *jsonWalk) run(d []byte) bool {
	w.strs, w.objs, w.stack, w.buf = w.strs[:0], w.objs[:0], w.stack[:0], w.buf[:0]
	var (
		st  uint8 = tsTopValue
		any bool
		i   int
	)
	for {
		for i < len(d) && isJSONSpace(d[i]) {
			i++
		}
		if i == len(d) {
			return any
		}
		c := d[i]
		switch c {
		case '[', '{':
			if !tsValueAllowed(st) {
				return any
			}
			i++
			path, sep, field, owner, _ := w.where()
			f := jsonFrame{obj: -1, owner: owner, saved: st, path: w.childPath(path, sep, field)}
			st = tsArrayStart
			if c == '{' {
				w.objs = append(w.objs, jsonObj{parent: owner})
				f.obj, f.owner = len(w.objs)-1, len(w.objs)-1
				st = tsObjectStart
			}
			w.stack = append(w.stack, f)
			any = true
			continue
		case ']', '}':
			if c == ']' && st != tsArrayStart && st != tsArrayComma ||
				c == '}' && st != tsObjectStart && st != tsObjectComma {
				return any
			}
			i++
			n := len(w.stack)
			st = tsValueEnd(w.stack[n-1].saved)
			w.stack = w.stack[:n-1]
			any = true
			continue
		case ':':
			if st != tsObjectColon {
				return any
			}
			i++
			st = tsObjectValue
			continue
		case ',':
			switch st {
			case tsArrayComma:
				st = tsArrayValue
			case tsObjectComma:
				st = tsObjectKey
			default:
				return any
			}
			i++
			continue
		case '"':
			if st == tsObjectStart || st == tsObjectKey {
				end, plain, ok := jsonStringEnd(d, i)
				if !ok {
					return any
				}
				w.stack[len(w.stack)-1].member = w.unquote(d[i+1:end-1], plain)
				i = end
				st = tsObjectColon
				any = true
				continue
			}
		}
		if !tsValueAllowed(st) {
			return any
		}
		end, ok := 0, false
		var plain bool
		switch {
		case c == '"':
			end, plain, ok = jsonStringEnd(d, i)
		case c == '-' || '0' <= c && c <= '9':
			end, ok = jsonNumberEnd(d, i)
		case c == 't':
			end, ok = jsonLiteralEnd(d, i, "true")
		case c == 'f':
			end, ok = jsonLiteralEnd(d, i, "false")
		case c == 'n':
			end, ok = jsonLiteralEnd(d, i, "null")
		}
		if !ok {
			return any
		}
		any = true
		if c == '"' || c != 't' && c != 'f' && c != 'n' {
			path, sep, field, owner, blockObj := w.where()
			var val []byte
			if c == '"' {
				val = w.unquote(d[i+1:end-1], plain)
				w.strs = append(w.strs, jsonString{val: val, path: path, sep: sep, obj: owner, field: field})
			} else {
				val = d[i:end]
			}
			if blockObj >= 0 && inNames(blockNames, field) {
				o := &w.objs[blockObj]
				o.block = append(append(append(append(o.block, field...), '='), val...), ';')
			}
		}
		i = end
		st = tsValueEnd(st)
	}
}

// where says where a value starting now is: the path of its container, how
// its own path goes on, the member it is the value of, the innermost
// object around it, and that object when the value is one of its members
// (-1 otherwise). A container's own path is built here, in buf.
func (w *jsonWalk) where() (path []byte, sep uint8, field []byte, owner, blockObj int) {
	n := len(w.stack)
	if n == 0 {
		return nil, sepNone, nil, -1, -1
	}
	top := &w.stack[n-1]
	if top.obj >= 0 {
		return top.path, sepMember, top.member, top.owner, top.obj
	}
	return top.path, sepElem, nil, top.owner, -1
}

// childPath is the path of a value at (path, sep, field).
func (w *jsonWalk) childPath(path []byte, sep uint8, field []byte) []byte {
	start := len(w.buf)
	w.buf = append(w.buf, path...)
	switch sep {
	case sepMember:
		w.buf = append(append(w.buf, '.'), field...)
	case sepElem:
		w.buf = append(w.buf, "[]"...)
	}
	return w.buf[start:len(w.buf):len(w.buf)]
}

// unquote decodes the body of a JSON string (its bytes between the quotes,
// already checked by jsonStringEnd); plain says it holds no escape and no
// byte above 0x7f.
func (w *jsonWalk) unquote(s []byte, plain bool) []byte {
	if plain || !hasByte(s, '\\') && utf8.Valid(s) {
		return s[:len(s):len(s)]
	}
	start := len(w.buf)
	w.buf = appendUnquoted(w.buf, s)
	return w.buf[start:len(w.buf):len(w.buf)]
}

func hasByte(s []byte, c byte) bool {
	for _, b := range s {
		if b == c {
			return true
		}
	}
	return false
}

// appendUnquoted appends the decoded body of a JSON string checked by
// jsonStringEnd, as encoding/json decodes it: escapes undone, a surrogate
// pair joined, an unpaired surrogate escape and each byte that is not
// part of valid UTF-8 become U+FFFD.
func appendUnquoted(dst, s []byte) []byte {
	for r := 0; r < len(s); {
		c := s[r]
		switch {
		case c == '\\':
			e := s[r+1]
			r += 2
			switch e {
			case 'b':
				dst = append(dst, '\b')
			case 'f':
				dst = append(dst, '\f')
			case 'n':
				dst = append(dst, '\n')
			case 'r':
				dst = append(dst, '\r')
			case 't':
				dst = append(dst, '\t')
			case 'u':
				rr := getu4(s[r-2:])
				r += 4
				if utf16.IsSurrogate(rr) {
					if dec := utf16.DecodeRune(rr, getu4(s[r:])); dec != utf8.RuneError {
						r += 6
						dst = utf8.AppendRune(dst, dec)
						break
					}
					rr = utf8.RuneError
				}
				dst = utf8.AppendRune(dst, rr)
			default: // '"', '\\', '/'
				dst = append(dst, e)
			}
		case c < utf8.RuneSelf:
			dst = append(dst, c)
			r++
		default:
			rr, size := utf8.DecodeRune(s[r:])
			r += size
			dst = utf8.AppendRune(dst, rr)
		}
	}
	return dst
}

// getu4 decodes \uXXXX at the start of s, or returns -1.
func getu4(s []byte) rune {
	if len(s) < 6 || s[0] != '\\' || s[1] != 'u' {
		return -1
	}
	var r rune
	for _, c := range s[2:6] {
		d := hexDigit[c]
		if d < 0 {
			return -1
		}
		r = r<<4 | rune(d)
	}
	return r
}

// jsonStringEnd checks the JSON string starting at d[i] (a quote) and
// returns the index after its closing quote; plain says it holds no
// escape and no byte above 0x7f.
func jsonStringEnd(d []byte, i int) (end int, plain, ok bool) {
	plain = true
	for j := i + 1; j < len(d); j++ {
		switch c := d[j]; {
		case c == '"':
			return j + 1, plain, true
		case c == '\\':
			plain = false
			if j+1 >= len(d) {
				return 0, false, false
			}
			switch d[j+1] {
			case 'b', 'f', 'n', 'r', 't', '\\', '/', '"':
				j++
			case 'u':
				if j+5 >= len(d) {
					return 0, false, false
				}
				for _, h := range d[j+2 : j+6] {
					if hexDigit[h] < 0 {
						return 0, false, false
					}
				}
				j += 5
			default:
				return 0, false, false
			}
		case c < 0x20:
			return 0, false, false
		case c >= utf8.RuneSelf:
			plain = false
		}
	}
	return 0, false, false
}

// jsonNumberEnd checks the JSON number starting at d[i] and returns the
// index of the first byte after it. Like encoding/json's scanner, a
// number ends at the first byte that cannot continue it, whatever that
// byte is; it is refused only when it is incomplete there.
func jsonNumberEnd(d []byte, i int) (int, bool) {
	digits := func(j int) int {
		for j < len(d) && '0' <= d[j] && d[j] <= '9' {
			j++
		}
		return j
	}
	j := i
	if d[j] == '-' {
		j++
	}
	switch {
	case j == len(d):
		return 0, false
	case d[j] == '0':
		j++
	case '1' <= d[j] && d[j] <= '9':
		j = digits(j + 1)
	default:
		return 0, false
	}
	if j < len(d) && d[j] == '.' {
		k := digits(j + 1)
		if k == j+1 {
			return 0, false
		}
		j = k
	}
	if j < len(d) && (d[j] == 'e' || d[j] == 'E') {
		j++
		if j < len(d) && (d[j] == '+' || d[j] == '-') {
			j++
		}
		k := digits(j)
		if k == j {
			return 0, false
		}
		j = k
	}
	return j, true
}

// jsonLiteralEnd checks the literal lit at d[i].
func jsonLiteralEnd(d []byte, i int, lit string) (int, bool) {
	if len(d)-i < len(lit) || string(d[i:i+len(lit)]) != lit {
		return 0, false
	}
	return i + len(lit), true
}

func inNames(names []string, b []byte) bool {
	for _, n := range names {
		if string(b) == n {
			return true
		}
	}
	return false
}

// walkJSON decodes every JSON document in d and feeds its strings to the
// streams, in document order. It reports false when d does not start with
// a JSON value.
func (s *scanner) walkJSON(d []byte) bool {
	w := &s.walk
	any := w.run(d)
	// The stream names are "f:"+path and "b:"+path+"#"+blocks, hashed in
	// pieces (the same hash as of the whole name) so that neither is built.
	var mh maphash.Hash
	mh.SetSeed(streamSeed)
	for _, js := range w.strs {
		all := !inNames(structuralNames, js.field)
		mh.Reset()
		mh.WriteString("f:")
		js.writePath(&mh)
		s.feedHashed(mh.Sum64(), js.val, all)
		mh.Reset()
		mh.WriteString("b:")
		js.writePath(&mh)
		mh.WriteByte('#')
		for o := js.obj; o >= 0; o = w.objs[o].parent {
			mh.Write(w.objs[o].block)
			mh.WriteByte('/')
		}
		s.feedHashed(mh.Sum64(), js.val, false)
	}
	return any
}

// writePath writes the string's path: its container's, then "." and its
// member or "[]".
func (js *jsonString) writePath(mh *maphash.Hash) {
	mh.Write(js.path)
	switch js.sep {
	case sepMember:
		mh.WriteByte('.')
		mh.Write(js.field)
	case sepElem:
		mh.WriteString("[]")
	}
}
