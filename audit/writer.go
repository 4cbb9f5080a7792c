package audit

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// File names inside a run directory.
const (
	JournalFile   = "journal.jsonl"
	PublicKeyFile = "pubkey.pem"
)

// Writer appends signed records to one run's journal. It is safe for
// concurrent use. Its private key exists only in its memory.
type Writer struct {
	runID  string
	path   string
	priv   ed25519.PrivateKey
	pub    ed25519.PublicKey
	keyID  string
	pubPEM []byte
	now    func() time.Time
	// skipSync is set only by this package's tests (the negative control
	// of the fsync-ordering test); nothing else can reach it.
	skipSync bool
	// beforeSync, when set (only by this package's tests), runs before
	// each fsync of the journal.
	beforeSync func()

	// created is closed once pubkey.pem and the run directory's entries
	// are durable (createErr says whether they are): the first fsync of
	// the journal waits for it, so the run's first durable line implies
	// both, and Create does not wait for them on the run's start path.
	created   chan struct{}
	createErr error

	// syncMu guards the group commit's state below; the fsync itself runs
	// without it, so that an appender whose line an earlier fsync covered
	// returns without waiting for the one in flight (see syncTo). Lock
	// order: syncMu, then mu.
	syncMu   sync.Mutex
	syncDone *sync.Cond    // on syncMu: broadcast when an fsync ends
	syncing  bool          // syncTo's fsync is in flight (Close fsyncs holding syncMu)
	durable  atomic.Uint64 // number of lines known to be durable; set under syncMu, read without it
	nsync    uint64        // number of fsyncs made by Append (for benchmarks)

	// mu guards everything below; it is held while a line is built, signed
	// and written, which gives the journal its total order.
	mu         sync.Mutex
	f          *os.File
	seq        int64  // seq of the last line written
	prev       string // LineHash of the last line written
	written    uint64 // number of lines written (not necessarily durable)
	terminated bool
	closed     bool
	err        error // poison: set by the first write or sync error, never cleared
	counts     Counts
	lockfiles  lockfileSet // the lockfile digests in force (package.go)
	buf        []byte
	size       int64 // bytes written to the journal, LFs included
	maxSize    int64 // MaxJournalBytes; lowered only by this package's tests
}

// terminalReserve is the part of MaxJournalBytes that only run.terminated
// may use, so that a journal filled to its limit can still be completed.
const terminalReserve = 64 << 10

// Create makes the run directory dir (mode 0700; it must not exist, or be
// an empty directory), generates a fresh Ed25519 key that stays in memory,
// writes dir/pubkey.pem and creates dir/journal.jsonl (mode 0600). The
// key file and the directory's entries are synced in the background,
// while the caller prepares its sandbox: the first line made durable (by
// Append, or the sync of AppendAsync or Close) waits for them, and a
// failure there poisons the Writer as a failed fsync of the journal does.
func Create(dir, runID string) (*Writer, error) {
	if !validRunID(runID) {
		return nil, fmt.Errorf("audit: run id %q is not 1..%d characters of [A-Za-z0-9._:-]", runID, MaxRunIDBytes)
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return nil, fmt.Errorf("audit: creating the parent of the run directory: %w", err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		if !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("audit: creating run directory: %w", err)
		}
		if err := usableEmptyDir(dir); err != nil {
			return nil, err
		}
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("audit: generating the run key: %w", err)
	}
	return create(dir, runID, priv, time.Now)
}

// Prewarm starts, in the background, the set-up that the first Ed25519
// key of a process pays once: crypto/ed25519's precomputed tables of the
// base point, about 0.9 ms of CPU on this project's test machines,
// against 15 us for each key after it. A caller that will Create a
// journal soon calls it as early as it can (moat run, before it reads the
// policy), so that this runs on another core meanwhile; Create is the
// same without it (it then pays the set-up itself). It uses no key of
// anyone's: the seed is all zeros and the result is dropped.
func Prewarm() {
	go ed25519.NewKeyFromSeed(make([]byte, ed25519.SeedSize))
}

// create finishes Create with a given key and clock (tests pin both).
func create(dir, runID string, priv ed25519.PrivateKey, now func() time.Time) (*Writer, error) {
	pub := priv.Public().(ed25519.PublicKey)
	pubPEM, err := MarshalPublicKeyPEM(pub)
	if err != nil {
		return nil, err
	}
	kf, err := writeFile(filepath.Join(dir, PublicKeyFile), pubPEM, 0o644)
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, JournalFile)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o600)
	if err != nil {
		kf.Close()
		return nil, fmt.Errorf("audit: creating journal: %w", err)
	}
	w := &Writer{
		runID: runID, path: path, priv: priv, pub: pub, keyID: KeyID(pub), pubPEM: pubPEM,
		f: f, prev: ZeroPrev, now: now, maxSize: MaxJournalBytes, created: make(chan struct{}),
	}
	w.syncDone = sync.NewCond(&w.syncMu)
	go func() {
		defer close(w.created)
		w.createErr = syncCreated(kf, dir)
	}()
	return w, nil
}

// syncCreated makes the key file kf (closing it) and the entries of the
// run directory dir durable. A variable for this package's tests.
var syncCreated = func(kf *os.File, dir string) error {
	err := kf.Sync()
	if cerr := kf.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("audit: syncing %s: %w", kf.Name(), err)
	}
	return syncDir(dir)
}

// createdDurable waits until the key file and the directory entries are
// durable, and says whether they are.
func (w *Writer) createdDurable() error {
	<-w.created
	return w.createErr
}

func usableEmptyDir(dir string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("audit: run directory: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("audit: refused: run directory %s exists and is not a directory", dir)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("audit: run directory: %w", err)
	}
	defer d.Close()
	if _, err := d.Readdirnames(1); !errors.Is(err, io.EOF) {
		return fmt.Errorf("audit: refused: run directory %s is not empty; every run needs a fresh directory", dir)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("audit: run directory: %w", err)
	}
	return nil
}

// writeFile creates path with data and returns it, still open (to be
// synced).
func writeFile(path string, data []byte, mode os.FileMode) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return nil, fmt.Errorf("audit: writing %s: %w", path, err)
	}
	return f, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("audit: syncing run directory: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("audit: syncing run directory: %w", err)
	}
	return nil
}

// Append signs r, writes it as the next line and returns that line
// (without its LF) once it is durable: written and fsynced. Concurrent
// callers are totally ordered and may share one fsync (group commit).
//
// The record is checked for its place: run.started must be first and only
// first; the second is boundary.confirmed (or run.terminated), and
// boundary.confirmed appears nowhere else; nothing follows run.terminated. For
// run.terminated, Append sets Counts from the records before it.
//
// After any write or sync error the Writer is poisoned: that Append and
// every later one fail with an error matching ErrPoisoned, and a caller
// must treat the record as not made.
func (w *Writer) Append(r Record) ([]byte, error) {
	if r == nil || !knownRecord(r) {
		return nil, fmt.Errorf("audit: refused: %T is not a journal record type of this package", r)
	}
	w.mu.Lock()
	line, ticket, err := w.writeLocked(r)
	w.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if err := w.syncTo(ticket); err != nil {
		return nil, err
	}
	return line, nil
}

// AppendAsync is Append in two steps: it returns once r is signed and
// written in its place in the journal (every later line follows it), and
// the returned wait returns once that line is durable, sharing fsyncs
// with other appenders as Append does. Until wait has returned nil the
// record must be treated as possibly lost in a crash; an error from wait
// poisons the Writer exactly as Append's does. The broker uses it for
// completion records (see broker/doc.go for why that is safe there);
// a pre-effect record must be made with Append.
func (w *Writer) AppendAsync(r Record) (line []byte, wait func() error, err error) {
	if r == nil || !knownRecord(r) {
		return nil, nil, fmt.Errorf("audit: refused: %T is not a journal record type of this package", r)
	}
	w.mu.Lock()
	line, ticket, err := w.writeLocked(r)
	w.mu.Unlock()
	if err != nil {
		return nil, nil, err
	}
	return line, func() error { return w.syncTo(ticket) }, nil
}

func (w *Writer) writeLocked(r Record) (line []byte, ticket uint64, err error) {
	switch {
	case w.err != nil:
		return nil, 0, w.err
	case w.closed:
		return nil, 0, ErrClosed
	case w.terminated:
		return nil, 0, ErrTerminated
	}
	seq := w.seq + 1
	if err := w.checkPlace(seq, r); err != nil {
		return nil, 0, err
	}
	if t, ok := r.(RunTerminated); ok {
		t.Counts = w.counts
		r = t
	}
	h := Header{V: formatVersion, Run: w.runID, Seq: seq, Prev: w.prev, Time: w.now(), Type: r.RecordType()}
	payload, err := encodePayload(h, r)
	if err != nil {
		return nil, 0, err
	}
	sig := ed25519.Sign(w.priv, PAE(PayloadType, payload))
	w.buf = appendEnvelope(w.buf[:0], payload, w.keyID, sig)
	// The verifier's limits, applied before the line exists: a line or a
	// journal the verifier would reject is never written.
	if len(w.buf) > MaxLineBytes {
		return nil, 0, fmt.Errorf("audit: refused: %s record is %d bytes, more than the line limit of %d", h.Type, len(w.buf), MaxLineBytes)
	}
	limit := w.maxSize
	if h.Type != TypeRunTerminated {
		limit -= terminalReserve
	}
	if w.size+int64(len(w.buf))+1 > limit {
		return nil, 0, fmt.Errorf("audit: refused: %w: %s record of %d bytes after %d bytes (limit %d, of which the last %d are kept for %s)",
			ErrJournalFull, h.Type, len(w.buf)+1, w.size, w.maxSize, terminalReserve, TypeRunTerminated)
	}
	line = append([]byte(nil), w.buf...)
	w.buf = append(w.buf, '\n')
	if _, err := w.f.Write(w.buf); err != nil {
		w.err = fmt.Errorf("%w: write failed: %w", ErrPoisoned, err)
		return nil, 0, w.err
	}
	w.size += int64(len(w.buf))
	w.seq = seq
	w.prev = LineHash(line)
	w.written++
	w.count(r)
	if h.Type == TypeRunTerminated {
		w.terminated = true
	}
	return line, w.written, nil
}

func (w *Writer) checkPlace(seq int64, r Record) error {
	typ := r.RecordType()
	switch {
	case seq == 1 && typ != TypeRunStarted:
		return fmt.Errorf("audit: refused: the first record must be %s, not %s", TypeRunStarted, typ)
	case seq != 1 && typ == TypeRunStarted:
		return fmt.Errorf("audit: refused: %s can only be the first record", TypeRunStarted)
	case seq != 2 && typ == TypeBoundaryConfirmed:
		return fmt.Errorf("audit: refused: %s can only directly follow %s", TypeBoundaryConfirmed, TypeRunStarted)
	case seq == 2 && typ != TypeBoundaryConfirmed && typ != TypeRunTerminated:
		return fmt.Errorf("audit: refused: the record after %s must be %s (or %s), not %s", TypeRunStarted, TypeBoundaryConfirmed, TypeRunTerminated, typ)
	case seq >= MaxRecords && typ != TypeRunTerminated:
		return fmt.Errorf("audit: refused: %w: the journal holds %d records, the limit; only %s may follow", ErrTooManyRecords, seq-1, TypeRunTerminated)
	}
	if rs, ok := r.(RunStarted); ok && rs.PublicKey != string(w.pubPEM) {
		return fmt.Errorf("audit: refused: %s.public_key must be the writer's PublicKeyPEM", TypeRunStarted)
	}
	if err := w.lockfiles.check(r); err != nil {
		return fmt.Errorf("audit: refused: %w", err)
	}
	return nil
}

func (w *Writer) count(r Record) {
	w.counts.add(r)
	if w.lockfiles == nil {
		w.lockfiles = lockfileSet{}
	}
	w.lockfiles.apply(r)
}

// add counts r as run.terminated's counts do (the writer, and the
// summaries of runs.go, count the same way).
func (c *Counts) add(r Record) {
	switch r.(type) {
	case InferenceRequested:
		c.Requested++
	case InferenceCompleted:
		c.Completed++
	case InferenceRefused:
		c.Refused++
	case InferenceFailed:
		c.Failed++
	case ProcessStarted:
		c.Processes++
	case ToolRequested:
		c.Tools.Requested++
	case ToolCompleted:
		c.Tools.Completed++
	case ToolRefused:
		c.Tools.Refused++
	case ToolFailed:
		c.Tools.Failed++
	}
}

// syncTo returns once the first ticket lines are durable. One caller
// fsyncs for every line written so far; callers queued behind it find
// their line already covered.
//
// The caller that makes an fsync yields its processor once before it
// takes the count of lines to cover: goroutines already runnable (the
// broker's other requests, about to write their records) write first and
// share this fsync instead of queueing for the next. In the broker's
// BenchmarkThroughput at 32 connections this halved the fsyncs per
// request and took 9% off the CPU per request (each fsync costs the
// caller some 50 µs of kernel time); with nothing else to run (audit's
// BenchmarkAppendParallel, appenders only) it costs some throughput, as
// their signing then runs before the fsync rather than during it.
func (w *Writer) syncTo(ticket uint64) error {
	// Group commit. A line already covered by a finished fsync is
	// durable: no lock, no wait (a completion record synced after its
	// answer usually is, by the next request's pre-effect fsync).
	if w.durable.Load() >= ticket {
		return nil
	}
	w.syncMu.Lock()
	// While an fsync is in flight it may or may not cover this line: wait
	// for it to end, then either it did, or the first waiter to wake
	// makes the next one, covering every line written by then.
	for w.syncing {
		w.syncDone.Wait()
	}
	if w.durable.Load() >= ticket {
		w.syncMu.Unlock()
		return nil
	}
	w.syncing = true
	w.syncMu.Unlock()
	runtime.Gosched() // see above: more lines per fsync
	w.mu.Lock()
	err, target, f := w.err, w.written, w.f
	w.mu.Unlock()
	if err == nil {
		err = errors.Join(w.createdDurable(), w.sync(f))
	}
	w.syncMu.Lock()
	defer w.syncMu.Unlock()
	w.syncing = false
	w.syncDone.Broadcast()
	if err != nil {
		w.mu.Lock()
		if w.err == nil {
			w.err = fmt.Errorf("%w: fsync failed: %w", ErrPoisoned, err)
		}
		err = w.err
		w.mu.Unlock()
		return err
	}
	w.durable.Store(target)
	w.nsync++
	return nil
}

func (w *Writer) sync(f *os.File) error {
	if w.beforeSync != nil {
		w.beforeSync()
	}
	if w.skipSync {
		return nil
	}
	return f.Sync()
}

// Close syncs and closes the journal. Later Appends fail with ErrClosed.
// It does not write run.terminated; append that first. When every line
// written is durable already (the last Append synced it), there is
// nothing to sync: that fsync was one of every run's on its way out.
func (w *Writer) Close() error {
	w.syncMu.Lock()
	defer w.syncMu.Unlock()
	for w.syncing {
		w.syncDone.Wait()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil
	}
	w.closed = true
	cerr := w.createdDurable() // also: nothing of Create runs after Close
	var serr error
	if w.err == nil && cerr != nil {
		// No line to make durable, or they would have waited for it: the
		// run's key and directory are not durable, which Close says.
		w.err = fmt.Errorf("%w: %w", ErrPoisoned, cerr)
		serr = w.err
	}
	if w.err == nil && w.durable.Load() < w.written {
		if serr = w.f.Sync(); serr != nil {
			w.err = fmt.Errorf("%w: fsync failed: %w", ErrPoisoned, serr)
			serr = w.err
		} else {
			w.durable.Store(w.written)
			w.nsync++
		}
	}
	if err := w.f.Close(); err != nil && serr == nil {
		serr = fmt.Errorf("audit: closing journal: %w", err)
	}
	return serr
}

// KeyID returns the hex sha256 of the raw 32-byte public key.
func (w *Writer) KeyID() string { return w.keyID }

// PublicKey returns the run's public key.
func (w *Writer) PublicKey() ed25519.PublicKey { return append(ed25519.PublicKey(nil), w.pub...) }

// PublicKeyPEM returns the public key as written to pubkey.pem.
func (w *Writer) PublicKeyPEM() []byte { return append([]byte(nil), w.pubPEM...) }

// JournalPath returns the journal's path.
func (w *Writer) JournalPath() string { return w.path }

// RunID returns the run id.
func (w *Writer) RunID() string { return w.runID }

// Counts returns the counts of the records appended so far.
func (w *Writer) Counts() Counts {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.counts
}

// Err returns the error that poisoned the writer, or nil.
func (w *Writer) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}
