package reaper

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/reexec"
	"github.com/moat-sandbox/moat/internal/reexec/reexectest"
)

func TestMain(m *testing.M) { reexectest.Main(m, reexec.Helper{Name: Helper, Main: Main}) }

// TestHelperRestarted: a helper killed while moat runs (as the terminal's
// ^C could, between its fork and its setsid) is replaced, and the new one
// is told what is still owned: once moat is gone, a directory owned
// before the kill and one owned after are both removed, and one marked
// done before the kill is kept. Control: the first helper really died
// (its pid is gone) and a new one runs.
func TestHelperRestarted(t *testing.T) {
	dir := t.TempDir()
	before, after, done := filepath.Join(dir, "before"), filepath.Join(dir, "after"), filepath.Join(dir, "done")
	for _, d := range []string{before, after, done} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	rp, err := Start(reexectest.Self())
	if err != nil {
		t.Fatal(err)
	}
	for _, err := range []error{rp.Own(before, true), rp.Own(done, true), rp.Done(done)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	rp.mu.Lock()
	first := rp.pid
	rp.mu.Unlock()
	syscall.Kill(first, syscall.SIGINT)
	deadline := time.Now().Add(10 * time.Second)
	for {
		rp.mu.Lock()
		pid := rp.pid
		rp.mu.Unlock()
		if pid != first {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the killed helper was not replaced")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := syscall.Kill(first, 0); err == nil {
		t.Fatalf("control: the first helper %d still runs", first)
	}
	if err := rp.Own(after, true); err != nil {
		t.Fatal(err)
	}
	rp.mu.Lock()
	second := rp.pid
	rp.mu.Unlock()
	if err := rp.Close(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); syscall.Kill(second, 0) == nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the second helper did not exit")
		}
	}
	for _, d := range []string{before, after} {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s: %v, want removed by the new helper", d, err)
		}
	}
	if _, err := os.Stat(done); err != nil {
		t.Errorf("%s (done before the kill): %v, want kept", done, err)
	}
}

// TestRememberCompacts: done cancels its own record; other records stay.
func TestRememberCompacts(t *testing.T) {
	var rp Reaper
	for _, l := range []string{"own\ttree\t/a", "wait\t7", "own\tdir\t/b", "done\t/a", "done\t/nope"} {
		rp.remember(l)
	}
	if len(rp.log) != 2 || rp.log[0] != "wait\t7" || rp.log[1] != "own\tdir\t/b" {
		t.Errorf("log %q", rp.log)
	}
}
