package audit

import (
	"errors"
	"os"
	"sync"
	"testing"
	"time"
)

// Create leaves the fsyncs of pubkey.pem and of the run directory to the
// background; the journal's first durable line waits for them and fails
// (poisoning the Writer) when they fail. The control: the same steps with
// the syncs succeeding make the line durable, after them.
func TestFirstSyncWaitsForCreate(t *testing.T) {
	orig := syncCreated
	t.Cleanup(func() { syncCreated = orig })
	for _, tc := range []struct {
		name string
		fail error
	}{{"key and directory synced", nil}, {"key sync failed", errors.New("injected: EIO")}} {
		t.Run(tc.name, func(t *testing.T) {
			release := make(chan struct{})
			var once sync.Once
			free := func() { once.Do(func() { close(release) }) }
			var doneAt time.Time
			syncCreated = func(kf *os.File, dir string) error {
				<-release
				err := orig(kf, dir)
				doneAt = time.Now()
				if tc.fail != nil {
					return tc.fail
				}
				return err
			}
			w, _ := newTestWriter(t)
			t.Cleanup(free) // runs before the writer's Close, which waits for it
			appended := make(chan error, 1)
			go func() {
				_, err := w.Append(runStarted(w))
				appended <- err
			}()
			select {
			case err := <-appended:
				t.Fatalf("Append returned (%v) before the key and directory were durable", err)
			case <-time.After(50 * time.Millisecond):
			}
			free()
			err := <-appended
			if tc.fail == nil {
				if err != nil {
					t.Fatalf("Append: %v", err)
				}
				if w.durable.Load() != 1 || doneAt.IsZero() {
					t.Errorf("synced %d lines, key synced at %v", w.durable.Load(), doneAt)
				}
				if err := w.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrPoisoned) || !errors.Is(err, tc.fail) {
				t.Fatalf("Append after a failed key sync: %v, want %v wrapping %v", err, ErrPoisoned, tc.fail)
			}
			if _, err := w.Append(BoundaryConfirmed{Ready: true}); !errors.Is(err, ErrPoisoned) {
				t.Errorf("a later Append: %v, want %v", err, ErrPoisoned)
			}
			w.Close()
		})
	}
	// Close of a journal with no line says so too.
	syncCreated = func(kf *os.File, dir string) error { orig(kf, dir); return errors.New("injected: EIO") }
	w, _ := newTestWriter(t)
	if err := w.Close(); !errors.Is(err, ErrPoisoned) {
		t.Errorf("Close of an empty journal whose key could not be synced: %v, want %v", err, ErrPoisoned)
	}
}
