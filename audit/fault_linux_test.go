package audit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/testenv"
)

// faultTmpfsSize is the size of the tmpfs that runs out of space: room for
// the public key and a few records.
const faultTmpfsSize = "64k"

// faultReport is what faultScenario saw, passed from a helper process as JSON.
type faultReport struct {
	Setup         string   // a setup error, if any
	Acked         []string // LineHash of every line whose Append returned
	FirstErr      string
	FirstPoisoned bool
	LaterErr      string // a small record after the failure
	LaterPoisoned bool
	TermErr       string // run.terminated after the failure
	TermPoisoned  bool
	Journal       []byte
	PubPEM        []byte
}

// mountTmpfs mounts a size-limited tmpfs on mnt.
func mountTmpfs(mnt string) error {
	return unix.Mount("moat-audit-fault", mnt, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size="+faultTmpfsSize+",mode=0700")
}

// faultScenario writes a journal onto the (already mounted, full-able)
// filesystem at mnt until an Append fails, then tries once more.
func faultScenario(mnt string) faultReport {
	var rep faultReport
	w, err := Create(filepath.Join(mnt, "run"), "fault-test")
	if err != nil {
		rep.Setup = err.Error()
		return rep
	}
	defer w.Close()
	big := strings.Repeat("x", 6000) // ~8 KiB per line after base64
	recs := []Record{RunStarted{PolicySHA256: "p", Backend: "native", BinarySHA256: "b", PublicKey: string(w.PublicKeyPEM())}, BoundaryConfirmed{Ready: true}}
	for i := range 1000 {
		recs = append(recs, ProcessStarted{ProcessID: fmt.Sprint(i), Argv: []string{"agent", big}, HostPID: i})
	}
	for _, r := range recs {
		line, err := w.Append(r)
		if err != nil {
			rep.FirstErr, rep.FirstPoisoned = err.Error(), errors.Is(err, ErrPoisoned)
			break
		}
		rep.Acked = append(rep.Acked, LineHash(line))
	}
	if rep.FirstErr == "" {
		rep.Setup = "the filesystem never filled up"
		return rep
	}
	// A small record that would fit in what is left must be refused too.
	_, err = w.Append(ProcessExited{ProcessID: "0"})
	rep.LaterErr, rep.LaterPoisoned = fmt.Sprint(err), errors.Is(err, ErrPoisoned)
	_, err = w.Append(RunTerminated{Reason: ReasonCompleted})
	rep.TermErr, rep.TermPoisoned = fmt.Sprint(err), errors.Is(err, ErrPoisoned)
	rep.Journal, _ = os.ReadFile(w.JournalPath())
	rep.PubPEM = w.PublicKeyPEM()
	return rep
}

func checkFault(t *testing.T, rep faultReport) {
	t.Helper()
	if rep.Setup != "" {
		t.Fatalf("setup: %s", rep.Setup)
	}
	t.Logf("%d records durable, then: %s", len(rep.Acked), rep.FirstErr)
	if len(rep.Acked) < 2 {
		t.Fatalf("only %d records before the failure; the scenario must fail mid-journal", len(rep.Acked))
	}
	if !rep.FirstPoisoned || !strings.Contains(rep.FirstErr, "no space left") {
		t.Errorf("failing Append: %q, want ErrPoisoned caused by ENOSPC", rep.FirstErr)
	}
	if !rep.LaterPoisoned {
		t.Errorf("small Append after the failure: %q, want ErrPoisoned", rep.LaterErr)
	}
	if !rep.TermPoisoned {
		t.Errorf("run.terminated after the failure: %q, want ErrPoisoned", rep.TermErr)
	}
	pub, err := ParsePublicKeyPEM(rep.PubPEM)
	if err != nil {
		t.Fatal(err)
	}
	r := Verify(rep.Journal, pub)
	if r.Status != Incomplete || r.Status.ExitCode() != 2 || r.Records != len(rep.Acked) {
		t.Fatalf("Verify on the full filesystem's journal: %v (%s), %d records; want incomplete (exit 2) with %d records",
			r.Status, r.Reason, r.Records, len(rep.Acked))
	}
	t.Logf("verify: %s (exit %d): %s", r.Status, r.Status.ExitCode(), r.Reason)
	for _, h := range rep.Acked {
		if !containsLine(rep.Journal, h) {
			t.Fatalf("acknowledged line %s missing", h)
		}
	}
}

func containsLine(journal []byte, hash string) bool {
	for _, l := range bytes.Split(journal, []byte("\n")) {
		if LineHash(l) == hash {
			return true
		}
	}
	return false
}

// TestRootFaultTmpfs puts the journal on a 64 KiB tmpfs mounted by root.
func TestRootFaultTmpfs(t *testing.T) {
	testenv.NeedRoot(t)
	mnt := t.TempDir()
	if err := mountTmpfs(mnt); err != nil {
		t.Fatalf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
	checkFault(t, faultScenario(mnt))
}

// TestFaultTmpfsUserns does the same as any user: the test binary is re-run
// in a new user and mount namespace, where it may mount a tmpfs.
func TestFaultTmpfsUserns(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cmd := exec.Command(exe, helperName("fault"), dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:                 syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS,
		UidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Geteuid(), Size: 1}},
		GidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getegid(), Size: 1}},
		GidMappingsEnableSetgroups: false,
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil && len(out) == 0 {
		testenv.Need(t, false, fmt.Sprintf("cannot start a process in a new user+mount namespace: %v %s", err, stderr.Bytes()))
	}
	var rep faultReport
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("helper output %q: %v (stderr %s)", out, err, stderr.Bytes())
	}
	if strings.HasPrefix(rep.Setup, "mount:") {
		testenv.Need(t, false, "tmpfs mount in a user namespace: "+rep.Setup)
	}
	checkFault(t, rep)
}

// helperFault runs in the new namespaces: make every mount private, mount
// the small tmpfs, run the scenario and print the report.
func helperFault(args []string) int {
	if len(args) != 1 {
		fmt.Fprintln(os.Stderr, "want DIR")
		return 3
	}
	var rep faultReport
	mnt := filepath.Join(args[0], "mnt")
	switch {
	case unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, "") != nil:
		rep.Setup = "mount: making / private failed"
	case os.Mkdir(mnt, 0o700) != nil:
		rep.Setup = "mkdir " + mnt + " failed"
	default:
		if err := mountTmpfs(mnt); err != nil {
			rep.Setup = "mount: " + err.Error()
		} else {
			rep = faultScenario(mnt)
		}
	}
	b, _ := json.Marshal(rep)
	os.Stdout.Write(b)
	return 0
}
