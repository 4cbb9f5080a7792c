//go:build amd64 || arm64

package seccomp

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/testenv"
)

// The execveat rule in rules_linux.go rests on two kernel facts, checked
// here so that the reason fails loudly if a kernel changes them: Landlock's
// execute right is not checked for a memfd (so execveat of one runs code
// that no rule allowed), and execve("/proc/self/fd/N") runs the same
// memfd, so refusing execveat alone would close nothing.
//
// Each child applies a Landlock ruleset that handles only
// LANDLOCK_ACCESS_FS_EXECUTE and grants it below the library directories
// (for the dynamic loader), installs moat's filter, and replaces itself
// with a copy of this test binary, by one method. The copy prints
// execOKLine.

const (
	caseLandlockExec = "landlock-exec"
	caseExecOK       = "exec-ok"
	envExecMethod    = "MOAT_SECCOMP_TEST_EXEC"
	envExecLandlock  = "MOAT_SECCOMP_TEST_LANDLOCK"
	execOKLine       = "exec ok"
)

func init() {
	extraChildMains[caseLandlockExec] = landlockExecMain
	extraChildMains[caseExecOK] = func() int { fmt.Println(execOKLine); return 0 }
}

// execDirs get LANDLOCK_ACCESS_FS_EXECUTE: where the dynamic loader of a
// cgo-linked test binary lives. The test's own directory is in none.
var execDirs = []string{"/usr", "/lib", "/lib64", "/lib32"}

func landlockABI() int {
	v, _, e := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_VERSION)
	if e != 0 {
		return 0
	}
	return int(v)
}

// restrictExecute applies, to the calling thread, a ruleset under which
// only files below execDirs may be executed.
func restrictExecute() error {
	attr := unix.LandlockRulesetAttr{Handled_access_fs: unix.LANDLOCK_ACCESS_FS_EXECUTE}
	// Only the first field: every ABI knows it.
	rfd, _, e := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, uintptr(unsafe.Pointer(&attr)), 8, 0)
	if e != 0 {
		return fmt.Errorf("landlock_create_ruleset: %w", e)
	}
	defer unix.Close(int(rfd))
	for _, d := range execDirs {
		fd, err := unix.Open(d, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			continue // not on this system
		}
		rule := unix.LandlockPathBeneathAttr{Allowed_access: unix.LANDLOCK_ACCESS_FS_EXECUTE, Parent_fd: int32(fd)}
		_, _, e := unix.Syscall6(unix.SYS_LANDLOCK_ADD_RULE, rfd, unix.LANDLOCK_RULE_PATH_BENEATH, uintptr(unsafe.Pointer(&rule)), 0, 0, 0)
		unix.Close(fd)
		if e != 0 {
			return fmt.Errorf("landlock_add_rule %s: %w", d, e)
		}
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return err
	}
	if _, _, e := unix.Syscall(unix.SYS_LANDLOCK_RESTRICT_SELF, rfd, 0, 0); e != 0 {
		return fmt.Errorf("landlock_restrict_self: %w", e)
	}
	return nil
}

// landlockExecMain prints why it could not replace itself, or is replaced
// by a program that prints execOKLine.
func landlockExecMain() int {
	self, err := os.ReadFile("/proc/self/exe")
	if err != nil {
		fmt.Println("setup:", err)
		return 1
	}
	copyPath := filepath.Join(os.Getenv(envDir), "copy")
	if err := os.WriteFile(copyPath, self, 0o755); err != nil {
		fmt.Println("setup:", err)
		return 1
	}
	mfd, err := unix.MemfdCreate("moat-exec", 0)
	if err == nil {
		_, err = unix.Write(mfd, self)
	}
	if err != nil {
		fmt.Println("setup: memfd:", err)
		return 1
	}
	if os.Getenv(envExecLandlock) == "1" {
		if err := restrictExecute(); err != nil {
			fmt.Println("setup:", err)
			return 1
		}
	}
	prog, err := Build(Options{})
	if err == nil {
		err = Install(prog)
	}
	if err != nil {
		fmt.Println("setup:", err)
		return 1
	}
	argv := []string{"moat-exec", caseHelper, caseExecOK}
	env := os.Environ()
	switch m := os.Getenv(envExecMethod); m {
	case "file":
		err = unix.Exec(copyPath, argv, env)
	case "memfd-proc":
		err = unix.Exec(fmt.Sprintf("/proc/self/fd/%d", mfd), argv, env)
	case "memfd-execveat":
		err = execveatEmpty(mfd, argv, env)
	default:
		err = fmt.Errorf("unknown method %q", m)
	}
	fmt.Println(result(err))
	return 0
}

func execveatEmpty(fd int, argv, env []string) error {
	empty, err := unix.BytePtrFromString("")
	if err != nil {
		return err
	}
	av, err := cStrings(argv)
	if err != nil {
		return err
	}
	ev, err := cStrings(env)
	if err != nil {
		return err
	}
	_, _, e := unix.Syscall6(unix.SYS_EXECVEAT, uintptr(fd), uintptr(unsafe.Pointer(empty)),
		uintptr(unsafe.Pointer(&av[0])), uintptr(unsafe.Pointer(&ev[0])), unix.AT_EMPTY_PATH, 0)
	return errnoErr(e)
}

func TestKernelLandlockMemfdExec(t *testing.T) {
	ok, why := seccompAvailable()
	testenv.Need(t, ok, why)
	testenv.Need(t, landlockABI() >= 1, "Landlock")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		method   string
		landlock bool
		want     string
		why      string
	}{
		{"file", false, execOKLine, "control: the copy runs without Landlock"},
		{"file", true, "EACCES", "control: Landlock refuses to execute a file outside the execute grants"},
		{"memfd-execveat", false, execOKLine, "control: the memfd runs without Landlock"},
		{"memfd-execveat", true, execOKLine, "Landlock does not check a memfd's execution (if this now fails, the kernel closed it: update execveat's reason in rules_linux.go)"},
		{"memfd-proc", true, execOKLine, "execve through /proc/self/fd runs the same memfd, so refusing execveat alone closes nothing"},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%s/landlock=%v", c.method, c.landlock), func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			for _, d := range execDirs {
				if real, err := filepath.EvalSymlinks(d); err == nil && strings.HasPrefix(dir+"/", real+"/") {
					t.Fatalf("test directory %s is below execute grant %s", dir, real)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), childTimeout)
			defer cancel()
			cmd := exec.CommandContext(ctx, exe, caseHelper, caseLandlockExec)
			ll := "0"
			if c.landlock {
				ll = "1"
			}
			cmd.Env = append(os.Environ(), envDir+"="+dir,
				envExecMethod+"="+c.method, envExecLandlock+"="+ll)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil {
				t.Fatalf("child: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.Bytes(), stderr.Bytes())
			}
			if got := strings.TrimSpace(stdout.String()); got != c.want {
				t.Errorf("got %q, want %q: %s\nstderr:\n%s", got, c.want, c.why, stderr.Bytes())
			}
		})
	}
}

// cStrings is a NULL-terminated array of C strings.
func cStrings(ss []string) ([]*byte, error) {
	out := make([]*byte, 0, len(ss)+1)
	for _, s := range ss {
		p, err := unix.BytePtrFromString(s)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return append(out, nil), nil
}
