package audit

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"time"
)

// Run directories: an audit directory holds one directory per run, named
// by its run id, each with JournalFile and PublicKeyFile (see Create).
// Summarize and ListRuns read them for `moat runs list|show` without
// checking signatures; VerifyFiles checks one as `moat audit verify` does.

// ReasonIncomplete is a RunSummary's Reason when the journal has no
// terminal record: the run still runs, was killed, or its storage failed.
// It is never journaled.
const ReasonIncomplete TerminalReason = "incomplete"

// RunSummary is what a run directory's journal says of its run, read
// without checking signatures.
type RunSummary struct {
	ID      string    `json:"id"`
	Dir     string    `json:"dir"`
	Started time.Time `json:"started,omitzero"` // time of the first record
	Backend string    `json:"backend,omitempty"`
	KeyID   string    `json:"keyid,omitempty"`
	// Reason is run.terminated's reason ("completed", "failed", …), or
	// ReasonIncomplete when the journal has no terminal record.
	Reason TerminalReason `json:"reason"`
	// ExitCode is run.terminated's exit code; absent when incomplete.
	ExitCode *int   `json:"exit_code,omitempty"`
	Records  int    `json:"records"`
	Counts   Counts `json:"counts"`
	// Problem says why the journal could not be read to its end (a torn
	// or unreadable line, no journal at all); the summary then covers the
	// records before it.
	Problem string `json:"problem,omitempty"`
}

// Summarize reads the run directory dir. It never fails: what it cannot
// read is reported in Problem.
func Summarize(dir string) RunSummary {
	s := RunSummary{ID: filepath.Base(dir), Dir: dir, Reason: ReasonIncomplete}
	journal, err := ReadFileCapped(filepath.Join(dir, JournalFile), MaxJournalBytes)
	if err != nil {
		s.Problem = fmt.Sprintf("reading the journal: %v", err)
		return s
	}
	for n := 1; len(journal) > 0; n++ {
		line, rest, ok := bytes.Cut(journal, []byte("\n"))
		journal = rest
		if !ok {
			s.Problem = fmt.Sprintf("line %d is torn (%d bytes without a line end)", n, len(line))
			break
		}
		e, err := ParseLine(line)
		if err != nil {
			s.Problem = fmt.Sprintf("line %d: %v", n, err)
			break
		}
		s.Records++
		if n == 1 {
			s.Started, s.ID, s.KeyID = e.Header.Time, e.Header.Run, e.KeyID
		}
		switch r := e.Record.(type) {
		case RunStarted:
			s.Backend = r.Backend
		case RunTerminated:
			code := r.ExitCode
			s.Reason, s.ExitCode = r.Reason, &code
		}
		s.Counts.add(e.Record)
	}
	return s
}

// ListRuns summarizes every run directory in auditDir (each a directory
// holding JournalFile or PublicKeyFile), oldest first. An audit directory
// that does not exist holds no runs.
func ListRuns(auditDir string) ([]RunSummary, error) {
	ents, err := os.ReadDir(auditDir)
	if errors.Is(err, fs.ErrNotExist) {
		return []RunSummary{}, nil
	}
	if err != nil {
		return nil, err
	}
	out := []RunSummary{}
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		dir := filepath.Join(auditDir, e.Name())
		if !isRunDir(dir) {
			continue
		}
		out = append(out, Summarize(dir))
	}
	sort.SliceStable(out, func(i, j int) bool {
		if !out[i].Started.Equal(out[j].Started) {
			return out[i].Started.Before(out[j].Started)
		}
		return out[i].ID < out[j].ID
	})
	return out, nil
}

func isRunDir(dir string) bool {
	for _, f := range []string{JournalFile, PublicKeyFile} {
		if fi, err := os.Lstat(filepath.Join(dir, f)); err == nil && fi.Mode().IsRegular() {
			return true
		}
	}
	return false
}

// VerifyFiles verifies the journal at journalPath against the public key
// at keyPath and the pinned keyid pin ("" for none); pinned says whether
// the key was checked against a pin. A run directory whose journal was
// never created (a kill between writing the key and creating the journal),
// or whose journal is empty and key missing or empty (a crash before the
// first record was durable, which makes the key durable too), is
// Incomplete with no records; a key that cannot be read, or whose
// fingerprint is not the pin, is Invalid.
func VerifyFiles(journalPath, keyPath, pin string) (res Result, pinned bool) {
	invalid := func(kind error, format string, a ...any) Result {
		res.Status, res.Reason = Invalid, fmt.Sprintf(format, a...)
		res.Err = fmt.Errorf("%w: %s", kind, res.Reason)
		return res
	}
	pemBytes, kerr := ReadFileCapped(keyPath, MaxPublicKeyPEM)
	var pub ed25519.PublicKey
	if kerr == nil {
		if pub, kerr = ParsePublicKeyPEM(pemBytes); kerr == nil {
			res.KeyID = KeyID(pub)
		}
	}
	if kerr == nil && pin != "" {
		if res.KeyID != pin {
			return invalid(ErrWrongKey, "the key %s has fingerprint %s, not the pinned %s: this is not the journal of the run you pinned", keyPath, res.KeyID, pin), false
		}
		pinned = true
	}
	if neverCreated(journalPath) {
		// Create writes pubkey.pem, then creates journal.jsonl: a kill
		// in between leaves a run directory without a journal.
		switch {
		case kerr == nil:
			res.Status, res.Err = Incomplete, ErrEmpty
			res.Reason = fmt.Sprintf("no journal: the run directory %s has its public key but no %s (the run was killed before its journal was created); no records", filepath.Dir(journalPath), JournalFile)
			return res, pinned
		case errors.Is(kerr, fs.ErrNotExist) || len(pemBytes) == 0:
			res.Status, res.Err = Incomplete, ErrEmpty
			res.Reason = fmt.Sprintf("no journal and no public key in the run directory %s (the run was killed while creating them); no records", filepath.Dir(journalPath))
			return res, false
		}
	}
	if kerr != nil && (errors.Is(kerr, fs.ErrNotExist) || len(pemBytes) == 0) && emptyJournal(journalPath) {
		// Create makes the key durable with the run's first record, not
		// before it creates the journal: a crash before that record leaves
		// an empty journal whose key may be missing or empty. Nothing was
		// recorded, so nothing is lost; a journal with any byte in it
		// still needs its key.
		res.Status, res.Err = Incomplete, ErrEmpty
		res.Reason = fmt.Sprintf("an empty journal and no public key in the run directory %s (the run was killed, or its machine went down, before its first record was durable); no records", filepath.Dir(journalPath))
		return res, false
	}
	if kerr != nil {
		return invalid(ErrWrongKey, "reading the public key %s: %v", keyPath, kerr), false
	}
	journal, err := ReadFileCapped(journalPath, MaxJournalBytes)
	if err != nil {
		return invalid(ErrMalformed, "reading the journal: %v", err), false
	}
	return Verify(journal, pub), pinned
}

// neverCreated reports whether path is a run directory's journal.jsonl
// that does not exist, in a directory that does.
// emptyJournal reports whether path is a journal file of zero bytes.
func emptyJournal(path string) bool {
	if filepath.Base(path) != JournalFile {
		return false
	}
	fi, err := os.Lstat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Size() == 0
}

func neverCreated(path string) bool {
	if filepath.Base(path) != JournalFile {
		return false
	}
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		return false
	}
	fi, err := os.Stat(filepath.Dir(path))
	return err == nil && fi.IsDir()
}

// ReadFileCapped reads a regular file of at most limit bytes.
func ReadFileCapped(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s is larger than the limit of %d bytes", path, limit)
	}
	return b, nil
}
