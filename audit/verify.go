package audit

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
)

// MaxJournalBytes caps the size of a journal that Verify accepts.
const MaxJournalBytes = 1 << 30

// Status is the outcome of Verify. The zero value is Invalid.
type Status int

const (
	Invalid    Status = iota // exit 1: some line is bad
	Incomplete               // exit 2: a valid prefix, no terminal record
	Complete                 // exit 0: every line valid, terminal record last
)

func (s Status) String() string {
	switch s {
	case Complete:
		return "complete"
	case Incomplete:
		return "incomplete"
	}
	return "invalid"
}

// MarshalText makes a Status print as "complete", "incomplete" or "invalid".
func (s Status) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// ExitCode is the exit code of `moat audit verify` for s.
func (s Status) ExitCode() int {
	switch s {
	case Complete:
		return 0
	case Incomplete:
		return 2
	}
	return 1
}

// Result is what Verify found.
type Result struct {
	Status Status `json:"status"`
	// Line is the 1-based line that made the journal invalid, or the torn
	// line of an incomplete journal; 0 otherwise.
	Line int `json:"line,omitempty"`
	// Reason explains a status other than Complete, for people.
	Reason string `json:"reason,omitempty"`
	// Records is the number of valid records (the valid prefix).
	Records int    `json:"records"`
	RunID   string `json:"run,omitempty"`
	KeyID   string `json:"keyid"`
	// Terminal is the run.terminated record of a complete journal.
	Terminal *RunTerminated `json:"terminal,omitempty"`
	// Err is the typed cause (a *LineError wrapping one of the Err*
	// outcomes), nil when Complete.
	Err error `json:"-"`
}

// Verify checks a whole journal, as its exact bytes, against pub. It never
// re-serialises a line: signatures are checked over the PAE of the decoded
// payload bytes, and each prev over the exact bytes of the line before.
func Verify(journal []byte, pub ed25519.PublicKey) Result {
	res := Result{KeyID: KeyID(pub)}
	fail := func(line int, err error) Result {
		le, ok := err.(*LineError)
		if !ok {
			le = &LineError{Err: ErrMalformed, Detail: err.Error()}
		}
		le.Line = line
		res.Status, res.Line, res.Err, res.Reason = Invalid, line, le, le.Error()
		return res
	}
	if len(pub) != ed25519.PublicKeySize {
		return fail(0, lineErr(ErrWrongKey, "public key is %d bytes, want %d", len(pub), ed25519.PublicKeySize))
	}
	if len(journal) > MaxJournalBytes {
		return fail(0, lineErr(ErrTooManyRecords, "journal is %d bytes, more than the limit of %d", len(journal), MaxJournalBytes))
	}
	if len(journal) == 0 {
		res.Status, res.Err = Incomplete, ErrEmpty
		res.Reason = "empty journal: no records (the run stopped before its first record)"
		return res
	}
	var (
		prev       = ZeroPrev
		counts     Counts
		terminated int // line of run.terminated, or 0
		seen       = map[uint64][2]int{}
		pos, n     int
		lockfiles  = lockfileSet{}
	)
	for pos < len(journal) {
		n++
		nl := bytes.IndexByte(journal[pos:], '\n')
		if terminated != 0 {
			return fail(n, lineErr(ErrAfterTerminal, "%d bytes follow the terminal record on line %d", len(journal)-pos, terminated))
		}
		if nl < 0 {
			tail := journal[pos:]
			if !tornLine(tail) {
				return fail(n, lineErr(ErrMalformed, "unterminated last line of %d bytes is not the start of a journal line", len(tail)))
			}
			res.Status, res.Line = Incomplete, n
			res.Err = &LineError{Line: n, Err: ErrTornTail, Detail: fmt.Sprintf("%d bytes without a final LF", len(tail))}
			res.Reason = fmt.Sprintf("torn tail of %d bytes on line %d after %s (a write cut short by a crash or a write error); no terminal record", len(tail), n, plural(res.Records, "valid record"))
			return res
		}
		start, end := pos, pos+nl
		line := journal[start:end]
		pos = end + 1
		if n > MaxRecords {
			return fail(n, lineErr(ErrTooManyRecords, "more than %d records", MaxRecords))
		}
		e, err := VerifyLine(line, pub)
		if err != nil {
			return fail(n, err)
		}
		sum := sha256.Sum256(line)
		k := binary.LittleEndian.Uint64(sum[:8])
		if at, ok := seen[k]; ok && bytes.Equal(journal[at[0]:at[1]], line) {
			return fail(n, lineErr(ErrDuplicate, "same bytes as an earlier line (seq %d)", e.Header.Seq))
		}
		seen[k] = [2]int{start, end}
		h := e.Header
		if n == 1 {
			res.RunID = h.Run
		} else if h.Run != res.RunID {
			return fail(n, lineErr(ErrWrongRun, "run %q, want %q (from line 1)", h.Run, res.RunID))
		}
		if h.Seq != int64(n) {
			return fail(n, lineErr(ErrSequence, "seq %d, want %d (a line is missing, moved or repeated)", h.Seq, n))
		}
		if h.Prev != prev {
			return fail(n, lineErr(ErrBrokenLink, "prev %s, want %s (sha256 of line %d)", h.Prev, prev, n-1))
		}
		if err := checkOrder(n, e.Record, pub); err != nil {
			return fail(n, err)
		}
		if err := lockfiles.check(e.Record); err != nil {
			return fail(n, lineErr(ErrBadRecord, "%v", err))
		}
		lockfiles.apply(e.Record)
		counts.add(e.Record)
		switch r := e.Record.(type) {
		case RunTerminated:
			if r.Counts != counts {
				return fail(n, lineErr(ErrCounts, "counts %+v, but the journal holds %+v", r.Counts, counts))
			}
			terminated = n
			res.Terminal = &r
		}
		res.Records++
		prev = hex.EncodeToString(sum[:])
	}
	if terminated == 0 {
		res.Status, res.Err = Incomplete, ErrNoTerminal
		res.Reason = fmt.Sprintf("no terminal record: %s, then the journal ends (the run was killed or is still running)", plural(res.Records, "valid record"))
		return res
	}
	res.Status = Complete
	return res
}

func checkOrder(n int, r Record, pub ed25519.PublicKey) error {
	typ := r.RecordType()
	switch {
	case n == 1 && typ != TypeRunStarted:
		return lineErr(ErrRecordOrder, "first record is %s, want %s", typ, TypeRunStarted)
	case n != 1 && typ == TypeRunStarted:
		return lineErr(ErrRecordOrder, "%s after line 1", TypeRunStarted)
	case n != 2 && typ == TypeBoundaryConfirmed:
		return lineErr(ErrRecordOrder, "%s on line %d, want line 2", TypeBoundaryConfirmed, n)
	case n == 2 && typ != TypeBoundaryConfirmed && typ != TypeRunTerminated:
		return lineErr(ErrRecordOrder, "line 2 is %s, want %s or %s", typ, TypeBoundaryConfirmed, TypeRunTerminated)
	}
	if rs, ok := r.(RunStarted); ok {
		k, err := ParsePublicKeyPEM([]byte(rs.PublicKey))
		if err != nil || !k.Equal(pub) {
			return lineErr(ErrWrongKey, "%s.public_key is not the given public key", TypeRunStarted)
		}
	}
	return nil
}

// tornLine reports whether tail can be what a write cut short leaves: a
// proper beginning of a journal line (at most MaxLineBytes), or zero bytes
// that a filesystem exposes after a crash.
func tornLine(tail []byte) bool {
	if len(tail) > MaxLineBytes {
		return false
	}
	if len(bytes.Trim(tail, "\x00")) == 0 {
		return true
	}
	if len(tail) <= len(envPrefix) {
		return bytes.HasPrefix([]byte(envPrefix), tail)
	}
	return bytes.HasPrefix(tail, []byte(envPrefix))
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}
