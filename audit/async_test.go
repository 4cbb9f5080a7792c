package audit

import (
	"bytes"
	"errors"
	"os"
	"sync"
	"testing"
	"time"
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
	synced, nsync := w.durable.Load(), w.nsync
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
	synced, after := w.durable.Load(), w.nsync
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

// Group commit: a line that a finished fsync covered is durable, and its
// wait returns at once even while another fsync is in flight (a
// completion record's wait, most often, with the next request's
// pre-effect fsync under way); the control, a line written while that
// fsync is in flight, is not reported durable until an fsync that began
// after it ends.
func TestCoveredLineWaitsForNoSync(t *testing.T) {
	w, _ := newTestWriter(t)
	for _, r := range []Record{runStarted(w), BoundaryConfirmed{Ready: true}} {
		if _, err := w.Append(r); err != nil {
			t.Fatal(err)
		}
	}
	_, waitA, err := w.AppendAsync(benchRecord())
	if err != nil {
		t.Fatal(err)
	}
	if err := waitA(); err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	w.beforeSync = func() {
		once.Do(func() { close(entered) })
		<-release
	}
	_, waitB, err := w.AppendAsync(benchRecord())
	if err != nil {
		t.Fatal(err)
	}
	doneB := make(chan error, 1)
	go func() { doneB <- waitB() }()
	<-entered // B's fsync is in flight, and held there

	doneA := make(chan error, 1)
	go func() { doneA <- waitA() }()
	select {
	case err := <-doneA:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		close(release)
		t.Fatal("the wait of a line already durable blocked behind an fsync in flight")
	}

	_, waitC, err := w.AppendAsync(benchRecord())
	if err != nil {
		t.Fatal(err)
	}
	doneC := make(chan error, 1)
	go func() { doneC <- waitC() }()
	select {
	case err := <-doneC:
		close(release)
		t.Fatalf("a line written during an fsync in flight was reported durable before any fsync after it (%v)", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	if err := <-doneB; err != nil {
		t.Fatal(err)
	}
	if err := <-doneC; err != nil {
		t.Fatal(err)
	}
	w.syncMu.Lock()
	defer w.syncMu.Unlock()
	if w.durable.Load() != w.written {
		t.Errorf("%d of %d lines durable after every wait returned", w.durable.Load(), w.written)
	}
}
