package audit

import (
	"errors"
	"fmt"
)

// Verification outcomes that make a journal invalid. A *LineError wraps
// exactly one of them; match with errors.Is.
var (
	ErrMalformed      = errors.New("malformed line")
	ErrWrongKey       = errors.New("wrong key")
	ErrBadSignature   = errors.New("bad signature")
	ErrNonCanonical   = errors.New("non-canonical payload")
	ErrBadHeader      = errors.New("bad record header")
	ErrWrongRun       = errors.New("wrong run")
	ErrSequence       = errors.New("sequence gap")
	ErrBrokenLink     = errors.New("broken link")
	ErrDuplicate      = errors.New("duplicate record")
	ErrUnknownType    = errors.New("unknown record type")
	ErrBadRecord      = errors.New("bad record fields")
	ErrRecordOrder    = errors.New("record out of place")
	ErrAfterTerminal  = errors.New("data after the terminal record")
	ErrCounts         = errors.New("terminal counts disagree with the journal")
	ErrTooManyRecords = errors.New("too many records")
)

// Verification outcomes that make a journal incomplete: a valid prefix that
// a crash or a kill can leave behind.
var (
	ErrEmpty      = errors.New("empty journal")
	ErrNoTerminal = errors.New("no terminal record")
	ErrTornTail   = errors.New("torn tail")
)

// Writer errors.
var (
	// ErrPoisoned is returned by every Append after a write or sync error.
	ErrPoisoned = errors.New("audit: journal writer is poisoned by an earlier write or sync error; nothing more can be recorded")
	// ErrTerminated is returned by Append after run.terminated.
	ErrTerminated = errors.New("audit: refused: the journal already has its terminal run.terminated record; nothing can follow it")
	// ErrJournalFull is wrapped by Append's error when a record would take
	// the journal past MaxJournalBytes, the size Verify accepts. The last
	// 64 KiB are kept for run.terminated.
	ErrJournalFull = errors.New("journal size limit reached")
	// ErrClosed is returned by Append after Close.
	ErrClosed = errors.New("audit: journal writer is closed")
)

// LineError reports why one journal line is bad. Line is 1-based; it is 0
// when the error comes from VerifyLine on a detached line.
type LineError struct {
	Line   int
	Err    error // one of the Err* outcomes above
	Detail string
}

func (e *LineError) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("line %d: %v: %s", e.Line, e.Err, e.Detail)
	}
	return fmt.Sprintf("%v: %s", e.Err, e.Detail)
}

func (e *LineError) Unwrap() error { return e.Err }

func lineErr(kind error, format string, a ...any) *LineError {
	return &LineError{Err: kind, Detail: fmt.Sprintf(format, a...)}
}
