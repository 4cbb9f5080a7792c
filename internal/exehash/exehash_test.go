package exehash

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"
)

func sumOf(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

// settled makes every file count as changed long ago, for the test.
func settled(t *testing.T) {
	t.Helper()
	mu.Lock()
	now = func() time.Time { return time.Now().Add(time.Hour) }
	clear(cache)
	mu.Unlock()
	t.Cleanup(func() { mu.Lock(); now = time.Now; clear(cache); mu.Unlock() })
}

func hashCount() int { mu.Lock(); defer mu.Unlock(); return hashes }

func write(t *testing.T, p string, b []byte) {
	t.Helper()
	if err := os.WriteFile(p, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

func TestSumIsTheContentsHash(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	write(t, p, []byte("abc"))
	got, err := File(p, 1<<20)
	if want := "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"; err != nil || got != want {
		t.Fatalf("File = %q, %v; want %q", got, err, want)
	}
}

// A settled version is hashed once; the same contents changed in place
// (same size, mtime put back, as anyone who may write the file can do)
// are hashed again, because the kernel moved the ctime.
func TestChangedFileIsHashedAgain(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("versions are remembered on Linux only")
	}
	settled(t)
	p := filepath.Join(t.TempDir(), "f")
	a, b := []byte("contents one"), []byte("contents two")
	write(t, p, a)
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	n := hashCount()
	for i := range 3 {
		if got, err := File(p, 1<<20); err != nil || got != sumOf(a) {
			t.Fatalf("read %d: %q, %v; want %q", i, got, err, sumOf(a))
		}
	}
	// Control: an unchanged settled version is read once.
	if d := hashCount() - n; d != 1 {
		t.Fatalf("an unchanged settled file was read %d times, want 1", d)
	}
	time.Sleep(10 * time.Millisecond) // past a coarse clock tick
	write(t, p, b)
	if err := os.Chtimes(p, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	if got, err := File(p, 1<<20); err != nil || got != sumOf(b) {
		t.Fatalf("after the change: %q, %v; want %q (the old version's hash is %q)", got, err, sumOf(b), sumOf(a))
	}
	if d := hashCount() - n; d != 2 {
		t.Fatalf("the changed file was read %d times in all, want 2", d)
	}
}

// A file changed less than Settle ago is read every time: a change in the
// same clock tick as its last one could leave its ctime as it was.
func TestRecentFileIsNotRemembered(t *testing.T) {
	mu.Lock()
	clear(cache)
	mu.Unlock()
	p := filepath.Join(t.TempDir(), "f")
	write(t, p, []byte("fresh"))
	n := hashCount()
	for range 3 {
		if got, err := File(p, 1<<20); err != nil || got != sumOf([]byte("fresh")) {
			t.Fatalf("File = %q, %v", got, err)
		}
	}
	if d := hashCount() - n; d != 3 {
		t.Fatalf("a file changed just now was read %d times in 3 calls, want 3", d)
	}
}

func TestRefusals(t *testing.T) {
	dir := t.TempDir()
	if _, err := File(dir, 1<<20); err == nil {
		t.Error("a directory was hashed")
	}
	p := filepath.Join(dir, "big")
	write(t, p, make([]byte, 100))
	if _, err := File(p, 99); err == nil {
		t.Error("a file over the limit was hashed")
	}
	// Control: at the limit it is.
	if got, err := File(p, 100); err != nil || got != sumOf(make([]byte, 100)) {
		t.Errorf("a file at the limit: %q, %v", got, err)
	}
	if _, err := File(filepath.Join(dir, "missing"), 1<<20); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
}

// Callers that ask for a settled version while it is being hashed wait for
// that hash: the file is read once however many ask at once. The first
// hash is held until the other seven wait (or 5 s pass, when nothing
// shares it and they all read the file: then the count fails the test).
func TestConcurrentCallersShareOneHash(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("versions are remembered on Linux only")
	}
	settled(t)
	p := filepath.Join(t.TempDir(), "f")
	b := make([]byte, 1<<20)
	write(t, p, b)
	var once sync.Once
	mu.Lock()
	testHashing = func() {
		once.Do(func() {
			for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
				mu.Lock()
				w := waiting
				mu.Unlock()
				if w >= 7 {
					return
				}
			}
		})
	}
	waiting = 0
	mu.Unlock()
	t.Cleanup(func() { mu.Lock(); testHashing = nil; mu.Unlock() })
	n := hashCount()
	var wg sync.WaitGroup
	sums := make([]string, 8)
	for i := range sums {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			if sums[i], err = File(p, 1<<30); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	for i, s := range sums {
		if s != sumOf(b) {
			t.Errorf("caller %d: %q, want %q", i, s, sumOf(b))
		}
	}
	if d := hashCount() - n; d != 1 {
		t.Errorf("8 callers at once read the file %d times, want 1", d)
	}
}
