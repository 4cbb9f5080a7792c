package reaper

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReadRecords: owned entries are kept until done; bad records are
// ignored (and reported) without stopping the read.
func TestReadRecords(t *testing.T) {
	in := "own\ttree\t/tmp/a\nwait\t4242\nown\tdir\t/sys/fs/cgroup/pids/x\nbogus\nown\ttree\trelative\nown\ttree\t/\nwait\t1\ndone\t/tmp/a\n"
	var waited []int
	owned, err := read(strings.NewReader(in), func(pid int) { waited = append(waited, pid) })
	if len(waited) != 1 || waited[0] != 4242 {
		t.Errorf("wait records: got %v, want [4242] (pid 1 is never waited for)", waited)
	}
	if err == nil {
		t.Error("bad records: got no error")
	}
	if len(owned) != 1 || owned[0] != (entry{path: "/sys/fs/cgroup/pids/x"}) {
		t.Errorf("owned: got %+v, want only the cgroup", owned)
	}
}

// TestRemove: a tree and an empty directory are removed, newest first; a
// symlink inside the tree is removed, not followed (its target stays).
func TestRemove(t *testing.T) {
	dir := t.TempDir()
	tree := filepath.Join(dir, "tree")
	keep := filepath.Join(dir, "keep")
	for _, d := range []string{filepath.Join(tree, "sub"), keep} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(keep, "f"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(keep, filepath.Join(tree, "link")); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.Mkdir(empty, 0o755); err != nil {
		t.Fatal(err)
	}
	if code := remove([]entry{{path: tree, tree: true}, {path: empty}}); code != 0 {
		t.Fatalf("remove: code %d", code)
	}
	for _, p := range []string{tree, empty} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("%s still there (%v)", p, err)
		}
	}
	if _, err := os.Stat(filepath.Join(keep, "f")); err != nil {
		t.Errorf("the symlink's target was touched: %v", err)
	}
}

// TestNilReaper: a nil reaper does nothing and fails nothing.
func TestNilReaper(t *testing.T) {
	var rp *Reaper
	if err := rp.Own("/x", true); err != nil {
		t.Error(err)
	}
	if err := rp.Done("/x"); err != nil {
		t.Error(err)
	}
	if err := rp.Close(); err != nil {
		t.Error(err)
	}
}
