package sandbox

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/moat-sandbox/moat/policy"
)

// The host sentinel is world-readable whatever the umask (so that only the
// confinement can keep the sandbox from it), and made only where nothing
// was: a second one in the same place is refused.
func TestHostSentinelMode(t *testing.T) {
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	dir := t.TempDir()
	pol := &policy.Policy{}
	got, err := hostSecrets(dir, pol)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "host-sentinel")
	if len(got) == 0 || got[0] != p {
		t.Fatalf("hostSecrets: %v, want the sentinel %s first", got, p)
	}
	fi, err := os.Lstat(p)
	if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o644 {
		t.Fatalf("sentinel: %v %v, want a regular file with mode 0644 under umask 077", fi, err)
	}
	if b, _ := os.ReadFile(p); string(b) != "moat host sentinel\n" {
		t.Errorf("sentinel content %q", b)
	}
	if _, err := hostSecrets(dir, pol); err == nil {
		t.Error("a second sentinel over the first was made")
	}
}
