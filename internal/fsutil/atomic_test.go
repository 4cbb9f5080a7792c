package fsutil

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A symlink planted at the name is replaced, never followed: its target
// keeps its content, and the name holds the new file.
func TestWriteFileAtomicDoesNotFollowSymlink(t *testing.T) {
	dir := t.TempDir()
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("precious\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "out.json")
	if err := os.Symlink(victim, p); err != nil {
		t.Fatal(err)
	}
	if err := WriteFileAtomic(p, []byte("new\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "precious\n" {
		t.Errorf("the symlink's target was written: %q", b)
	}
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o600 {
		t.Errorf("%s: got mode %v, want a regular 0600 file", p, fi.Mode())
	}
	if b, _ := os.ReadFile(p); string(b) != "new\n" {
		t.Errorf("content: got %q", b)
	}
	// Positive control: an existing regular file is replaced too, and no
	// temporary file is left.
	if err := WriteFileAtomic(p, []byte("newer\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(p); string(b) != "newer\n" {
		t.Errorf("content: got %q", b)
	}
	if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o640 {
		t.Errorf("mode: got %v, want 0640", fi.Mode().Perm())
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Errorf("directory holds %d entries, want only out.json: %v", len(ents), ents)
	}
}

// The directory itself is opened with O_NOFOLLOW: a symlink there is
// refused (with a plain directory as the control).
func TestOpenDirRefusesSymlink(t *testing.T) {
	real := t.TempDir()
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenDir(link); err == nil || !strings.Contains(err.Error(), "symlink") {
		t.Errorf("OpenDir(symlink): got %v, want a refusal naming the symlink", err)
	}
	if err := WriteFileAtomic(filepath.Join(link, "x"), []byte("x"), 0o600); err == nil {
		t.Errorf("WriteFileAtomic through a symlinked directory: no error")
	}
	if _, err := os.Stat(filepath.Join(real, "x")); err == nil {
		t.Errorf("the file was written through the symlinked directory")
	}
	d, err := OpenDir(real)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.WriteFile("x", []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", ".", "..", "a/b"} {
		if err := d.WriteFile(bad, nil, 0o600); err == nil {
			t.Errorf("WriteFile(%q): no error", bad)
		}
	}
}

// Ancestors lists the directory and everything above it, by inode, up to /.
func TestAncestors(t *testing.T) {
	base := t.TempDir()
	deep := filepath.Join(base, "a", "b")
	if err := os.MkdirAll(deep, 0o755); err != nil {
		t.Fatal(err)
	}
	// Reached through a symlink above it, the walk still finds base.
	link := filepath.Join(t.TempDir(), "l")
	if err := os.Symlink(filepath.Join(base, "a"), link); err != nil {
		t.Fatal(err)
	}
	d, err := OpenDir(filepath.Join(link, "b"))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	anc, err := d.Ancestors()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{deep, filepath.Join(base, "a"), base, "/"}
	for _, w := range want {
		id, err := StatID(w)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, a := range anc {
			found = found || a == id
		}
		if !found {
			t.Errorf("%s is not among the ancestors", w)
		}
	}
	// Control: a sibling directory is not.
	other, _ := StatID(t.TempDir())
	for _, a := range anc {
		if a == other {
			t.Errorf("an unrelated directory is among the ancestors")
		}
	}
}
