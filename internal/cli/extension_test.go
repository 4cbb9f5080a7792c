package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/boundary"
)

// The lean binary (this test binary, with no Extension) hands every
// kubernetes command to moat-kubernetes beside it; there is none beside
// a test binary, so each is refused with exit 125 naming what is missing,
// where moat looked and how to build it. Controls: policy check of the
// same kubernetes policy only parses, and succeeds; another backend is
// not handed off.
func TestHandOffKubernetes(t *testing.T) {
	t.Setenv("MOAT_STATE_DIR", t.TempDir())
	if _, err := boundary.Lookup("kubernetes"); err == nil {
		t.Fatal("the lean binary has a kubernetes backend")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	self, _ = filepath.EvalSymlinks(self)
	want := filepath.Join(filepath.Dir(self), "moat-kubernetes")
	if _, err := os.Lstat(want); err == nil {
		t.Fatalf("%s exists: the refusals below would exec it", want)
	}
	pol := filepath.Join(t.TempDir(), "k.yaml")
	if err := os.WriteFile(pol, []byte("version: 1\nbackend: kubernetes\nkubernetes:\n  image: moat.local/moat:1\naudit:\n  dir: "+t.TempDir()+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"run", "--backend", "kubernetes", "true"},
		{"run", "--policy", pol, "true"},
		{"sandbox", "create", "k", "--policy", pol},
		{"sandbox", "create", "k", "--policy", pol, "--backend", "kubernetes"},
		{"policy", "check", "--explain", pol},
		{"evidence", "run", "--out", filepath.Join(t.TempDir(), "ev"), "--backend", "kubernetes"},
		{"evidence", "run", "--out", filepath.Join(t.TempDir(), "ev"), "--backend", "kubernetes", "--binary", self},
		{"conformance", "run", "--backend", "kubernetes"},
		{"conformance", "run", "--backend", "kubernetes", "--binary", self},
	} {
		out, code := runCLI(t, args...)
		if code != ExitRefused || !strings.Contains(out, "there is no "+want) || !strings.Contains(out, "go build -o "+want+" github.com/moat-sandbox/moat/cmd/moat-kubernetes") {
			t.Errorf("%v: exit %d, output %q; want 125 naming %s and how to build it", args, code, out, want)
		}
	}
	// A kubernetes helper's name, through Main.
	if code := Main([]string{kubernetesHelperPrefix + "pause"}); code != ExitRefused {
		t.Errorf("kubernetes helper: exit %d, want 125", code)
	}
	// Controls.
	if out, code := runCLI(t, "policy", "check", pol); code != 0 || !strings.Contains(out, "image: moat.local/moat:1") {
		t.Errorf("policy check of a kubernetes policy: exit %d, %q; want 0 and the policy", code, out)
	}
	if out, code := runCLI(t, "run", "--backend", "nosuch", "true"); code != ExitRefused || strings.Contains(out, "moat-kubernetes") {
		t.Errorf("unknown backend: exit %d, %q; want 125 without a hand-off", code, out)
	}
}

// checkHandOff refuses what moat must not exec as itself; control: a
// regular file of the right owner and mode, in a directory alike, passes.
func TestCheckHandOff(t *testing.T) {
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	bin := filepath.Join(dir, "moat-kubernetes")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.Chmod(bin, 0o755) // past the umask
	euid := os.Geteuid()
	if err := checkHandOff(bin, euid); err != nil {
		t.Fatalf("control: %v", err)
	}
	refused := func(name, path string, euid int, want string) {
		t.Helper()
		if err := checkHandOff(path, euid); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error with %q", name, err, want)
		}
	}
	refused("missing", bin+".absent", euid, "there is no")
	os.Chmod(bin, 0o775)
	refused("group-writable", bin, euid, "writable by group or others (mode 0775")
	os.Chmod(bin, 0o757)
	refused("world-writable", bin, euid, "writable by group or others")
	os.Chmod(bin, 0o755)
	os.Chmod(dir, 0o775)
	refused("group-writable directory", bin, euid, "its directory "+dir+" is writable")
	os.Chmod(dir, 0o755)
	link := filepath.Join(dir, "link")
	if err := os.Symlink(bin, link); err != nil {
		t.Fatal(err)
	}
	refused("symlink", link, euid, "not a regular file")
	sub := filepath.Join(dir, "sub")
	os.Mkdir(sub, 0o755)
	refused("directory", sub, euid, "not a regular file")
	// Another owner: as root, a file of uid 65534; otherwise our own file
	// checked for another euid.
	other := euid + 1
	if euid == 0 {
		if err := os.Chown(bin, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		other = 0
	}
	refused("another owner", bin, other, "is owned by uid")
}
