package sandbox

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Red team of the lockfile reading (issue 19; the broker's routes are
// attacked in broker/packages_redteam_test.go).

// TestRedteamLockfileFIFO: a workload that may write its lockfile's
// directory can replace the lockfile with a named pipe. Opening it
// blocked until a writer came, so that reading the lockfiles (at the next
// start, or an operator's re-read while the workload runs) hung with no
// error and nothing journaled; it is refused at once as not a regular
// file. Positive control: a regular file next to it is read.
func TestRedteamLockfileFIFO(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "package-lock.json")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	reg := filepath.Join(dir, "go.sum")
	os.WriteFile(reg, []byte("x\n"), 0o644)
	if data, err := openLockfile(reg, 100); err != nil || string(data) != "x\n" {
		t.Fatalf("regular file: %q %v", data, err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := openLockfile(fifo, 100)
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "not a regular file") {
			t.Errorf("named pipe: %v, want not a regular file", err)
		}
	case <-time.After(10 * time.Second):
		// Unblock the open so that the goroutine ends.
		if f, err := os.OpenFile(fifo, os.O_WRONLY, 0); err == nil {
			f.Close()
		}
		<-done
		t.Fatal("opening a named pipe as a lockfile blocked")
	}
}
