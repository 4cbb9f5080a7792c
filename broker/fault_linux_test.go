package broker

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/internal/testenv"
)

// TestRootAuditFaultRealStorage puts the journal on a small tmpfs, fills
// it, and leaves less room in the journal's last page than one
// inference.requested line: the broker's next append fails for real
// (ENOSPC). That request never reaches the provider, none does afterwards,
// OnFatal fires, and the journal verifies as incomplete (exit 2).
func TestRootAuditFaultRealStorage(t *testing.T) {
	testenv.NeedRoot(t)
	mnt := t.TempDir()
	if err := unix.Mount("tmpfs", mnt, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=1m,mode=0700"); err != nil {
		testenv.Need(t, false, "mounting a tmpfs: "+err.Error())
	}
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
	auditFaultScenario(t, mnt)
}

// faultChildEnv marks the re-executed test binary of
// TestAuditFaultRealStorageUserNS.
const faultChildEnv = "MOAT_BROKER_TEST_FAULT_CHILD"

// TestAuditFaultRealStorageUserNS runs the same scenario without root: the
// test binary re-executes itself for this one test in a new user and mount
// namespace, where it may mount its own small tmpfs.
func TestAuditFaultRealStorageUserNS(t *testing.T) {
	if os.Getenv(faultChildEnv) == "1" {
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			t.Fatalf("making / private in the child's mount namespace: %v", err)
		}
		mnt := t.TempDir()
		if err := unix.Mount("tmpfs", mnt, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=1m,mode=0700"); err != nil {
			t.Fatalf("mounting a tmpfs in the child: %v", err)
		}
		defer unix.Unmount(mnt, unix.MNT_DETACH)
		auditFaultScenario(t, mnt)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestAuditFaultRealStorageUserNS$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), faultChildEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}},
	}
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		testenv.Need(t, false, "starting a child in a new user+mount namespace: "+err.Error())
	}
	if err != nil || !strings.Contains(string(out), "--- PASS: TestAuditFaultRealStorageUserNS") {
		t.Fatalf("the scenario failed in the child (%v):\n%s", err, out)
	}
}

// auditFaultScenario runs the real-storage audit fault on a fresh, small
// tmpfs mounted at mnt.
func auditFaultScenario(t *testing.T, mnt string) {
	j := openTestJournal(t, filepath.Join(mnt, "run"))
	fp := newFakeProvider(t, false)
	h := startBroker(t, fp, testPolicy(fp.srv.URL, 100), nil, j)

	h.mustSucceed() // the allowed action, on the same storage
	lineLen := len(h.fp.last().preEffect) + 1

	filler, err := os.Create(filepath.Join(mnt, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 64<<10)
	for {
		if _, err := filler.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("filling the tmpfs: %v", err)
			}
			break
		}
	}
	filler.Close()
	// Pad the journal's last page with small records until less room is
	// left than a pre-effect line needs (RFC 3339 times vary a little in
	// length, hence the margin).
	for {
		fi, err := os.Stat(j.w.JournalPath())
		if err != nil {
			t.Fatal(err)
		}
		slack := (4096 - fi.Size()%4096) % 4096
		if slack < int64(lineLen-32) {
			break
		}
		if _, err := j.w.Append(audit.InferenceFailed{RequestID: "pad", Reason: "pad"}); err != nil {
			t.Fatalf("padding the journal: %v", err)
		}
	}

	before := h.fp.count()
	r := h.raw(post("/v1/messages", anthropicBody))
	if r.status != 503 || Reason(r.header.Get("Moat-Reason")) != ReasonAuditFailure || !strings.Contains(r.body, "not sent") {
		t.Fatalf("request on full storage: status %d reason %q body %s, want 503 %s (not sent)", r.status, r.header.Get("Moat-Reason"), r.body, ReasonAuditFailure)
	}
	expectFatal(t, h, ReasonAuditFailure)
	if got := h.fp.count(); got != before {
		t.Errorf("the faulted request reached the provider (%d new requests)", got-before)
	}
	os.Remove(filepath.Join(mnt, "filler")) // storage recovers; the run does not
	if r := h.raw(post("/v1/messages", anthropicBody)); r.status != 503 {
		t.Errorf("after the fault: status %d, want 503", r.status)
	}
	if got := h.fp.count(); got != before {
		t.Errorf("a request reached the provider after the fault")
	}
	b, err := os.ReadFile(j.w.JournalPath())
	if err != nil {
		t.Fatal(err)
	}
	if res := audit.Verify(b, j.w.PublicKey()); res.Status.ExitCode() != 2 {
		t.Errorf("journal verification %v (%s), want incomplete (exit 2)", res.Status, res.Reason)
	}
}
