package broker

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/boundary"
)

// testJournal is the real audit writer, with a switch that makes Append
// fail (for the unit test of audit faults; the real-storage fault is
// TestRootAuditFaultRealStorage).
type testJournal struct {
	w *audit.Writer

	mu       sync.Mutex
	fail     error         // non-nil: every Append fails
	failWait error         // non-nil: every AppendAsync's wait fails after the line is written
	holdWait chan struct{} // non-nil: every AppendAsync's wait blocks until it is closed
	async    []string      // the types of the records written by AppendAsync
}

func newTestJournal(t testing.TB) *testJournal {
	t.Helper()
	return openTestJournal(t, filepath.Join(t.TempDir(), "run"))
}

// openTestJournal creates a journal in dir and writes the records that
// precede the broker's (run.started, boundary.confirmed).
func openTestJournal(t testing.TB, dir string) *testJournal {
	t.Helper()
	w, err := audit.Create(dir, "run-broker-test")
	if err != nil {
		t.Fatalf("audit.Create: %v", err)
	}
	t.Cleanup(func() { w.Close() })
	if _, err := w.Append(audit.RunStarted{PolicySHA256: fmt.Sprintf("%064x", 0), Backend: "test", BinarySHA256: fmt.Sprintf("%064x", 0), PublicKey: string(w.PublicKeyPEM())}); err != nil {
		t.Fatalf("run.started: %v", err)
	}
	if _, err := w.Append(audit.BoundaryConfirmed{Ready: true, Properties: boundary.Properties{}}); err != nil {
		t.Fatalf("boundary.confirmed: %v", err)
	}
	return &testJournal{w: w}
}

func (j *testJournal) Append(r audit.Record) ([]byte, error) {
	j.mu.Lock()
	err := j.fail
	j.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return j.w.Append(r)
}

// AppendAsync is the real writer's, with the same switch, and failWait,
// which makes the wait fail once the line is written (a sync that fails
// after the answer was released).
func (j *testJournal) AppendAsync(r audit.Record) ([]byte, func() error, error) {
	j.mu.Lock()
	err, werr, hold := j.fail, j.failWait, j.holdWait
	j.async = append(j.async, r.RecordType())
	j.mu.Unlock()
	if err != nil {
		return nil, nil, err
	}
	line, wait, err := j.w.AppendAsync(r)
	if err != nil || (werr == nil && hold == nil) {
		return line, wait, err
	}
	return line, func() error {
		if hold != nil {
			<-hold
		}
		if err := wait(); err != nil || werr == nil {
			return err
		}
		// As the real writer: a failed sync poisons it, so every later
		// append fails too.
		j.mu.Lock()
		if j.fail == nil {
			j.fail = werr
		}
		j.mu.Unlock()
		return werr
	}, nil
}

func (j *testJournal) setHoldWait(c chan struct{}) {
	j.mu.Lock()
	j.holdWait = c
	j.mu.Unlock()
}

func (j *testJournal) setFailWait(err error) {
	j.mu.Lock()
	j.failWait = err
	j.mu.Unlock()
}

func (j *testJournal) asyncTypes() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return append([]string(nil), j.async...)
}

func (j *testJournal) setFail(err error) {
	j.mu.Lock()
	j.fail = err
	j.mu.Unlock()
}

// lines returns the journal file's lines as they are on disk.
func (j *testJournal) lines() [][]byte {
	b, err := os.ReadFile(j.w.JournalPath())
	if err != nil {
		panic("BUG: reading the test journal: " + err.Error())
	}
	// A line is whole only with its LF: the writer may be mid-write (an
	// async completion record) while a test polls the file, and a read
	// can then end inside the last line.
	if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
		b = b[:i+1]
	} else {
		b = nil
	}
	var out [][]byte
	for _, l := range bytes.Split(b, []byte("\n")) {
		if len(l) > 0 {
			out = append(out, l)
		}
	}
	return out
}

// verify checks a Moat-Pre-Effect line as a provider would: signed by the
// run's key, and already in the journal file on disk.
func (j *testJournal) verify(line []byte) error {
	if _, err := audit.VerifyLine(line, j.w.PublicKey()); err != nil {
		return err
	}
	for _, l := range j.lines() {
		if bytes.Equal(l, line) {
			return nil
		}
	}
	return fmt.Errorf("the line is not in the journal file")
}

// verifyAll terminates the journal and verifies it whole.
func (j *testJournal) verifyAll(t testing.TB) {
	t.Helper()
	if _, err := j.w.Append(audit.RunTerminated{Reason: "completed"}); err != nil {
		t.Fatalf("run.terminated: %v", err)
	}
	b, err := os.ReadFile(j.w.JournalPath())
	if err != nil {
		t.Fatal(err)
	}
	if res := audit.Verify(b, j.w.PublicKey()); res.Status != audit.Complete {
		t.Errorf("journal verification: %v (%s), want complete", res.Status, res.Reason)
	}
}
