package sandbox

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/boundary"
)

func TestValidateName(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"a", true},
		{"0", true},
		{"dev-box_2.x", true},
		{strings.Repeat("a", 63), true},
		{"", false},
		{strings.Repeat("a", 64), false},
		{"Dev", false},
		{".hidden", false},
		{"-flag", false},
		{"_x", false},
		{"a..b", false},
		{"a/b", false},
		{"../etc", false},
		{"a b", false},
		{"a\n", false},
		{"café", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateName(tc.name)
			if (err == nil) != tc.ok {
				t.Fatalf("ValidateName(%q) = %v, want ok=%v", tc.name, err, tc.ok)
			}
			if err != nil && !strings.Contains(err.Error(), "invalid sandbox name") {
				t.Fatalf("error %q does not say the name is invalid", err)
			}
		})
	}
}

func TestStateDir(t *testing.T) {
	t.Run("MOAT_STATE_DIR, made absolute", func(t *testing.T) {
		t.Chdir(t.TempDir())
		t.Setenv("MOAT_STATE_DIR", "rel/state")
		got, err := StateDir()
		wd, _ := os.Getwd()
		if err != nil || got != filepath.Join(wd, "rel", "state") {
			t.Fatalf("got %q, %v; want %q", got, err, filepath.Join(wd, "rel", "state"))
		}
	})
	t.Run("default", func(t *testing.T) {
		t.Setenv("MOAT_STATE_DIR", "")
		t.Setenv("XDG_STATE_HOME", "/xdg")
		t.Setenv("HOME", "/home/u")
		got, err := StateDir()
		want := "/xdg/moat"
		if os.Geteuid() == 0 {
			want = "/var/lib/moat" // root's is fixed, whatever the environment says
		}
		if err != nil || got != want {
			t.Fatalf("got %q, %v; want %q", got, err, want)
		}
	})
	if os.Geteuid() != 0 {
		t.Run("relative XDG_STATE_HOME is ignored", func(t *testing.T) {
			t.Setenv("MOAT_STATE_DIR", "")
			t.Setenv("XDG_STATE_HOME", "xdg")
			t.Setenv("HOME", "/home/u")
			if got, err := StateDir(); err != nil || got != "/home/u/.local/state/moat" {
				t.Fatalf("got %q, %v; want /home/u/.local/state/moat", got, err)
			}
		})
	}
}

// testStore is a store in a fresh MOAT_STATE_DIR.
func testStore(t *testing.T) *store {
	t.Helper()
	t.Setenv("MOAT_STATE_DIR", t.TempDir())
	s, err := openStore()
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(s.dir, "sandboxes")); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("sandboxes dir: %v %v, want a 0700 directory", fi, err)
	}
	return s
}

func TestStoreRead(t *testing.T) {
	s := testStore(t)
	if _, err := s.read("absent"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("absent: got %v, want ErrNotFound", err)
	} else if nf, ok := errors.AsType[*NotFoundError](err); !ok || nf.Name != "absent" {
		t.Fatalf("absent: got %#v, want a *NotFoundError naming it", err)
	}

	// A sandbox directory whose supervisor has not written state yet.
	if err := os.MkdirAll(s.sandboxDir("young"), 0o700); err != nil {
		t.Fatal(err)
	}
	if st, err := s.read("young"); err != nil || st.Name != "young" || st.Phase != boundary.PhaseProvisioning {
		t.Fatalf("young: got %+v, %v; want Provisioning", st, err)
	}

	// Written and read back: every field survives.
	want := &State{Name: "box", Phase: boundary.PhaseReady, Backend: "native", RunID: "r1",
		Properties: boundary.Properties{FilesystemConfinement: boundary.EnforcedProperty{Enforced: true, Mechanism: "landlock"}},
		Created:    time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC), SupervisorPID: 42, SupervisorStart: 7, BrokerPort: 8080,
		Processes: map[string]int{"p1": 100}}
	dir := s.sandboxDir("box")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := writeState(dir, want); err != nil {
		t.Fatal(err)
	}
	got, err := s.read("box")
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("round trip: got %+v, %v; want %+v", got, err, want)
	}
	if fi, err := os.Stat(filepath.Join(dir, stateFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("state.json: %v %v, want mode 0600", fi, err)
	}

	// Corrupt state is an error that says so, not a zero State.
	if err := os.WriteFile(filepath.Join(dir, stateFile), []byte(`{"name":`), 0o600); err != nil {
		t.Fatal(err)
	}
	if st, err := s.read("box"); err == nil || !strings.Contains(err.Error(), "corrupt") {
		t.Fatalf("corrupt: got %+v, %v; want an error saying corrupt", st, err)
	}
}

// writeState replaces a symlink at state.json instead of writing through
// it; the control is that it does write the file where no link is.
func TestWriteStateReplacesSymlink(t *testing.T) {
	dir := t.TempDir()
	outside := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(outside, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dir, stateFile)); err != nil {
		t.Fatal(err)
	}
	if err := writeState(dir, &State{Name: "x", Phase: boundary.PhaseReady}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(outside); string(b) != "keep" {
		t.Fatalf("the link's target was written: %q", b)
	}
	fi, err := os.Lstat(filepath.Join(dir, stateFile))
	if err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("state.json: %v %v, want a regular file in place of the link", fi, err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, stateFile)); !strings.Contains(string(b), `"phase": "Ready"`) {
		t.Fatalf("state.json holds %q", b)
	}
}

func TestAlive(t *testing.T) {
	me := os.Getpid()
	start := procStart(me)
	if start == 0 {
		t.Fatal("procStart of this process is 0")
	}
	for _, tc := range []struct {
		name string
		st   State
		want bool
	}{
		{"this process", State{SupervisorPID: me, SupervisorStart: start}, true},
		{"pid reused (another start time)", State{SupervisorPID: me, SupervisorStart: start + 1}, false},
		{"no start time recorded", State{SupervisorPID: me}, false},
		{"no pid", State{SupervisorStart: start}, false},
	} {
		if got := tc.st.alive(); got != tc.want {
			t.Errorf("%s: alive() = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// The store's lock excludes a second holder until it is released.
func TestStoreLock(t *testing.T) {
	s := testStore(t)
	unlock, err := s.lock()
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan func(), 1)
	go func() {
		u, err := s.lock()
		if err != nil {
			t.Error(err)
			u = func() {}
		}
		got <- u
	}()
	select {
	case u := <-got:
		u()
		t.Fatal("a second lock was taken while the first was held")
	case <-time.After(100 * time.Millisecond):
	}
	unlock()
	select {
	case u := <-got:
		u()
	case <-time.After(10 * time.Second):
		t.Fatal("the second lock was not taken after the first was released")
	}
}
