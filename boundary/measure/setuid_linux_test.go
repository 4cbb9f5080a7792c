package measure

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/moat-sandbox/moat/internal/testenv"
)

// TestRootSetuidProbe: a setuid-root copy of the helper raises the euid of
// an ordinary user (uid 65534) when nothing stops it (the control), and
// does not under no_new_privs and Landlock (the violation failing), in the
// same setup.
func TestRootSetuidProbe(t *testing.T) {
	testenv.NeedRoot(t)
	// A directory uid 65534 can reach, holding a copy of this test binary
	// (its build directory is root's) and a setuid-root copy.
	dir, err := os.MkdirTemp("", "moat-setuid-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	rw, ro := filepath.Join(dir, "ws"), filepath.Join(dir, "ro")
	for _, d := range []string{rw, ro} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(dir, "measure.test")
	suid := filepath.Join(rw, "suid")
	copyFile(t, self, exe, 0o755)
	copyFile(t, self, suid, 0o755)
	if err := os.Chmod(suid, 0o755|os.ModeSetuid); err != nil { // owned by root, who copied it
		t.Fatal(err)
	}
	pl := plan{V: 1, Nonce: "5e7", Probes: []probe{{ID: "priv/setuid:" + suid, Op: opSetuid, Path: suid, property: PropPrivilege, kind: KindViolation}}}
	arg, err := encodePlan(pl)
	if err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) result {
		t.Helper()
		cmd := exec.Command(exe, args...)
		cmd.Dir = dir
		cmd.Env = []string{"GORACE=atexit_sleep_ms=0"}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%v: %v; stderr: %s", args, err, stderr.String())
		}
		res, err := decodeReport(out, pl)
		if err != nil {
			t.Fatalf("report: %v", err)
		}
		return res[pl.Probes[0].ID]
	}
	if r := run(Helper, arg); r.Outcome != OutcomeSucceeded {
		t.Fatalf("control: unconfined uid 65534 executing a setuid-root file: got %s (%s), want the euid raised", r.Outcome, r.Detail)
	} else {
		t.Logf("control: %s", r.Detail)
	}
	r := run(confineHelper.Name, rw, ro, dir, arg)
	if r.Outcome != OutcomeFailed {
		t.Fatalf("violation under no_new_privs: got %s (%s), want failed", r.Outcome, r.Detail)
	}
	t.Logf("confined: %s", r.Detail)
}

func copyFile(t *testing.T, from, to string, mode os.FileMode) {
	t.Helper()
	src, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
}
