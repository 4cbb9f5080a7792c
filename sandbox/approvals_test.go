package sandbox

import (
	"bytes"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/broker"
	"github.com/moat-sandbox/moat/policy"
)

// TestReadCommand: one line is read; a command without its newline or
// longer than the limit is refused, beside a command of the limit.
func TestReadCommand(t *testing.T) {
	max := strings.Repeat("x", broker.MaxApprovalCommandBytes)
	for _, c := range []struct{ in, want, err string }{
		{"{\"op\":\"approvals.list\"}\n", `{"op":"approvals.list"}`, ""},
		{max + "\n", max, ""},
		{"{\"op\":\"approvals.list\"}", "", "without its newline"},
		{max + "x\n", "", "longer than"},
		{"a\nb\n", "a", ""},
	} {
		got, err := readCommand(strings.NewReader(c.in))
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%.40q: got %v, want %q", c.in, err, c.err)
			}
			continue
		}
		if err != nil || string(got) != c.want {
			t.Errorf("%.40q: got %.40q %v", c.in, got, err)
		}
	}
}

// FuzzApprovalSocketInput: whatever a control client sends is read and
// parsed, or refused, without a panic; what is accepted is one line.
func FuzzApprovalSocketInput(f *testing.F) {
	f.Add([]byte("{\"op\":\"approvals.list\"}\n"))
	f.Add([]byte("{\"op\":\"approvals.approve\",\"id\":\"moatapr_0123456789abcdef01234567\",\"digest\":\"" + strings.Repeat("a", 64) + "\"}\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		line, err := readCommand(bytes.NewReader(in))
		if err != nil {
			return
		}
		if bytes.IndexByte(line, '\n') >= 0 || len(line) > broker.MaxApprovalCommandBytes {
			t.Fatalf("read %q", line)
		}
		rep := approvalDo(nil, line, "uid 0 pid 1")
		if rep.Error == "" {
			t.Fatalf("no desk, yet %q was carried out", line)
		}
	})
}

// TestRunControlSocket: the run's control socket is owner-only, answers
// list and show, refuses a malformed command, and is gone once stopped.
func TestRunControlSocket(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("peer credentials are read on Linux only; elsewhere every peer is refused")
	}
	dir := filepath.Join(t.TempDir(), "run")
	w, err := audit.Create(dir, "run-ctl")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	pol := policy.Default()
	pol.Approvals = policy.Approvals{Timeout: policy.Duration(time.Minute), Rules: []policy.ApprovalRule{{Road: policy.RoadInference}}}
	brk, err := broker.New(broker.Config{Policy: pol, Journal: w, RunID: "run-ctl"})
	if err != nil {
		t.Fatal(err)
	}
	defer brk.Close()
	s := &Session{brk: brk, w: w}
	stop, err := s.serveRunControl()
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, RunControlSock)
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o600 || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("socket: %v %v", fi, err)
	}
	rep, err := SendApprovalCommand(sock, broker.ApprovalCommand{Op: broker.ApprovalOpList})
	if err != nil || len(rep.Held) != 0 {
		t.Fatalf("list: %+v %v", rep, err)
	}
	if _, err := SendApprovalCommand(sock, broker.ApprovalCommand{Op: broker.ApprovalOpShow, ID: "moatapr_0123456789abcdef01234567"}); err == nil || !strings.Contains(err.Error(), "no held request") {
		t.Errorf("show of an unknown id: %v", err)
	}
	if _, err := SendApprovalCommand(sock, broker.ApprovalCommand{Op: "approvals.nuke"}); err == nil || !strings.Contains(err.Error(), "unknown op") {
		t.Errorf("unknown op: %v", err)
	}
	stop()
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("socket after stop: %v", err)
	}
	if _, err := SendApprovalCommand(sock, broker.ApprovalCommand{Op: broker.ApprovalOpList}); err == nil {
		t.Error("list after stop answered")
	}
	// Without approval rules there is no socket.
	brk2, err := broker.New(broker.Config{Policy: policy.Default(), Journal: w})
	if err != nil {
		t.Fatal(err)
	}
	defer brk2.Close()
	stop2, err := (&Session{brk: brk2, w: w}).serveRunControl()
	if err != nil {
		t.Fatal(err)
	}
	stop2()
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("socket without approval rules: %v", err)
	}
}
