package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/broker"
	"github.com/moat-sandbox/moat/policy"
)

// heldSandbox is a boundary.Sandbox whose one process runs until release
// is closed and then exits with code.
type heldSandbox struct {
	boundary.Sandbox // nil: only Start is called
	release          chan struct{}
	code             int
}

func (h *heldSandbox) Start(context.Context, boundary.Process) (boundary.Running, error) {
	return heldProc{h}, nil
}

type heldProc struct{ h *heldSandbox }

func (p heldProc) HostPID() int { return 4242 }
func (p heldProc) Wait() (int, error) {
	<-p.h.release
	return p.h.code, nil
}
func (p heldProc) Signal(os.Signal) error { return nil }

// execThroughSupervisor sends one exec request to sv.handle over a socket
// pair, as `moat sandbox exec` does, and returns the two replies.
func execThroughSupervisor(t *testing.T, sv *supervisor) (started, exited execReply, err error) {
	t.Helper()
	server, client := unixPair(t)
	defer client.Close()
	go sv.handle(context.Background(), server)
	devnull, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer devnull.Close()
	d := int(devnull.Fd())
	req, _ := json.Marshal(controlRequest{Op: "exec", Argv: []string{"/bin/true"}})
	if _, _, err := client.WriteMsgUnix(append(req, '\n'), syscall.UnixRights(d, d, d), nil); err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(client)
	client.SetReadDeadline(time.Now().Add(30 * time.Second))
	if err := dec.Decode(&started); err != nil {
		return started, exited, err
	}
	err = dec.Decode(&exited)
	return started, exited, err
}

// journalTypes lists the record types of the journal at path, in order.
func journalTypes(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var env struct{ Payload []byte }
		var h struct{ Type string }
		if err := json.Unmarshal([]byte(line), &env); err != nil {
			t.Fatalf("journal line %q: %v", line, err)
		}
		if err := json.Unmarshal(env.Payload, &h); err != nil {
			t.Fatalf("journal payload %q: %v", env.Payload, err)
		}
		types = append(types, h.Type)
	}
	return types
}

// journalFaultChildEnv marks the child that TestExecJournalFault runs in.
const journalFaultChildEnv = "MOAT_SANDBOX_TEST_JOURNAL_FAULT_CHILD"

// TestExecJournalFault: a sandbox exec's process.exited is written
// before the client is answered and synced after; when the journal fails
// under it (here: the write fails for real, with EFBIG, past an
// RLIMIT_FSIZE set at the journal's size while the process runs), the
// client still gets the exit code, and the session's fatal channel ends
// the sandbox with audit_failure, so that no later request can leave
// without its record. Control: without the limit, the same exec is
// answered, nothing is fatal, and both process records are in the
// journal as soon as the client has its answer.
//
// The limit is process-wide, so the test runs in a child of its own (the
// test binary again, for this test alone): no other goroutine's write can
// meet it.
func TestExecJournalFault(t *testing.T) {
	if os.Getenv(journalFaultChildEnv) != "1" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestExecJournalFault$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), journalFaultChildEnv+"=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestExecJournalFault") {
			t.Fatalf("the child failed (%v):\n%s", err, out)
		}
		return
	}
	mnt := t.TempDir()
	newSession := func(dir string) (*Session, *heldSandbox) {
		w, err := audit.Create(dir, "run-fault")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { w.Close() })
		if _, err := w.Append(audit.RunStarted{PolicySHA256: strings.Repeat("a", 64), Backend: "native", BinarySHA256: strings.Repeat("b", 64),
			PublicKey: string(w.PublicKeyPEM())}); err != nil {
			t.Fatal(err)
		}
		if _, err := w.Append(audit.BoundaryConfirmed{Ready: true}); err != nil {
			t.Fatal(err)
		}
		sb := &heldSandbox{release: make(chan struct{}), code: 7}
		return &Session{pol: policy.Default(), w: w, sb: sb, fatal: make(chan Fatal, 1),
			running: map[string]boundary.Running{}, oomAtStart: map[string]uint64{}}, sb
	}

	// Control: no limit.
	s, sb := newSession(filepath.Join(mnt, "ok"))
	close(sb.release)
	started, exited, err := execThroughSupervisor(t, &supervisor{sess: s})
	if err != nil || started.Started == "" || !exited.Exited || exited.Code != 7 {
		t.Fatalf("control: got %+v, %+v, %v; want started, then exited with 7", started, exited, err)
	}
	// Written before the reply (synced after it): a reader finds both
	// records as soon as the client has its answer.
	if got, want := journalTypes(t, s.w.JournalPath()), []string{audit.TypeRunStarted, audit.TypeBoundaryConfirmed,
		audit.TypeProcessStarted, audit.TypeProcessExited}; !slices.Equal(got, want) {
		t.Fatalf("control: the journal has %v; want %v", got, want)
	}
	select {
	case f := <-s.fatal:
		t.Fatalf("control: fatal %v", f)
	case <-time.After(200 * time.Millisecond):
	}

	// The fault: the journal cannot grow while the process runs.
	s, sb = newSession(filepath.Join(mnt, "full"))
	type result struct {
		started, exited execReply
		err             error
	}
	res := make(chan result, 1)
	go func() {
		st, ex, err := execThroughSupervisor(t, &supervisor{sess: s})
		res <- result{st, ex, err}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for len(s.Processes()) == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if len(s.Processes()) == 0 {
		t.Fatal("the process was never started")
	}
	fi, err := os.Stat(s.w.JournalPath())
	if err != nil {
		t.Fatal(err)
	}
	// Go ignores SIGXFSZ: the write past the limit fails with EFBIG.
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_FSIZE, &lim); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setrlimit(unix.RLIMIT_FSIZE, &unix.Rlimit{Cur: uint64(fi.Size()), Max: lim.Max}); err != nil {
		t.Fatal(err)
	}
	restored := false
	restore := func() {
		if !restored {
			restored = true
			if err := unix.Setrlimit(unix.RLIMIT_FSIZE, &lim); err != nil {
				t.Fatal(err)
			}
		}
	}
	defer restore()
	close(sb.release)
	r := <-res
	restore()
	if r.err != nil || !r.exited.Exited || r.exited.Code != 7 {
		t.Fatalf("fault: got %+v, %+v, %v; want the exit code 7 answered", r.started, r.exited, r.err)
	}
	select {
	case f := <-s.fatal:
		if f.Reason != string(broker.ReasonAuditFailure) || !strings.Contains(f.Msg, "process.exited of p1") {
			t.Fatalf("fatal %+v; want %s naming process.exited", f, broker.ReasonAuditFailure)
		}
		if f.TerminalReason() != audit.ReasonCancelled {
			t.Fatalf("terminal reason %s; want %s", f.TerminalReason(), audit.ReasonCancelled)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the journal failed under the exec, and the sandbox was not ended")
	}
	if _, err := s.w.Append(audit.ProcessExited{ProcessID: "p9"}); !errors.Is(err, audit.ErrPoisoned) {
		t.Fatalf("an append after the fault: %v; want the journal poisoned", err)
	}
}

// TestJournalFaultReasons: a journal that is closed or terminated means
// the session is ending (nothing is reported); a full one ends the run
// with journal_limit; any other failure with audit_failure.
func TestJournalFaultReasons(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string // "" for none
	}{
		{audit.ErrClosed, ""},
		{fmt.Errorf("wrapped: %w", audit.ErrTerminated), ""},
		{fmt.Errorf("audit: refused: %w: ...", audit.ErrJournalFull), string(broker.ReasonJournalLimit)},
		{fmt.Errorf("audit: refused: %w: ...", audit.ErrTooManyRecords), string(broker.ReasonJournalLimit)},
		{fmt.Errorf("%w: fsync failed: EIO", audit.ErrPoisoned), string(broker.ReasonAuditFailure)},
		{errors.New("anything else"), string(broker.ReasonAuditFailure)},
	} {
		s := &Session{fatal: make(chan Fatal, 1)}
		s.journalFault("process.exited of p1", tc.err)
		select {
		case f := <-s.fatal:
			if f.Reason != tc.want || !strings.Contains(f.Msg, "process.exited of p1") {
				t.Errorf("%v: fatal %+v; want reason %q naming the record", tc.err, f, tc.want)
			}
		default:
			if tc.want != "" {
				t.Errorf("%v: nothing reported; want %s", tc.err, tc.want)
			}
		}
	}
}
