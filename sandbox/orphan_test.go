package sandbox

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestWatchStateDir: a supervisor's watch fires when its state directory
// or its control socket is removed or replaced, and (the control, in the
// same setup) not while both stay.
func TestWatchStateDir(t *testing.T) {
	const every = 5 * time.Millisecond
	setup := func(t *testing.T) (dir, sock string) {
		dir = filepath.Join(t.TempDir(), "w")
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		sock = filepath.Join(dir, controlSock)
		ln, err := net.Listen("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		return dir, sock
	}
	fired := func(c <-chan struct{}, within time.Duration) bool {
		select {
		case <-c:
			return true
		case <-time.After(within):
			return false
		}
	}
	for _, tc := range []struct {
		name  string
		act   func(t *testing.T, dir, sock string)
		fires bool
	}{
		{"untouched", func(*testing.T, string, string) {}, false},
		{"state file rewritten", func(t *testing.T, dir, _ string) {
			if err := writeState(dir, &State{Name: "w"}); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"directory removed", func(t *testing.T, dir, _ string) {
			if err := os.RemoveAll(dir); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"directory replaced", func(t *testing.T, dir, sock string) {
			if err := os.Rename(dir, dir+".old"); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(sock, nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"socket removed", func(t *testing.T, _, sock string) {
			if err := os.Remove(sock); err != nil {
				t.Fatal(err)
			}
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, sock := setup(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			gone := watchStateDir(ctx, dir, sock, every)
			if fired(gone, 20*every) {
				t.Fatal("fired before anything changed")
			}
			tc.act(t, dir, sock)
			within := 10 * time.Second // returns as soon as it fires
			if !tc.fires {
				within = 20 * every
			}
			if got := fired(gone, within); got != tc.fires {
				t.Errorf("fired: got %v, want %v", got, tc.fires)
			}
		})
	}
	t.Run("nothing to watch", func(t *testing.T) {
		if !fired(watchStateDir(context.Background(), filepath.Join(t.TempDir(), "absent"), "x", every), time.Second) {
			t.Error("a missing directory is not reported at once")
		}
	})
}
