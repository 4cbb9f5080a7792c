package measure

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/receiver"
	"github.com/moat-sandbox/moat/internal/reexec/reexectest"
	"github.com/moat-sandbox/moat/internal/testenv"
)

// confineHelper confines itself (no_new_privs and a Landlock ruleset, on
// the one thread that then calls execve) and executes the real helper.
// Run it in fresh user and network namespaces as a non-root uid, and the
// helper measures a small but real sandbox: Landlock walls the
// filesystem, the empty network namespace walls egress, and the non-root
// uid with no_new_privs is the privilege floor. No seccomp: a nested user
// namespace stays possible, and the measurement must say so.
var confineHelper = reexectest.Helper("measure-confine", confineAndMeasure)

// confineAndMeasure: args are rw, ro, the test binary's directory, plan.
func confineAndMeasure(args []string) int {
	if len(args) != 4 {
		fmt.Fprintln(os.Stderr, "confine: want rw ro exedir plan")
		return 125
	}
	runtime.LockOSThread() // the restrictions below are per thread; execve carries them
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		fmt.Fprintln(os.Stderr, "confine: no_new_privs:", err)
		return 125
	}
	ro := []string{args[1], args[2], "/proc"}
	for _, p := range []string{"/lib", "/lib64", "/usr/lib", "/usr/lib64"} { // a cgo build's loader and libc
		if _, err := os.Stat(p); err == nil {
			ro = append(ro, p)
		}
	}
	if err := landlockRestrictThread([]string{args[0]}, ro, []string{os.DevNull}); err != nil {
		fmt.Fprintln(os.Stderr, "confine: landlock:", err)
		return 125
	}
	// Like any sandbox, pass on nothing but stdio (this process may have
	// inherited fds from whoever ran the tests).
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		fmt.Fprintln(os.Stderr, "confine: close_range:", err)
		return 125
	}
	exe := "/proc/self/exe"
	err := unix.Exec(exe, []string{exe, Helper, args[3]}, os.Environ())
	fmt.Fprintln(os.Stderr, "confine: exec:", err)
	return 125
}

func landlockABI() int {
	v, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_VERSION)
	if errno != 0 {
		return 0
	}
	return int(v)
}

// Landlock ABI 1 filesystem rights.
const (
	llRead = unix.LANDLOCK_ACCESS_FS_EXECUTE | unix.LANDLOCK_ACCESS_FS_READ_FILE | unix.LANDLOCK_ACCESS_FS_READ_DIR
	llAll  = llRead | unix.LANDLOCK_ACCESS_FS_WRITE_FILE | unix.LANDLOCK_ACCESS_FS_REMOVE_DIR |
		unix.LANDLOCK_ACCESS_FS_REMOVE_FILE | unix.LANDLOCK_ACCESS_FS_MAKE_CHAR | unix.LANDLOCK_ACCESS_FS_MAKE_DIR |
		unix.LANDLOCK_ACCESS_FS_MAKE_REG | unix.LANDLOCK_ACCESS_FS_MAKE_SOCK | unix.LANDLOCK_ACCESS_FS_MAKE_FIFO |
		unix.LANDLOCK_ACCESS_FS_MAKE_BLOCK | unix.LANDLOCK_ACCESS_FS_MAKE_SYM
)

// landlockRestrictThread restricts the calling thread to rw, ro
// (directories) and rwFiles, with ABI 1 rights.
func landlockRestrictThread(rw, ro, rwFiles []string) error {
	attr := struct{ handled uint64 }{llAll}
	fd, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr), 0)
	if errno != 0 {
		return fmt.Errorf("create_ruleset: %w", errno)
	}
	defer unix.Close(int(fd))
	add := func(p string, access uint64) error {
		pfd, err := unix.Open(p, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(pfd)
		rule := unix.LandlockPathBeneathAttr{Allowed_access: access, Parent_fd: int32(pfd)}
		if _, _, errno := unix.Syscall6(unix.SYS_LANDLOCK_ADD_RULE, fd, unix.LANDLOCK_RULE_PATH_BENEATH, uintptr(unsafe.Pointer(&rule)), 0, 0, 0); errno != 0 {
			return fmt.Errorf("add_rule %s: %w", p, errno)
		}
		return nil
	}
	for _, p := range rw {
		if err := add(p, llAll); err != nil {
			return err
		}
	}
	for _, p := range ro {
		if err := add(p, llRead); err != nil {
			return err
		}
	}
	for _, p := range rwFiles {
		if err := add(p, unix.LANDLOCK_ACCESS_FS_READ_FILE|unix.LANDLOCK_ACCESS_FS_WRITE_FILE); err != nil {
			return err
		}
	}
	if _, _, errno := unix.Syscall(unix.SYS_LANDLOCK_RESTRICT_SELF, fd, 0, 0); errno != 0 {
		return fmt.Errorf("restrict_self: %w", errno)
	}
	return nil
}

// TestProbesUnderConfinement runs the real helper in a small real sandbox
// (see confineHelper) next to the same host receivers that the unconfined
// test reaches: every violation that one of its walls stops is reported
// failed, the controls succeed, and what this small sandbox lacks is
// reported as it is: a nested user namespace (only a seccomp filter stops
// it), the broker (there is none in this namespace) and a private /tmp.
func TestProbesUnderConfinement(t *testing.T) {
	testenv.Need(t, landlockABI() >= 1, "Landlock")
	testenv.Need(t, userNSPossible(), "unprivileged user namespaces")
	h := newHostSetup(t)

	recv, err := receiver.Start(receiver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer recv.Close()

	cfg := h.config()
	cfg.BrokerPort = 18080 // nothing listens there inside the new namespace
	cfg.ExtraTCPPorts = []int{recv.TCPPort()}
	cfg.ExtraUDPPorts = []int{recv.UDPPort()}
	if err := cfg.validate(cfg.BrokerPort); err != nil {
		t.Fatal(err)
	}
	pl, err := buildPlan(cfg, "c0ffee")
	if err != nil {
		t.Fatal(err)
	}
	arg, err := encodePlan(pl)
	if err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, confineHelper.Name, h.rw, h.ro, filepath.Dir(exe), arg)
	cmd.Env = []string{"GORACE=atexit_sleep_ms=0"}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWNET,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 1000, HostID: os.Getuid(), Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 1000, HostID: os.Getgid(), Size: 1}},
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("confined helper: %v; stderr: %s", err, stderr.String())
	}
	res, err := decodeReport(out, pl)
	if err != nil {
		t.Fatalf("report: %v\n%s", err, out)
	}

	// What this sandbox does not stop, and why.
	unstopped := map[string]string{
		"net/tcp-broker:127.0.0.1:" + strconv.Itoa(cfg.BrokerPort): OutcomeFailed, // no broker in this namespace
		"priv/" + opUnshare:   OutcomeSucceeded, // only seccomp stops it
		"priv/" + opCloneUser: OutcomeSucceeded, // only seccomp stops it
		"fs/write-tmp:/tmp":   OutcomeFailed,    // no private /tmp here, and Landlock denies the host's
		"fs/stat-list:/":      OutcomeFailed,    // Landlock here grants no listing of /
		// No private /tmp here: the probes that create a file there
		// cannot (Landlock), so they report an error or a failure.
		"priv/" + opSetIDChmod:  OutcomeError,
		"priv/" + opSetIDCreate: OutcomeFailed,
		"priv/" + opChmodPlain:  OutcomeError,
	}
	for _, p := range pl.Probes {
		r, ok := res[p.ID]
		if !ok {
			t.Errorf("%s: no result", p.ID)
			continue
		}
		if want, ok := unstopped[p.ID]; ok {
			if r.Outcome != want {
				t.Errorf("%s (%s): got %s (%s), want %s", p.ID, p.kind, r.Outcome, r.Detail, want)
			}
			continue
		}
		if !judge(p.kind, r.Outcome) {
			t.Errorf("%s (%s): got %s (%s)", p.ID, p.kind, r.Outcome, r.Detail)
		} else {
			t.Logf("%s %s: %s (%s)", p.kind, p.ID, r.Outcome, r.Detail)
		}
	}
	select {
	case s := <-recv.Events:
		t.Errorf("a host receiver observed the confined helper: %s", s)
	case <-time.After(200 * time.Millisecond):
	}
}
