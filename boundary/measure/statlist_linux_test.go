package measure

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/internal/reexec/reexectest"
)

// statxEINVALHelper runs the real helper with statx failing EINVAL, as it does
// inside an old runsc (Debian's 20221219): a seccomp filter on this
// thread, inherited by the helper it executes.
var statxEINVALHelper = reexectest.Helper("measure-statx-einval", statxEINVAL)

func statxEINVAL(args []string) int {
	if len(args) != 1 {
		fmt.Fprintln(os.Stderr, "statx-einval: want the plan")
		return 125
	}
	runtime.LockOSThread()
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		fmt.Fprintln(os.Stderr, "statx-einval: no_new_privs:", err)
		return 125
	}
	const (
		ldAbsW = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
		jeqK   = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		retK   = unix.BPF_RET | unix.BPF_K
	)
	filter := []unix.SockFilter{
		{Code: ldAbsW, K: 0}, // seccomp_data.nr
		{Code: jeqK, Jt: 0, Jf: 1, K: unix.SYS_STATX},
		{Code: retK, K: unix.SECCOMP_RET_ERRNO | uint32(unix.EINVAL)},
		{Code: retK, K: unix.SECCOMP_RET_ALLOW},
	}
	prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	if _, _, errno := unix.Syscall(unix.SYS_PRCTL, unix.PR_SET_SECCOMP, unix.SECCOMP_MODE_FILTER, uintptr(unsafe.Pointer(&prog))); errno != 0 {
		fmt.Fprintln(os.Stderr, "statx-einval: seccomp:", errno)
		return 125
	}
	exe := "/proc/self/exe"
	err := unix.Exec(exe, []string{exe, Helper, args[0]}, os.Environ())
	fmt.Fprintln(os.Stderr, "statx-einval: exec:", err)
	return 125
}

// TestStatListControl: the useful-work control (stat and ls -la of "/" and
// of a read-write grant) succeeds for the real helper, and fails, naming
// statx and the error, when statx returns EINVAL as in an old runsc; the
// decision then says the filesystem property is not enforced, with that
// reason.
func TestStatListControl(t *testing.T) {
	ws := t.TempDir()
	for _, n := range []string{"a", "b"} {
		if err := os.WriteFile(filepath.Join(ws, n), []byte(n), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("a", filepath.Join(ws, "link")); err != nil {
		t.Fatal(err)
	}
	pl := plan{V: 1, Nonce: "00"}
	for _, p := range []string{"/", ws, filepath.Join(ws, "a")} {
		pl.Probes = append(pl.Probes, probe{ID: "fs/stat-list:" + p, Op: opStatList, Path: p, property: PropFilesystem, kind: KindControl})
	}
	arg, err := encodePlan(pl)
	if err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) map[string]result {
		t.Helper()
		cmd := exec.Command(exe, args...)
		cmd.Env = []string{"GORACE=atexit_sleep_ms=0"}
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%s: %v; stderr: %s", args[0], err, stderr.String())
		}
		res, err := decodeReport(out, pl)
		if err != nil {
			t.Fatalf("report: %v\n%s", err, out)
		}
		return res
	}
	// Control: the plain helper does the work.
	for id, r := range run(Helper, arg) {
		if r.Outcome != OutcomeSucceeded {
			t.Errorf("control %s: %s (%s)", id, r.Outcome, r.Detail)
		}
	}
	// statx failing EINVAL: every probe fails and says why.
	res := run(statxEINVALHelper.Name, arg)
	rep := &Report{}
	for _, p := range pl.Probes {
		r := res[p.ID]
		if r.Outcome != OutcomeFailed || !strings.Contains(r.Detail, "statx") || !strings.Contains(r.Detail, "invalid argument") {
			t.Errorf("%s with statx EINVAL: %s (%s), want failed naming statx and the error", p.ID, r.Outcome, r.Detail)
		}
		rep.Checks = append(rep.Checks, Check{Property: p.property, Name: p.ID, Kind: p.kind, OK: judge(p.kind, r.Outcome), Outcome: r.Outcome, Detail: r.Detail})
	}
	fs := decide(rep, boundary.Mechanisms{FilesystemConfinement: "x"}, false).FilesystemConfinement
	if fs.Enforced || !strings.Contains(fs.Detail, "control fs/stat-list:/ failed") || !strings.Contains(fs.Detail, "stat and ls -l fail") {
		t.Errorf("decision with a broken statx: enforced %v, %q", fs.Enforced, fs.Detail)
	}
}
