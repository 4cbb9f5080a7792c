package grants

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/reexec/reexectest"
	"github.com/moat-sandbox/moat/internal/testenv"
)

var openTreeHelper = reexectest.Helper("grants-open-tree", func(args []string) int {
	if len(args) != 1 {
		return 2
	}
	return openTreeMain(args[0])
})

func TestMain(m *testing.M) { reexectest.Main(m, openTreeHelper) }

// openTreeMain runs in a new user and mount namespace: it tries open_tree
// on fd 3 (opened by the parent, in the parent's mount namespace) and on
// the same path opened here, and prints both results.
func openTreeMain(path string) int {
	try := func(fd int) string {
		t, err := unix.OpenTree(fd, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH)
		if err != nil {
			return unix.ErrnoName(err.(syscall.Errno))
		}
		unix.Close(t)
		return "ok"
	}
	own, err := unix.Open(path, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		fmt.Println("open:", err)
		return 1
	}
	fmt.Printf("inherited=%s own=%s\n", try(3), try(own))
	return 0
}

// TestOpenTreeAcrossNamespaces settles the design question the escapes
// issue asked first: open_tree(2) refuses a descriptor opened in another
// mount namespace (EINVAL), while a descriptor opened in the cloning
// namespace itself works. Hence the plan is made in the supervisor and
// each grant is opened again, without following symlinks and checked
// for identity, in the namespace that clones it.
func TestOpenTreeAcrossNamespaces(t *testing.T) {
	_, err := os.Stat("/proc/self/ns/user")
	testenv.Need(t, err == nil, "user namespaces")
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	self, _ := os.Executable()
	cmd := exec.Command(self, openTreeHelper.Name, dir)
	cmd.ExtraFiles = []*os.File{f}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}},
	}
	out, err := cmd.CombinedOutput()
	testenv.Need(t, !errors.Is(err, syscall.EPERM), "a user namespace could not be made here")
	if err != nil {
		t.Fatalf("child: %v: %s", err, out)
	}
	if got := strings.TrimSpace(string(out)); got != "inherited=EINVAL own=ok" {
		t.Errorf("got %q, want inherited=EINVAL own=ok", got)
	}
}
