package broker

import (
	"bytes"
	"errors"
	"fmt"
)

// Reflection guard.
//
// A provider response must never carry the run's credential back into the
// sandbox. The guard looks for the credential in three views of the decoded
// response, fed byte by byte so that any split across reads or streamed
// chunks is seen:
//
//   - the raw bytes;
//   - the bytes with one level of JSON string escapes undone (\uXXXX in
//     either case, \/, \\, \", \n, …), so "sk\u002dant" and "a\/b" match;
//   - the bytes with two levels undone (a JSON document inside a JSON
//     string, as in streamed tool-call arguments).
//
// Each view runs a KMP matcher, so no tail window is kept per view: the
// matcher's state is the tail. What the guard does not see: a credential
// transformed otherwise (base64, URL-encoding, case changes, reversed) or
// split by the provider into separate JSON strings (two SSE deltas).
//
// Credentials must be printable ASCII without spaces (checkCredential), so a
// match can never span a raw line feed: the streaming path releases bytes to
// the worker up to the last line feed, and holds back at most
// holdBack(cred) bytes of a line that has none.

// MinCredentialBytes is the shortest credential the broker accepts; shorter
// secrets would make the reflection guard fire on ordinary text.
const MinCredentialBytes = 8

// maxEscapeExpansion is how many raw bytes one credential byte can take in
// the doubly-unescaped view: \u00XX escaped again is 6×6 bytes.
const maxEscapeExpansion = 36

// errReflected is the cause given to OnFatal and the journal when a
// response carried the credential. It never includes the credential.
var errReflected = errors.New("the provider's response contained the run's credential")

func checkCredential(provider, cred string) error {
	if len(cred) < MinCredentialBytes {
		return fmt.Errorf("moat: the credential for provider %q is shorter than %d bytes", provider, MinCredentialBytes)
	}
	for i := 0; i < len(cred); i++ {
		if cred[i] <= ' ' || cred[i] >= 0x7f {
			return fmt.Errorf("moat: the credential for provider %q holds a space, control or non-ASCII byte at offset %d", provider, i)
		}
	}
	return nil
}

func holdBack(cred string) int { return maxEscapeExpansion*len(cred) + 8 }

// kmp is a streaming matcher for one pattern.
type kmp struct {
	pat   []byte
	fail  []int
	state int
}

func newKMP(pat []byte) *kmp {
	fail := make([]int, len(pat)+1)
	fail[0] = -1
	for i, k := 1, 0; i < len(pat); i++ {
		for k > 0 && pat[i] != pat[k] {
			k = fail[k]
		}
		if pat[i] == pat[k] {
			k++
		}
		fail[i+1] = k
	}
	return &kmp{pat: pat, fail: fail}
}

// feed consumes one byte and reports whether the pattern ends here.
func (m *kmp) feed(c byte) bool {
	for m.state > 0 && m.pat[m.state] != c {
		m.state = m.fail[m.state]
	}
	if m.pat[m.state] == c {
		m.state++
	}
	if m.state == len(m.pat) {
		m.state = m.fail[m.state]
		return true
	}
	return false
}

// unescaper undoes JSON string escapes in a stream, one byte at a time.
// Bytes outside escapes pass through; a malformed escape passes through
// as written.
type unescaper struct {
	state int // 0 normal, 1 after '\', 2.. reading \u hex digits
	cp    rune
	held  [6]byte
	nheld int
}

// feed consumes c and calls emit for each output byte.
func (u *unescaper) feed(c byte, emit func(byte)) {
	switch u.state {
	case 0:
		if c == '\\' {
			u.state, u.nheld = 1, 0
			u.held[u.nheld] = c
			u.nheld++
			return
		}
		emit(c)
	case 1:
		u.state = 0
		switch c {
		case 'u':
			u.state, u.cp = 2, 0
			u.held[u.nheld] = c
			u.nheld++
		case '/', '\\', '"':
			emit(c)
		case 'n':
			emit('\n')
		case 't':
			emit('\t')
		case 'r':
			emit('\r')
		case 'b':
			emit('\b')
		case 'f':
			emit('\f')
		default:
			emit('\\')
			u.feed(c, emit)
		}
	default: // 2..5: hex digits
		d, ok := hexVal(c)
		if !ok {
			for _, h := range u.held[:u.nheld] {
				emit(h)
			}
			u.state = 0
			u.feed(c, emit)
			return
		}
		u.cp = u.cp<<4 | rune(d)
		u.held[u.nheld] = c
		u.nheld++
		u.state++
		if u.state == 6 {
			u.state = 0
			if u.cp < 0x80 {
				emit(byte(u.cp))
			} else {
				emit(0xff) // never part of a credential (checkCredential)
			}
		}
	}
}

func hexVal(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// scanner watches one response for the credential in all three views.
type scanner struct {
	raw, once, twice *kmp
	u1, u2           unescaper
	hit              bool
}

func newScanner(cred string) *scanner {
	p := []byte(cred)
	return &scanner{raw: newKMP(p), once: newKMP(p), twice: newKMP(p)}
}

// Write feeds p and reports whether the credential has been seen so far.
func (s *scanner) Write(p []byte) bool {
	if s.hit {
		return true
	}
	for _, c := range p {
		if s.raw.feed(c) {
			s.hit = true
		}
		s.u1.feed(c, s.emit1)
		if s.hit {
			return true
		}
	}
	return s.hit
}

func (s *scanner) emit1(c byte) {
	if s.once.feed(c) {
		s.hit = true
	}
	s.u2.feed(c, s.emit2)
}

func (s *scanner) emit2(c byte) {
	if s.twice.feed(c) {
		s.hit = true
	}
}

// containsCredential scans one complete buffer.
func containsCredential(cred string, b []byte) bool {
	if bytes.Contains(b, []byte(cred)) {
		return true
	}
	return newScanner(cred).Write(b)
}
