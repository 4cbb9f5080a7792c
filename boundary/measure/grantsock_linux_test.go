package measure

import (
	"os"
	"path/filepath"
	"testing"
)

// TestGrantSocketAfterSwap is the attack on the receivers, driven
// deterministically: between moat opening the read-write grant and
// binding its socket there, another sandbox renames the grant away and
// puts a symlink to a host directory in its place, where a file with the
// socket's name waits. The host file keeps its mode, nothing appears in
// the host directory, and the socket lands in the grant moat opened. The
// control, without the swap: the socket is in the grant with mode 0777.
func TestGrantSocketAfterSwap(t *testing.T) {
	dir := t.TempDir()
	ws := filepath.Join(dir, "ws")
	host := filepath.Join(dir, "host")
	for _, d := range []string{ws, host} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	const name = ".moat-measure-test.sock"
	gs, err := bindInGrant(ws, name, "unix")
	if err != nil {
		t.Fatalf("control: %v", err)
	}
	st, err := os.Lstat(filepath.Join(ws, name))
	if err != nil || st.Mode()&os.ModeSocket == 0 || st.Mode().Perm() != 0o777 {
		t.Fatalf("control: socket %v, %v; want a 0777 socket in the grant", st, err)
	}
	gs.close()
	if _, err := os.Lstat(filepath.Join(ws, name)); !os.IsNotExist(err) {
		t.Fatalf("control: socket left after close: %v", err)
	}

	target := filepath.Join(host, name)
	if err := os.WriteFile(target, []byte("host file"), 0o600); err != nil {
		t.Fatal(err)
	}
	testAfterOpen = func() {
		if err := os.Rename(ws, ws+".moved"); err != nil {
			t.Error(err)
		}
		if err := os.Symlink(host, ws); err != nil {
			t.Error(err)
		}
	}
	defer func() { testAfterOpen = nil }()
	os.Remove(target) // the name must be free for the bind to be tried
	gs, err = bindInGrant(ws, name, "unixgram")
	if err != nil {
		t.Fatalf("bind after the swap: %v", err)
	}
	defer gs.close()
	if _, err := os.Lstat(filepath.Join(ws+".moved", name)); err != nil {
		t.Errorf("the socket is not in the grant moat opened: %v", err)
	}
	if ents, _ := os.ReadDir(host); len(ents) != 0 {
		t.Errorf("the host directory behind the symlink got %v", ents)
	}
}

// TestGrantSocketChmodsOnlyItsOwn: a name already taken by a file (a
// host file hard-linked or planted there) is never chmodded: the bind
// fails and the file keeps its mode.
func TestGrantSocketChmodsOnlyItsOwn(t *testing.T) {
	ws := t.TempDir()
	const name = ".moat-measure-test.sock"
	p := filepath.Join(ws, name)
	if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := bindInGrant(ws, name, "unix"); err == nil {
		t.Fatal("bound over an existing file")
	}
	if st, _ := os.Stat(p); st.Mode().Perm() != 0o600 {
		t.Errorf("the file's mode changed to %v", st.Mode())
	}
}
