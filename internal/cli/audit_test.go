package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/audit"
)

// runCLI runs moat with args and returns its stdout and exit code.
func runCLI(t *testing.T, args ...string) (string, int) {
	t.Helper()
	root := NewRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.Execute()
	if err == nil {
		return out.String(), 0
	}
	var ee *ExitError
	if errors.As(err, &ee) {
		if ee.Err != nil {
			out.WriteString("moat: " + ee.Err.Error() + "\n")
		}
		return out.String(), ee.Code
	}
	return out.String() + err.Error(), exitUsage
}

// writeRun makes a real journal: run.started, boundary.confirmed, a
// refused and a requested inference, and (if terminate) run.terminated.
func writeRun(t *testing.T, terminate bool) (dir string, lines [][]byte) {
	t.Helper()
	dir = filepath.Join(t.TempDir(), "run")
	w, err := audit.Create(dir, "cli-test")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	recs := []audit.Record{
		audit.RunStarted{PolicySHA256: strings.Repeat("a", 64), Backend: "native", BinarySHA256: strings.Repeat("b", 64), PublicKey: string(w.PublicKeyPEM())},
		audit.BoundaryConfirmed{Ready: true},
		audit.InferenceRefused{RequestID: "r1", Reason: "model_not_allowed", Detail: `moat: refused: model "x" is not allowed by policy (allowed: a, b)`,
			Attribution: audit.Attribution{Status: "unavailable", Reason: "test"}},
		audit.InferenceRequested{RequestID: "r2", Provider: "anthropic", Model: "a", Endpoint: "/v1/messages",
			Attribution: audit.Attribution{Status: "resolved", PID: 7, Executable: "/bin/agent"}},
	}
	if terminate {
		recs = append(recs, audit.RunTerminated{Reason: "completed"})
	}
	for _, r := range recs {
		l, err := w.Append(r)
		if err != nil {
			t.Fatal(err)
		}
		lines = append(lines, l)
	}
	return dir, lines
}

func TestAuditVerifyExitCodes(t *testing.T) {
	dir, lines := writeRun(t, true)
	pub := filepath.Join(dir, audit.PublicKeyFile)
	journal := filepath.Join(dir, audit.JournalFile)
	raw, _ := os.ReadFile(journal)
	write := func(name string, b []byte) string {
		p := filepath.Join(t.TempDir(), name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	flipped := bytes.Clone(raw)
	// Change one base64 character inside line 1's signature to another.
	if at := len(lines[0]) - 30; flipped[at] == 'A' {
		flipped[at] = 'B'
	} else {
		flipped[at] = 'A'
	}
	other := filepath.Join(t.TempDir(), "other")
	w2, err := audit.Create(other, "other")
	if err != nil {
		t.Fatal(err)
	}
	w2.Close()
	cases := []struct {
		name    string
		journal string
		pubkey  string
		code    int
		want    string
	}{
		{"complete", journal, pub, 0, "complete: 5 records"},
		{"terminal dropped", write("j", raw[:len(raw)-len(lines[4])-1]), pub, 2, "no terminal record"},
		{"torn tail", write("j", raw[:len(raw)-len(lines[4])-1+37]), pub, 2, "torn tail of 37 bytes"},
		{"flipped signature byte", write("j", flipped), pub, 1, "INVALID: line 1: bad signature"},
		{"garbage after terminal", write("j", append(bytes.Clone(raw), "x\n"...)), pub, 1, "line 6: data after the terminal record"},
		{"wrong key", journal, filepath.Join(other, audit.PublicKeyFile), 1, "line 1: wrong key"},
		{"missing journal", filepath.Join(dir, "nope"), pub, 1, "reading the journal"},
		{"not a key", journal, journal, 1, "not a PEM file"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, code := runCLI(t, "audit", "verify", c.journal, "--pubkey", c.pubkey)
			if code != c.code || !strings.Contains(out, c.want) {
				t.Fatalf("exit %d, output %q; want exit %d and %q", code, out, c.code, c.want)
			}
		})
	}
	t.Run("json", func(t *testing.T) {
		out, code := runCLI(t, "audit", "verify", write("j", raw[:len(raw)-len(lines[4])-1+37]), "--pubkey", pub, "-o", "json")
		var got struct {
			Status   string `json:"status"`
			Line     int    `json:"line"`
			Reason   string `json:"reason"`
			Records  int    `json:"records"`
			ExitCode int    `json:"exit_code"`
		}
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("output %q: %v", out, err)
		}
		if code != 2 || got.Status != "incomplete" || got.Line != 5 || got.Records != 4 || got.ExitCode != 2 || !strings.Contains(got.Reason, "torn tail of 37 bytes") {
			t.Fatalf("exit %d, %+v", code, got)
		}
	})
	t.Run("pubkey required", func(t *testing.T) {
		if _, code := runCLI(t, "audit", "verify", journal); code == 0 {
			t.Fatal("verify without --pubkey exited 0")
		}
	})
}

func TestAuditShow(t *testing.T) {
	dir, _ := writeRun(t, false)
	journal := filepath.Join(dir, audit.JournalFile)
	out, code := runCLI(t, "audit", "show", journal)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, out)
	}
	rows := strings.Split(strings.TrimSpace(out), "\n")
	if len(rows) != 5 {
		t.Fatalf("%d rows, want 4 records and a note:\n%s", len(rows), out)
	}
	for i, want := range []string{"run.started", "boundary.confirmed", "REFUSED inference.refused", "inference.requested", "signatures not checked"} {
		if !strings.Contains(rows[i], want) {
			t.Errorf("row %d %q, want %q", i+1, rows[i], want)
		}
	}
	if !strings.HasPrefix(rows[2], "!!") || strings.HasPrefix(rows[3], "!!") {
		t.Errorf("only the refusal is highlighted:\n%s", out)
	}
	if !strings.Contains(rows[2], "model_not_allowed") || !strings.Contains(rows[3], "pid=7") {
		t.Errorf("key fields missing:\n%s", out)
	}
	out, code = runCLI(t, "audit", "show", journal, "--pubkey", filepath.Join(dir, audit.PublicKeyFile))
	if code != 2 || !strings.Contains(out, "verified: incomplete: no terminal record") {
		t.Fatalf("show --pubkey: exit %d\n%s", code, out)
	}
	out, code = runCLI(t, "audit", "show", journal, "-o", "json")
	var recs []map[string]any
	if err := json.Unmarshal([]byte(out), &recs); err != nil || code != 0 || len(recs) != 4 || recs[2]["reason"] != "model_not_allowed" {
		t.Fatalf("show -o json: exit %d, err %v\n%s", code, err, out)
	}
}

func TestAuditHelpHasExamples(t *testing.T) {
	for _, args := range [][]string{{"audit", "--help"}, {"audit", "verify", "--help"}, {"audit", "show", "--help"}} {
		out, code := runCLI(t, args...)
		if code != 0 || !strings.Contains(out, "Examples:") || !strings.Contains(out, "moat audit") {
			t.Errorf("%v: exit %d, no example:\n%s", args, code, out)
		}
	}
}
