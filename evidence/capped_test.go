package evidence

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// readCapped caps what it reads, not what a stat says: a file whose size
// says 0 but that holds more (as /proc's do, or one that grows between a
// stat and a read) is refused past the limit. Control: a file of exactly
// the limit is read whole, one byte more is refused.
func TestReadCappedReallyCaps(t *testing.T) {
	dir := t.TempDir()
	at := filepath.Join(dir, "at")
	over := filepath.Join(dir, "over")
	os.WriteFile(at, []byte(strings.Repeat("a", 100)), 0o600)
	os.WriteFile(over, []byte(strings.Repeat("a", 101)), 0o600)
	if b, err := readCapped(at, 100); err != nil || len(b) != 100 {
		t.Errorf("a file of the limit: got %d bytes, %v; want 100 bytes", len(b), err)
	}
	if b, err := readCapped(over, 100); err == nil {
		t.Errorf("a file over the limit: got %d bytes, want an error", len(b))
	}
	if runtime.GOOS != "linux" {
		return
	}
	st, err := os.Stat("/proc/self/status")
	if err != nil || st.Size() != 0 {
		t.Fatalf("/proc/self/status: size %v, %v; the test needs a file whose size says 0", st, err)
	}
	if b, err := readCapped("/proc/self/status", 100); err == nil {
		t.Errorf("/proc/self/status (size 0, content longer than 100 bytes): got %d bytes, want an error", len(b))
	}
}
