package audit

import (
	"bytes"
	"errors"
	"os"
	"testing"
)

// AppendAsync writes the line in its place before it returns, and its wait
// makes it durable; a sync that fails poisons the writer as Append's does.
func TestAppendAsync(t *testing.T) {
	w, _ := newTestWriter(t)
	for _, r := range []Record{runStarted(w), BoundaryConfirmed{Ready: true}} {
		if _, err := w.Append(r); err != nil {
			t.Fatal(err)
		}
	}
	line, wait, err := w.AppendAsync(benchRecord())
	if err != nil {
		t.Fatal(err)
	}
	w.syncMu.Lock()
	synced, nsync := w.synced, w.nsync
	w.syncMu.Unlock()
	if synced != 2 {
		t.Fatalf("before wait: %d lines durable, want 2 (the line is written, not yet synced)", synced)
	}
	b, _ := os.ReadFile(w.JournalPath())
	if !bytes.HasSuffix(b, append(append([]byte(nil), line...), '\n')) {
		t.Fatal("the line is not the last line of the journal when AppendAsync returns")
	}
	if err := wait(); err != nil {
		t.Fatal(err)
	}
	w.syncMu.Lock()
	synced, after := w.synced, w.nsync
	w.syncMu.Unlock()
	if synced != 3 || after != nsync+1 {
		t.Fatalf("after wait: %d lines durable after %d fsyncs, want 3 after %d", synced, after, nsync+1)
	}
	// A later Append's fsync covers an earlier async line: its wait then
	// makes no fsync of its own.
	_, wait2, err := w.AppendAsync(benchRecord())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Append(benchRecord()); err != nil {
		t.Fatal(err)
	}
	if err := wait2(); err != nil {
		t.Fatal(err)
	}
	w.syncMu.Lock()
	if w.nsync != after+1 {
		t.Errorf("%d fsyncs for an async line covered by a later Append, want %d", w.nsync, after+1)
	}
	w.syncMu.Unlock()

	// The sync fails (the file is closed under the writer): wait reports
	// ErrPoisoned, and so does every later append.
	_, wait3, err := w.AppendAsync(benchRecord())
	if err != nil {
		t.Fatal(err)
	}
	w.f.Close()
	if err := wait3(); !errors.Is(err, ErrPoisoned) {
		t.Fatalf("wait after a failed fsync: %v, want ErrPoisoned", err)
	}
	if _, _, err := w.AppendAsync(benchRecord()); !errors.Is(err, ErrPoisoned) {
		t.Errorf("AppendAsync after the failure: %v, want ErrPoisoned", err)
	}
	if _, err := w.Append(RunTerminated{Reason: ReasonCompleted}); !errors.Is(err, ErrPoisoned) {
		t.Errorf("Append after the failure: %v, want ErrPoisoned", err)
	}
	if _, _, err := w.AppendAsync(nil); err == nil {
		t.Error("AppendAsync(nil) accepted")
	}
}
