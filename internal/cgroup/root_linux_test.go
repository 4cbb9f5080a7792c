package cgroup

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/testenv"
)

// mountV2Private mounts a cgroup2 file system (the host's one v2
// hierarchy) on a temporary directory in a private mount namespace of
// this test's thread, which stays locked to it and ends with the test.
func mountV2Private(t *testing.T) string {
	t.Helper()
	testenv.NeedRoot(t)
	dir := t.TempDir()
	runtime.LockOSThread() // never unlocked: the thread ends with the test
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		t.Fatalf("unshare(CLONE_NEWNS): %v", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		t.Fatalf("making / private: %v", err)
	}
	err := unix.Mount("none", dir, "cgroup2", 0, "")
	testenv.Need(t, err == nil, fmt.Sprintf("mount -t cgroup2 none %s: %v", dir, err))
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) }) // before TempDir's removal
	return dir
}

// TestRootV2RealFS runs the cgroup v2 code on the kernel's cgroup2 file
// system, mounted privately. On a host whose memory and pids controllers
// are bound to cgroup v1 (this project's CI), the v2 hierarchy has
// neither: the exact "not available" refusal is checked, and the control
// is that a v2 cgroup is made, locked, a process placed in it, and removed.
// Where v2 has them, the limits are checked as written.
func TestRootV2RealFS(t *testing.T) {
	root := mountV2Private(t)
	h := v2Host(root, "/", 0)
	have := strings.Fields(mustRead(t, filepath.Join(root, "cgroup.controllers")))
	t.Logf("cgroup v2 root controllers: %q", have)
	name := fmt.Sprintf("moat-test-%d", os.Getpid())
	dir := filepath.Join(root, name)
	g, st := Create(OS{}, h, name, Limits{Memory: 64 << 20, Pids: 64}, nil)
	for _, c := range []struct {
		ctrl string
		got  bool
		file string
		want string
	}{{Memory, st.Memory, "memory.max", strconv.Itoa(64 << 20)}, {Pids, st.Pids, "pids.max", "64"}} {
		if slices.Contains(have, c.ctrl) {
			if !c.got || mustRead(t, filepath.Join(dir, c.file)) != c.want {
				t.Errorf("%s available on v2: status %+v, want %s = %s", c.ctrl, st, c.file, c.want)
			}
			continue
		}
		want := fmt.Sprintf("%s: the %s controller is not available: no cgroup v1 hierarchy has it and %s/cgroup.controllers lists only %q", c.ctrl, c.ctrl, root, strings.Join(have, " "))
		if c.got || !strings.Contains(st.Detail, want) {
			t.Errorf("%s absent from v2: status %+v, want the refusal %q", c.ctrl, st, want)
		}
	}
	if g != nil {
		g.Remove(nil)
	} else if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("nothing enforced, yet %s: %v", dir, err)
	}

	// Control: the real file-writing path makes a v2 cgroup, holds its
	// lock, places a process in it, and removes it once empty.
	g = &Group{fsys: OS{}, locks: map[string]*os.File{}}
	if err := g.mkdir(dir, nil); err != nil {
		t.Fatal(err)
	}
	defer g.Remove(nil)
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	if err := g.Add(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	pc := mustRead(t, fmt.Sprintf("/proc/%d/cgroup", cmd.Process.Pid))
	if !slices.Contains(strings.Split(pc, "\n"), "0::/"+name) {
		t.Errorf("/proc/<pid>/cgroup: %q, want 0::/%s", pc, name)
	}
	// A live, locked cgroup survives a sweep with no grace at all.
	if got := Sweep(OS{}, []string{root}, time.Now().Add(time.Hour), 0); slices.Contains(got, dir) {
		t.Errorf("swept a live cgroup: %v", got)
	}
	if err := OS.Rmdir(OS{}, dir); !errors.Is(err, syscall.EBUSY) {
		t.Errorf("rmdir of a cgroup with a process: %v, want EBUSY", err)
	}
	cmd.Process.Kill()
	cmd.Wait()
	if err := g.Remove(nil); err != nil {
		t.Fatal(err)
	}
	notExist(t, dir)
}

// TestRootV2RealEnable: the delegated-scope steps on the kernel: a
// populated non-root v2 cgroup cannot enable a controller for its
// children (EBUSY, the rule the fake copies); after its processes are
// moved to moat-leaf it can, and a child then lists the controller. It
// needs one controller in the v2 root (hugetlb on this project's CI host);
// it enables it in the root for the test and disables it afterwards.
func TestRootV2RealEnable(t *testing.T) {
	root := mountV2Private(t)
	have := strings.Fields(mustRead(t, filepath.Join(root, "cgroup.controllers")))
	testenv.Need(t, len(have) > 0, "the cgroup v2 root has no controller at all")
	ctrl := have[0]
	rootSC := filepath.Join(root, "cgroup.subtree_control")
	g := &Group{fsys: OS{}, locks: map[string]*os.File{}}
	if !slices.Contains(strings.Fields(mustRead(t, rootSC)), ctrl) {
		if err := g.enable(root, ctrl, false); err != nil {
			t.Fatalf("enabling %s in the v2 root: %v", ctrl, err)
		}
		t.Cleanup(func() { OS.WriteFile(OS{}, rootSC, []byte("-"+ctrl)) })
	}
	scope := filepath.Join(root, fmt.Sprintf("moat-test-scope-%d", os.Getpid()))
	if err := g.mkdir(scope, nil); err != nil {
		t.Fatal(err)
	}
	defer func() {
		OS.Rmdir(OS{}, filepath.Join(scope, LeafName))
		g.Remove(nil)
	}()
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	if err := g.Add(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	sc := filepath.Join(scope, "cgroup.subtree_control")
	if err := (OS{}).WriteFile(sc, []byte("+"+ctrl)); !errors.Is(err, syscall.EBUSY) {
		t.Fatalf("enabling %s in a populated cgroup: %v, want EBUSY", ctrl, err)
	}
	if err := g.enable(scope, ctrl, true); err != nil {
		t.Fatalf("enable with the move to %s: %v", LeafName, err)
	}
	if got := mustRead(t, filepath.Join(scope, LeafName, "cgroup.procs")); got != strconv.Itoa(cmd.Process.Pid) {
		t.Errorf("leaf procs %q, want the process", got)
	}
	child := filepath.Join(scope, "moat-test-child")
	if err := g.mkdir(child, nil); err != nil {
		t.Fatal(err)
	}
	if got := strings.Fields(mustRead(t, filepath.Join(child, "cgroup.controllers"))); !slices.Contains(got, ctrl) {
		t.Errorf("child controllers %q, want %s", got, ctrl)
	}
	cmd.Process.Kill()
	cmd.Wait()
	if err := (OS{}).Rmdir(filepath.Join(scope, LeafName)); err != nil {
		t.Fatal(err)
	}
	if err := g.Remove(nil); err != nil {
		t.Fatal(err)
	}
	notExist(t, scope)
}
