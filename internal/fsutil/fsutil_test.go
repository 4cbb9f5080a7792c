package fsutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

func TestSHA256AndCopy(t *testing.T) {
	dir := t.TempDir()
	a := filepath.Join(dir, "a")
	os.WriteFile(a, []byte("abc"), 0o600)
	got, err := SHA256File(a)
	if want := "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"; err != nil || got != want {
		t.Fatalf("SHA256File: got %q %v, want %q", got, err, want)
	}
	b := filepath.Join(dir, "b")
	if err := CopyFile(a, b, 0o640); err != nil {
		t.Fatal(err)
	}
	if got2, _ := SHA256File(b); got2 != got {
		t.Errorf("copy differs")
	}
	if fi, _ := os.Stat(b); fi.Mode().Perm() != 0o640 {
		t.Errorf("mode: got %v, want 0640", fi.Mode().Perm())
	}
	if _, err := SHA256File(filepath.Join(dir, "missing")); err == nil {
		t.Errorf("missing file: no error")
	}
}

func TestProcStart(t *testing.T) {
	if ProcStart(os.Getpid()) == 0 {
		t.Fatalf("own process: start time 0")
	}
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	if got := ProcStart(cmd.Process.Pid); got != 0 {
		t.Errorf("an exited process: got start %d, want 0", got)
	}
}
