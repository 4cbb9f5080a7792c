//go:build linux

package exehash

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/testenv"
)

// needKeyring skips where the kernel keyring cannot be used (a container
// whose seccomp profile refuses keyctl); CI requires it.
func needKeyring(t *testing.T) {
	t.Helper()
	id, err := unix.AddKey("user", "moat-exehash-test:probe", []byte("x"), unix.KEY_SPEC_USER_KEYRING)
	testenv.Need(t, err == nil, "the kernel keyring is unavailable here (add_key: "+errString(err)+")")
	unlink(id)
}

func errString(err error) string {
	if err == nil {
		return "ok"
	}
	return err.Error()
}

func unlink(id int) {
	if ring, err := unix.KeyctlGetKeyringID(unix.KEY_SPEC_USER_KEYRING, false); err == nil {
		unix.KeyctlInt(unix.KEYCTL_UNLINK, id, ring, 0, 0)
	}
}

// unlinkEntry removes the shared entry of the file at p's version now,
// if any, and again when the test ends.
func unlinkEntry(t *testing.T, p string) {
	f, err := os.Open(p)
	if err != nil {
		return
	}
	defer f.Close()
	k, _, _ := stat(f)
	desc := sharedDesc(k)
	rm := func() {
		if id, err := unix.KeyctlSearch(unix.KEY_SPEC_USER_KEYRING, "user", desc, 0); err == nil {
			unlink(id)
		}
	}
	rm()
	t.Cleanup(rm)
}

// newProcess forgets what this process remembered, as a second moat
// process would start with nothing.
func newProcess() { mu.Lock(); clear(cache); mu.Unlock() }

func hits() int { mu.Lock(); defer mu.Unlock(); return sharedHits }

// sharedFixture is a settled file "the binary" that the keyring has no
// entry for, and a state directory's path beside it.
func sharedFixture(t *testing.T) (p, state string) {
	t.Helper()
	needKeyring(t)
	settled(t)
	dir := t.TempDir()
	p = filepath.Join(dir, "moat")
	write(t, p, []byte("the binary"))
	unlinkEntry(t, p)
	return p, filepath.Join(dir, "state")
}

func TestFileSharedAcrossProcesses(t *testing.T) {
	p, state := sharedFixture(t)

	expectSum(t, "first", p, state, "the binary", 1, 0)
	newProcess()
	expectSum(t, "second process", p, state, "the binary", 0, 1)

	// A new version (its ctime is new) is hashed again, whatever the
	// keyring holds for the old one.
	// The entry cannot be updated in place, not even by its owner.
	f, _ := os.Open(p)
	k, _, _ := stat(f)
	f.Close()
	if _, err := unix.AddKey("user", sharedDesc(k), make([]byte, 64), unix.KEY_SPEC_USER_KEYRING); err == nil {
		t.Fatal("the shared entry could be overwritten")
	}
	write(t, p, []byte("another binary"))
	unlinkEntry(t, p)
	newProcess()
	expectSum(t, "changed", p, state, "another binary", 1, 0)
}

// expectSum calls FileShared(p) and fails t unless it answers content's
// sum after hashing the file hashed times and taking the keyring's entry
// shared times.
func expectSum(t *testing.T, what, p, state, content string, hashed, shared int) {
	t.Helper()
	h0, s0 := hashCount(), hits()
	got, err := FileShared(p, 1<<20, state)
	if err != nil || got != sumOf([]byte(content)) {
		t.Fatalf("%s: %q, %v", what, got, err)
	}
	if dh, ds := hashCount()-h0, hits()-s0; dh != hashed || ds != shared {
		t.Fatalf("%s: %d hashes, %d shared answers; want %d and %d", what, dh, ds, hashed, shared)
	}
}

// A planted entry (another digest, sealed under another secret, or
// malformed) is not believed: the file is hashed and its true sum
// returned. The control is the entry FileShared itself leaves, which
// the next process believes.
func TestFileSharedPlantedEntry(t *testing.T) {
	p, state := sharedFixture(t)
	f, _ := os.Open(p)
	k, _, _ := stat(f)
	f.Close()
	desc := sharedDesc(k)
	liar := sumOf([]byte("a lie"))
	lieDigest := []byte(liar[:32])
	for name, payload := range map[string][]byte{
		"another secret": sealEntry([]byte("not the secret of this state dir"), desc, lieDigest),
		"digest only":    lieDigest,
		"one byte":       {0},
		"too long":       append(sealEntry([]byte("x"), desc, lieDigest), 0),
	} {
		t.Run(name, func(t *testing.T) {
			// (The entry FileShared leaves cannot be updated, not even by
			// its owner: a planter must unlink it first, as here.)
			unlinkEntry(t, p)
			if _, err := unix.AddKey("user", desc, payload, unix.KEY_SPEC_USER_KEYRING); err != nil {
				t.Fatal(err)
			}
			newProcess()
			expectSum(t, "planted", p, state, "the binary", 1, 0)
			// Control: FileShared replaced the planted entry with its own,
			// which the next process takes.
			newProcess()
			expectSum(t, "control", p, state, "the binary", 0, 1)
		})
	}
}

// The secret's directory and file must be this user's alone; otherwise
// nothing is shared (and the sum is still right).
func TestFileSharedSecretChecks(t *testing.T) {
	needKeyring(t)
	settled(t)
	dir := t.TempDir()
	p := filepath.Join(dir, "moat")
	write(t, p, []byte("the binary"))
	unlinkEntry(t, p)

	open := filepath.Join(dir, "open")
	os.Mkdir(open, 0o777)
	os.Chmod(open, 0o777)
	loose := filepath.Join(dir, "loose")
	os.Mkdir(loose, 0o700)
	os.WriteFile(filepath.Join(loose, secretName), make([]byte, 32), 0o644)
	os.Chmod(filepath.Join(loose, secretName), 0o644)
	link := filepath.Join(dir, "link")
	os.Mkdir(link, 0o700)
	os.WriteFile(filepath.Join(dir, "elsewhere"), make([]byte, 32), 0o600)
	os.Symlink(filepath.Join(dir, "elsewhere"), filepath.Join(link, secretName))
	for _, state := range []string{open, loose, link, "relative/dir"} {
		t.Run(filepath.Base(state), func(t *testing.T) {
			if _, err := loadSecret(state); err == nil {
				t.Fatalf("loadSecret(%s) accepted it", state)
			}
			for range 2 {
				newProcess()
				expectSum(t, "unshared state", p, state, "the binary", 1, 0)
			}
		})
	}
	// Control: a private directory shares.
	good := filepath.Join(dir, "good")
	if _, err := loadSecret(good); err != nil {
		t.Fatalf("control: %v", err)
	}
	if fi, err := os.Stat(filepath.Join(good, secretName)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("control: secret file %v, %v", fi, err)
	}
}

// An unsettled version (changed less than Settle ago) is never shared.
func TestFileSharedUnsettled(t *testing.T) {
	needKeyring(t)
	dir := t.TempDir()
	p := filepath.Join(dir, "moat")
	write(t, p, []byte("fresh"))
	unlinkEntry(t, p)
	mu.Lock()
	clear(cache)
	mu.Unlock()
	if _, err := FileShared(p, 1<<20, filepath.Join(dir, "state")); err != nil {
		t.Fatal(err)
	}
	f, _ := os.Open(p)
	k, _, _ := stat(f)
	f.Close()
	if _, err := unix.KeyctlSearch(unix.KEY_SPEC_USER_KEYRING, "user", sharedDesc(k), 0); err == nil {
		t.Fatal("an unsettled version was shared")
	}
}
