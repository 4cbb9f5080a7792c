package broker

import (
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"net/http"
	"slices"
	"sync"
)

// Reflection guard.
//
// A provider response must never carry the run's credential back into the
// sandbox, in any form a client can rebuild it from. The guard therefore
// reads the response the way a client does, and runs every text it
// rebuilds through a textView (scanview.go: case-insensitive, percent,
// hex, base64 and base64url at every alignment, JSON escapes nested up to
// maxEscapeDepth):
//
//   - the raw bytes of the (content-decoded) body;
//   - the SSE events' data: each event's data lines are joined as an SSE
//     client joins them and parsed as JSON, and every decoded string is
//     appended to three streams: the concatenation of that field across
//     the whole response ("delta.text" of every event), the concatenation
//     of that field per content block (the field together with the index,
//     output_index, content_index, summary_index and item_id members of
//     the objects around it, as SDKs group deltas), and the concatenation
//     of all strings of the response that are not structural names (type,
//     id, model, …). Data that is not JSON is concatenated as text;
//   - a buffered body is also parsed as one JSON document (or several);
//   - every response header name and value alone, all values concatenated,
//     and every ordered pair of the values that reach the worker;
//   - upstream error texts (they are never shown: upstreamErrText).
//
// Content codings are decoded first, nested up to maxCompressionDepth
// (inspectLayers); a body that is still compressed underneath its declared
// coding is never passed on.
//
// Streaming holds back the event in progress: bytes are released only up
// to the end of the last complete SSE event (the blank line), after that
// event was parsed and scanned, so the byte completing a credential split
// across events is never released before the guard fires. An event may
// hold at most maxStreamEventBytes.
//
// Credentials must be printable ASCII without spaces (checkCredential).

// MinCredentialBytes is the shortest credential the broker accepts; shorter
// secrets would make the reflection guard fire on ordinary text.
const MinCredentialBytes = 8

const (
	// maxStreamEventBytes caps one SSE event held back for scanning.
	maxStreamEventBytes = 8 << 20
	// maxScanStreams caps the distinct concatenated streams of one
	// response; a response that needs more is withheld, not passed unscanned.
	maxScanStreams = 4096
)

// errReflected is the cause given to OnFatal and the journal when a
// response carried the credential. It never includes the credential.
// streamSeed keys the streams; it is random per process, so a provider
// cannot choose two stream names that share a stream.
var streamSeed = maphash.MakeSeed()

var errReflected = errors.New("the provider's response contained the run's credential")

// errUnscannable: the response has more distinct blocks than the guard
// follows; it is withheld.
var errUnscannable = fmt.Errorf("the response has more than %d distinct content fields and blocks; moat withholds what it cannot scan", maxScanStreams)

func checkCredential(provider, cred string) error {
	if len(cred) < MinCredentialBytes || len(cred) > MaxCredentialBytes {
		return fmt.Errorf("moat: the credential for provider %q is shorter than %d or longer than %d bytes", provider, MinCredentialBytes, MaxCredentialBytes)
	}
	for i := 0; i < len(cred); i++ {
		if cred[i] <= ' ' || cred[i] >= 0x7f {
			return fmt.Errorf("moat: the credential for provider %q holds a space, control or non-ASCII byte at offset %d", provider, i)
		}
	}
	return nil
}

// structuralNames are members whose string values are names chosen by the
// API, left out of the whole-response concatenation (they are still
// scanned in their own streams).
var structuralNames = []string{"type", "object", "id", "item_id", "model", "role", "status",
	"stop_reason", "finish_reason", "system_fingerprint", "service_tier", "event"}

// blockNames are members whose values say which content block a delta
// belongs to.
var blockNames = []string{"index", "output_index", "content_index", "summary_index", "item_id"}

// scanner watches one response. Write feeds body bytes; Hit, Err and Safe
// report the verdict and how much may be released.
type scanner struct {
	p       *pattern
	raw     *textView
	streams map[uint64]*textView // by maphash of the stream's name
	all     *textView            // every non-structural string, in order
	hit     bool
	err     error // errUnscannable

	// SSE framing.
	fed     int64 // bytes fed
	safe    int64 // bytes up to the end of the last complete event
	line    []byte
	isData  bool // the current line is a data line (its first 5 bytes read)
	lineLen int
	afterCR bool
	data    []byte // the current event's joined data
	hasData bool

	walk  jsonWalk              // walkJSON's buffers (scanjson.go)
	slabs []*[viewSlab]textView // the views (newView)
	views int                   // views handed out from slabs
}

// newScanner watches one response for the credential p recognises (the
// provider's pattern, built once: newPattern).
func newScanner(p *pattern) *scanner {
	s := &scanner{}
	s.reset(p)
	return s
}

// reset makes s what newScanner(p) makes, keeping the storage of its
// buffers, stream map and views. Every view handed out again is reset
// (textView.reset): nothing of an earlier response is left in them.
func (s *scanner) reset(p *pattern) {
	streams := s.streams
	if streams == nil {
		streams = map[uint64]*textView{}
	}
	clear(streams)
	*s = scanner{p: p, streams: streams, line: s.line[:0], data: s.data[:0], walk: s.walk, slabs: s.slabs}
	s.raw, s.all = s.newView(), s.newView()
}

// viewSlab is how many text views a scanner allocates at once: an answer
// has two streams per distinct JSON path, and a few dozen paths.
const viewSlab = 16

// newView is newTextView from the scanner's slabs.
func (s *scanner) newView() *textView {
	k := s.views / viewSlab
	if k == len(s.slabs) {
		s.slabs = append(s.slabs, new([viewSlab]textView))
	}
	v := &s.slabs[k][s.views%viewSlab]
	s.views++
	v.reset(s.p)
	return v
}

// scanners keeps the scanners of finished scanBody calls, for their
// storage. One that grew large (many streams, a long event) is dropped.
var scanners = sync.Pool{New: func() any { return new(scanner) }}

const (
	maxPooledSlabs      = 8
	maxPooledScanBuffer = 64 << 10
)

func getScanner(p *pattern) *scanner {
	s := scanners.Get().(*scanner)
	s.reset(p)
	return s
}

// putScanner returns s to the pool, holding no slice of the response it
// scanned (the walk's results point into it).
func putScanner(s *scanner) {
	w := &s.walk
	keep := len(s.slabs) <= maxPooledSlabs && len(s.streams) <= maxPooledSlabs*viewSlab &&
		cap(w.buf) <= maxPooledScanBuffer && cap(s.line) <= maxPooledScanBuffer && cap(s.data) <= maxPooledScanBuffer &&
		cap(w.strs) <= maxPooledScanBuffer/64
	s.release()
	if keep {
		scanners.Put(s)
	}
}

// release drops what s holds of the response it scanned.
func (s *scanner) release() {
	w := &s.walk
	clear(w.strs[:cap(w.strs)])
	clear(w.objs[:cap(w.objs)])
	clear(w.stack[:cap(w.stack)])
	w.strs, w.objs, w.stack = w.strs[:0], w.objs[:0], w.stack[:0]
	// No byte of this response stays in the pool.
	clear(w.buf[:cap(w.buf)])
	clear(s.line[:cap(s.line)])
	clear(s.data[:cap(s.data)])
	w.buf, s.line, s.data = w.buf[:0], s.line[:0], s.data[:0]
	clear(s.streams)
	s.raw, s.all, s.p = nil, nil, nil
}

// Write feeds p and reports whether the credential has been seen so far.
func (s *scanner) Write(b []byte) bool {
	if s.hit || s.err != nil {
		return s.hit
	}
	if s.raw.write(b) {
		s.hit = true
		return true
	}
	for _, c := range b {
		s.fed++
		s.sseByte(c)
		if s.hit || s.err != nil {
			break
		}
	}
	return s.hit
}

// Close ends the response: an event without its blank line is scanned as
// if it were complete (a client reading bytes sees it).
func (s *scanner) Close() bool {
	if !s.hit && s.err == nil {
		s.endLine()
		s.dispatch()
		s.safe = s.fed
	}
	return s.hit
}

func (s *scanner) sseByte(c byte) {
	if s.afterCR && c == '\n' {
		s.afterCR = false
		return
	}
	s.afterCR = false
	if c == '\r' || c == '\n' {
		s.afterCR = c == '\r'
		if s.lineLen == 0 {
			s.dispatch()
			s.safe = s.fed
			return
		}
		s.endLine()
		return
	}
	s.lineLen++
	switch {
	case s.lineLen <= 5:
		s.line = append(s.line, c)
		if s.lineLen == 5 {
			s.isData = string(s.line) == "data:"
			s.line = s.line[:0]
		}
	case s.isData:
		s.line = append(s.line, c)
	}
}

// endLine adds a finished data line to the event (SSE: one leading space
// dropped, lines joined with a line feed).
func (s *scanner) endLine() {
	if s.isData || (s.lineLen == 4 && string(s.line) == "data") {
		v := s.line
		if s.isData && len(v) > 0 && v[0] == ' ' {
			v = v[1:]
		}
		if s.hasData {
			s.data = append(s.data, '\n')
		}
		s.data = append(s.data, v...)
		s.hasData = true
	}
	s.line, s.lineLen, s.isData = s.line[:0], 0, false
}

func (s *scanner) dispatch() {
	if s.hasData {
		s.scanData(s.data)
	}
	s.data, s.hasData = s.data[:0], false
}

// scanData scans one event's data: as JSON, or, when it is not JSON, as
// text concatenated with the other non-JSON events.
func (s *scanner) scanData(d []byte) {
	if !s.walkJSON(d) {
		s.feed("sse-text", d, true)
	}
}

// feed appends text to the named stream (and to the whole-response stream
// when all is set).
func (s *scanner) feed(key string, text []byte, all bool) {
	s.feedHashed(maphash.String(streamSeed, key), text, all)
}

// feedHashed is feed for a stream named by the hash of its name (a
// maphash with streamSeed of the name's bytes, written in any pieces).
func (s *scanner) feedHashed(h uint64, text []byte, all bool) {
	if s.hit || s.err != nil {
		return
	}
	v := s.streams[h]
	if v == nil {
		if len(s.streams) >= maxScanStreams {
			s.err = errUnscannable
			return
		}
		v = s.newView()
		s.streams[h] = v
	}
	if v.write(text) || (all && s.all.write(text)) {
		s.hit = true
	}
}

// scanBody scans a complete (content-decoded) body: bytes, SSE events and
// the body as JSON.
func scanBody(p *pattern, data []byte) (bool, error) {
	s := getScanner(p)
	defer putScanner(s)
	return s.scanAll(data)
}

// scanAll is scanBody on s, a fresh or reset scanner.
func (s *scanner) scanAll(data []byte) (bool, error) {
	s.Write(data)
	s.Close()
	if !s.hit && s.err == nil {
		s.walkJSON(data)
	}
	return s.hit, s.err
}

// containsCredential scans one short text (an error message, a header).
func containsCredential(p *pattern, b []byte) bool {
	hit, _ := scanBody(p, b)
	return hit
}

// headReflects reports whether a response head carries the credential: in
// the status line, in any header name or value alone, in all values
// concatenated (sorted by name), or in any ordered pair of the values that
// are returned to the worker.
func headReflects(p *pattern, status string, h http.Header) bool {
	var tv textView // one view, reset for each check
	one := func(parts ...string) bool {
		tv.reset(p)
		for _, s := range parts {
			if tv.writeString(s) {
				return true
			}
		}
		return false
	}
	if one(status) {
		return true
	}
	names := make([]string, 0, len(h))
	for name := range h {
		names = append(names, name)
	}
	slices.Sort(names)
	var all []string
	for _, name := range names {
		if one(name) {
			return true
		}
		for _, v := range h[name] {
			if one(v) {
				return true
			}
			all = append(all, v)
		}
	}
	if one(all...) {
		return true
	}
	var back []string
	for _, name := range returnedHeaders {
		back = append(back, h.Values(name)...)
	}
	for i := range back {
		for j := range back {
			if i != j && one(back[i], back[j]) {
				return true
			}
		}
	}
	return false
}

// Nested compression. looksCompressed sniffs the headers of a gzip member
// or a zlib stream; a raw deflate stream has none and is not recognised.
func looksCompressed(b []byte) bool {
	if len(b) < 2 {
		return false
	}
	if b[0] == 0x1f && b[1] == 0x8b {
		return true
	}
	return b[0]&0x0f == 8 && b[0]>>4 <= 7 && (uint16(b[0])<<8|uint16(b[1]))%31 == 0
}

// inspectLayers decodes the undeclared compressed layers of data, up to
// depth layers in all, and scans every layer. It reports whether the
// credential was seen, and nested is true when data held any compressed
// layer (it must then not be passed on). A layer that breaks off is
// scanned as far as it decodes.
func inspectLayers(p *pattern, data []byte, depth int) (hit, nested bool, err error) {
	budget := MaxResponseBytes - len(data)
	for layers := 0; ; layers++ {
		hit, err := scanBody(p, data)
		if hit || err != nil {
			return hit, nested, err
		}
		if layers == depth {
			if looksCompressed(data) {
				return false, true, fmt.Errorf("the body is compressed more than %d times", maxCompressionDepth)
			}
			return false, nested, nil
		}
		next, ok, err := decompress(data, budget)
		if err != nil {
			return false, true, err
		}
		if !ok {
			return false, nested, nil
		}
		nested = true
		data = next
		budget -= len(data)
	}
}

// decompress undoes one sniffed gzip or zlib layer. ok is false when b has
// no such header, or it decodes to nothing; a stream that breaks off
// returns what it decoded so far.
func decompress(b []byte, limit int) (out []byte, ok bool, err error) {
	if !looksCompressed(b) {
		return nil, false, nil
	}
	var r io.Reader
	if b[0] == 0x1f {
		zr, err := gzip.NewReader(bytes.NewReader(b))
		if err != nil {
			return nil, false, nil
		}
		r = zr
	} else {
		zr, err := zlib.NewReader(bytes.NewReader(b))
		if err != nil {
			return nil, false, nil
		}
		r = zr
	}
	out, _ = io.ReadAll(io.LimitReader(r, int64(limit)+1))
	if len(out) > limit {
		return nil, false, refuse(ReasonResponseTooLarge, 502, "the decoded response is larger than %d bytes", MaxResponseBytes)
	}
	return out, len(out) > 0, nil
}
