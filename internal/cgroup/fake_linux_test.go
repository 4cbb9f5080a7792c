package cgroup

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// fakeFS is a cgroupfs made of plain files in a temporary directory, with
// the kernel's rules that matter here: a new cgroup gets the interface
// files of the controllers its parent enables; a controller can be enabled
// for children only if the cgroup has it; a non-root v2 cgroup with
// processes cannot enable controllers (EBUSY) and one with controllers
// enabled for children cannot take processes (EBUSY); a cgroup with
// processes or children cannot be removed (EBUSY); writing a pid to
// cgroup.procs moves it out of every other cgroup of the hierarchy.
type fakeFS struct {
	OS
	roots map[string]string // mount point -> "" (v2) or the v1 controller
	uids  map[string]int    // owner of a path; 0 when absent
	swap  bool              // v2 memory cgroups get memory.swap.max
}

func newFake(t *testing.T) (*fakeFS, string) {
	return &fakeFS{roots: map[string]string{}, uids: map[string]int{}}, t.TempDir()
}

// mountV2 makes a v2 root at dir with the given controllers.
func (f *fakeFS) mountV2(t *testing.T, dir string, ctrls ...string) {
	t.Helper()
	f.roots[dir] = ""
	if err := f.cgroupFiles(dir, ctrls, true); err != nil {
		t.Fatal(err)
	}
}

// mountV1 makes a v1 hierarchy root for ctrl.
func (f *fakeFS) mountV1(t *testing.T, dir, ctrl string) {
	t.Helper()
	f.roots[dir] = ctrl
	if err := f.cgroupFiles(dir, []string{ctrl}, false); err != nil {
		t.Fatal(err)
	}
}

// mkcg makes a cgroup by hand (as the host's init system would).
func (f *fakeFS) mkcg(t *testing.T, dir string) {
	t.Helper()
	if err := f.Mkdir(dir); err != nil {
		t.Fatal(err)
	}
}

func (f *fakeFS) cgroupFiles(dir string, ctrls []string, v2 bool) error {
	files := map[string]string{"cgroup.procs": ""}
	if v2 {
		files["cgroup.controllers"] = strings.Join(ctrls, " ")
		files["cgroup.subtree_control"] = ""
		for _, c := range ctrls {
			switch c {
			case Memory:
				files["memory.max"] = "max"
				files["memory.events"] = "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n"
				if f.swap {
					files["memory.swap.max"] = "max"
				}
			case Pids:
				files["pids.max"] = "max"
			}
		}
	} else {
		switch ctrls[0] {
		case Memory:
			files["memory.limit_in_bytes"] = "9223372036854771712"
			files["memory.oom_control"] = "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n"
		case Pids:
			files["pids.max"] = "max"
		}
	}
	os.MkdirAll(dir, 0o755)
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// root is the hierarchy root of p, and whether it is v2 and its v1
// controller.
func (f *fakeFS) root(p string) (root string, v2 bool, ctrl string) {
	for r, c := range f.roots {
		if p == r || strings.HasPrefix(p, r+"/") {
			return r, c == "", c
		}
	}
	return "", false, ""
}

func (f *fakeFS) read(p string) string {
	b, _ := os.ReadFile(p)
	return strings.TrimSpace(string(b))
}

func (f *fakeFS) Mkdir(dir string) error {
	if err := f.OS.Mkdir(dir); err != nil {
		return err
	}
	root, v2, ctrl := f.root(dir)
	if root == "" {
		return nil
	}
	ctrls := []string{ctrl}
	if v2 {
		ctrls = strings.Fields(f.read(filepath.Join(filepath.Dir(dir), "cgroup.subtree_control")))
	}
	return f.cgroupFiles(dir, ctrls, v2)
}

func (f *fakeFS) Rmdir(dir string) error {
	if f.read(filepath.Join(dir, "cgroup.procs")) != "" {
		return &os.PathError{Op: "rmdir", Path: dir, Err: syscall.EBUSY}
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if e.IsDir() {
			return &os.PathError{Op: "rmdir", Path: dir, Err: syscall.EBUSY}
		}
	}
	return os.RemoveAll(dir)
}

func (f *fakeFS) WriteFile(name string, data []byte) error {
	dir, base := filepath.Dir(name), filepath.Base(name)
	root, v2, _ := f.root(dir)
	busy := &os.PathError{Op: "write", Path: name, Err: syscall.EBUSY}
	switch {
	case base == "cgroup.subtree_control" && v2:
		have := strings.Fields(f.read(filepath.Join(dir, "cgroup.controllers")))
		on := strings.Fields(f.read(name))
		for _, w := range strings.Fields(string(data)) {
			c, add := strings.CutPrefix(w, "+")
			if !add || !slices.Contains(have, c) {
				return &os.PathError{Op: "write", Path: name, Err: syscall.EINVAL}
			}
			if dir != root && f.read(filepath.Join(dir, "cgroup.procs")) != "" {
				return busy
			}
			if !slices.Contains(on, c) {
				on = append(on, c)
			}
		}
		data = []byte(strings.Join(on, " "))
	case base == "cgroup.procs":
		pid := strings.TrimSpace(string(data))
		if v2 && dir != root && f.read(filepath.Join(dir, "cgroup.subtree_control")) != "" {
			return busy
		}
		filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() && d.Name() == "cgroup.procs" {
				rest := slices.DeleteFunc(strings.Fields(f.read(p)), func(s string) bool { return s == pid })
				os.WriteFile(p, []byte(strings.Join(rest, "\n")), 0o644)
			}
			return nil
		})
		data = []byte(strings.TrimSpace(f.read(name) + "\n" + pid))
	}
	return f.OS.WriteFile(name, data)
}

func (f *fakeFS) Stat(name string) (Info, error) {
	st, err := f.OS.Stat(name)
	if err != nil {
		return st, err
	}
	st.UID = f.uids[name]
	return st, nil
}

// own gives path (and, with files, its interface files) to uid.
func (f *fakeFS) own(dir string, uid int, files ...string) {
	f.uids[dir] = uid
	for _, n := range files {
		f.uids[filepath.Join(dir, n)] = uid
	}
}

func mustRead(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func notExist(t *testing.T, p string) {
	t.Helper()
	if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s: want it absent, got %v", p, err)
	}
}
