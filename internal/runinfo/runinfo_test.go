package runinfo

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func sample() Info {
	return Info{RunID: "r1", Journal: "/j", PublicKeyPEM: "-----BEGIN PUBLIC KEY-----\n", KeyID: "k", HostPID: 1, Backend: "native"}
}

// A symlink planted at the run-info path is replaced, not followed: the
// file it points to stays untouched and the run info is at the path.
func TestWriteDoesNotFollowPlantedSymlink(t *testing.T) {
	out := t.TempDir()
	victim := filepath.Join(t.TempDir(), "authorized_keys")
	os.WriteFile(victim, []byte("ssh-ed25519 AAAA host\n"), 0o600)
	p := filepath.Join(out, "run.json")
	if err := os.Symlink(victim, p); err != nil {
		t.Fatal(err)
	}
	tg, err := Open(p, Grants{ReadWrite: []string{t.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	if err := tg.Write(sample()); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "ssh-ed25519 AAAA host\n" {
		t.Errorf("the symlink's target was overwritten: %q", b)
	}
	ri, _, err := Read(p)
	if err != nil || ri.RunID != "r1" {
		t.Errorf("run info at the path: %+v %v", ri, err)
	}
	if fi, err := os.Lstat(p); err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != Mode {
		t.Errorf("run info: %v %v, want a regular file with mode %o", fi.Mode(), err, Mode)
	}
}

// A path inside a grant is refused however it is spelled; outside every
// grant it is accepted.
func TestRefusedInsideGrant(t *testing.T) {
	base := t.TempDir()
	ws := filepath.Join(base, "workspace")
	ro := filepath.Join(base, "data")
	outside := filepath.Join(base, "outside")
	for _, d := range []string{filepath.Join(ws, "sub"), ro, outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cfg := filepath.Join(base, "config")
	os.WriteFile(cfg, []byte("x"), 0o644)
	// A host symlink that leads into the workspace.
	link := filepath.Join(outside, "to-ws")
	if err := os.Symlink(filepath.Join(ws, "sub"), link); err != nil {
		t.Fatal(err)
	}
	// A symlink to a grant given as the grant (as /bin → usr/bin).
	roLink := filepath.Join(base, "data-link")
	os.Symlink(ro, roLink)
	g := Grants{ReadOnly: []string{roLink, cfg}, ReadWrite: []string{ws}}
	for _, tc := range []struct {
		name, path, grant, kind string
	}{
		{"in the read_write grant", filepath.Join(ws, "run.json"), ws, "read_write"},
		{"below it", filepath.Join(ws, "sub", "run.json"), ws, "read_write"},
		{"spelled with ..", filepath.Join(outside, "..", "workspace", "run.json"), ws, "read_write"},
		{"through a host symlink", filepath.Join(link, "run.json"), ws, "read_write"},
		{"in a symlinked read_only grant", filepath.Join(ro, "run.json"), roLink, "read_only"},
		{"the granted file", cfg, cfg, "read_only"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if strings.Contains(tc.name, "through a host symlink") {
				// the parent of the path is the symlink itself: O_NOFOLLOW
				// refuses it; one level deeper the inode walk refuses it.
				if _, err := Open(tc.path, g); err == nil {
					t.Fatalf("accepted")
				}
				os.MkdirAll(filepath.Join(ws, "sub", "deeper"), 0o755)
				tc.path = filepath.Join(link, "deeper", "run.json")
			}
			_, err := Open(tc.path, g)
			var ge *GrantError
			if !errors.As(err, &ge) {
				t.Fatalf("Open(%s): got %v, want a GrantError", tc.path, err)
			}
			if ge.Grant != tc.grant || ge.Kind != tc.kind || !strings.Contains(err.Error(), tc.grant) {
				t.Errorf("got %v, want it to name the %s grant %s", err, tc.kind, tc.grant)
			}
		})
	}
	// Control: outside every grant it is accepted and written.
	p := filepath.Join(outside, "run.json")
	tg, err := Open(p, g)
	if err != nil {
		t.Fatalf("outside the grants: %v", err)
	}
	defer tg.Close()
	if err := tg.Write(sample()); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Read(p); err != nil {
		t.Error(err)
	}
}

// The directory is pinned at Open: renaming the path's directory away and
// planting a symlink in its place does not redirect the write.
func TestWriteGoesToThePinnedDirectory(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "out")
	os.Mkdir(dir, 0o755)
	tg, err := Open(filepath.Join(dir, "run.json"), Grants{})
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	elsewhere := t.TempDir()
	if err := os.Rename(dir, filepath.Join(base, "moved")); err != nil {
		t.Fatal(err)
	}
	os.Symlink(elsewhere, dir)
	if err := tg.Write(sample()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(elsewhere, "run.json")); err == nil {
		t.Errorf("the write followed the planted directory symlink")
	}
	if _, _, err := Read(filepath.Join(base, "moved", "run.json")); err != nil {
		t.Errorf("the pinned directory does not hold the run info: %v", err)
	}
}

func TestDecode(t *testing.T) {
	for _, bad := range []string{"", "{", "[]", `{"run_id":"x"}`, `{"public_key_pem":"k"}`} {
		if _, err := Decode([]byte(bad)); err == nil {
			t.Errorf("Decode(%q): no error", bad)
		}
	}
	if _, err := Decode([]byte(`{"run_id":"x","public_key_pem":"k"}`)); err != nil {
		t.Error(err)
	}
}

func TestOpenRefusesNonFilePaths(t *testing.T) {
	d := t.TempDir()
	for _, p := range []string{"/", d + "/", filepath.Join(d, "missing", "run.json")} {
		if _, err := Open(p, Grants{}); err == nil {
			t.Errorf("Open(%q): no error", p)
		}
	}
}

// FuzzDecode: any input decodes or is refused with an error, never a panic;
// what decodes names a run and a key.
func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"run_id":"r","public_key_pem":"k","properties":{}}`))
	f.Add([]byte(`{"run_id":1}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		ri, err := Decode(b)
		if err == nil && (ri.RunID == "" || ri.PublicKeyPEM == "") {
			t.Errorf("decoded without run_id or key: %+v", ri)
		}
	})
}
