package audit

import (
	"errors"
	"os"
	"testing"
)

// Close makes durable what is not yet (a line written by AppendAsync whose
// wait was never called) and makes no fsync when the last Append already
// made every line durable: it used to sync again on every run's way out.
// The journal's file is swapped for a pipe just before Close, on which
// fsync fails (EINVAL): an attempted fsync shows as Close's error.
func TestCloseSyncsOnlyWhatIsNotDurable(t *testing.T) {
	swapForPipe := func(t *testing.T, w *Writer) {
		t.Helper()
		r, p, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		w.mu.Lock()
		real := w.f
		w.f = p
		w.mu.Unlock()
		real.Close()
	}
	t.Run("all durable", func(t *testing.T) {
		w, _ := newTestWriter(t)
		if _, err := w.Append(runStarted(w)); err != nil {
			t.Fatal(err)
		}
		swapForPipe(t, w)
		if err := w.Close(); err != nil {
			t.Errorf("Close after every line was durable: %v (it tried an fsync it did not need)", err)
		}
	})
	t.Run("one line not yet durable", func(t *testing.T) {
		w, _ := newTestWriter(t)
		if _, err := w.Append(runStarted(w)); err != nil {
			t.Fatal(err)
		}
		if _, _, err := w.AppendAsync(BoundaryConfirmed{Ready: true}); err != nil {
			t.Fatal(err)
		}
		swapForPipe(t, w)
		if err := w.Close(); !errors.Is(err, ErrPoisoned) {
			t.Errorf("Close with a line not yet durable: %v, want its fsync tried (and failed on the pipe: %v)", err, ErrPoisoned)
		}
	})
	t.Run("one line not yet durable, real file", func(t *testing.T) {
		w, _ := newTestWriter(t)
		if _, err := w.Append(runStarted(w)); err != nil {
			t.Fatal(err)
		}
		if _, _, err := w.AppendAsync(BoundaryConfirmed{Ready: true}); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		if w.durable.Load() != w.written || w.written != 2 {
			t.Errorf("Close: synced %d of %d lines, want both durable", w.durable.Load(), w.written)
		}
	})
}
