package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/audit"
)

// receiptRun writes a run with one completed inference (lines 3 and 4) and
// returns its directory and the key's fingerprint.
func receiptRun(t *testing.T) (dir, keyID string) {
	t.Helper()
	dir = filepath.Join(t.TempDir(), "run")
	w, err := audit.Create(dir, "cli-receipt")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for _, r := range []audit.Record{
		audit.RunStarted{PolicySHA256: strings.Repeat("a", 64), Backend: "native", BinarySHA256: strings.Repeat("b", 64), PublicKey: string(w.PublicKeyPEM())},
		audit.BoundaryConfirmed{Ready: true},
		audit.InferenceRequested{RequestID: "moatreq_1", Provider: "anthropic", Model: "m", Endpoint: "/v1/messages", BodySHA256: strings.Repeat("1", 64),
			Attribution: audit.Attribution{Status: "resolved", PID: 7, Executable: "/bin/agent"}},
		audit.InferenceCompleted{RequestID: "moatreq_1", Status: 200, ResponseSHA256: strings.Repeat("2", 64), Usage: audit.Usage{InputTokens: 5, OutputTokens: 6}},
		audit.RunTerminated{Reason: audit.ReasonCompleted},
	} {
		if _, err := w.Append(r); err != nil {
			t.Fatal(err)
		}
	}
	return dir, w.KeyID()
}

func TestAuditReceiptCLI(t *testing.T) {
	dir, keyID := receiptRun(t)
	text, code := runCLI(t, "audit", "receipt", dir, "4", "--key-fingerprint", keyID)
	if code != 0 || !strings.Contains(text, "usage     5 input, 6 output tokens") || !strings.Contains(text, "request   seq 3 inference.requested") {
		t.Fatalf("text receipt: exit %d\n%s", code, text)
	}
	out, code := runCLI(t, "audit", "receipt", dir, "4", "--key-fingerprint", keyID, "-o", "json")
	if code != 0 || strings.Count(out, "\n") != 1 {
		t.Fatalf("receipt -o json: exit %d\n%s", code, out)
	}
	rcpt := filepath.Join(t.TempDir(), "receipt.json")
	if err := os.WriteFile(rcpt, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	kept := filepath.Join(t.TempDir(), "pubkey.pem")
	pem, _ := os.ReadFile(filepath.Join(dir, audit.PublicKeyFile))
	os.WriteFile(kept, pem, 0o644)

	// Positive controls: pinned by fingerprint, by a kept key, by both.
	for _, pin := range [][]string{{"--key-fingerprint", keyID}, {"--key", kept}, {"--key", kept, "--key-fingerprint", keyID}} {
		got, code := runCLI(t, append([]string{"audit", "verify-receipt", rcpt, "--journal", dir}, pin...)...)
		if code != 0 || !strings.HasPrefix(got, "valid: inference moatreq_1, request seq 3, response seq 4") {
			t.Fatalf("verify-receipt %v: exit %d\n%s", pin, code, got)
		}
	}
	got, code := runCLI(t, "audit", "verify-receipt", rcpt, "--journal", filepath.Join(dir, audit.JournalFile), "--key-fingerprint", keyID, "-o", "json")
	var vj struct {
		Valid    bool `json:"valid"`
		ExitCode int  `json:"exit_code"`
	}
	if code != 0 || json.Unmarshal([]byte(got), &vj) != nil || !vj.Valid {
		t.Fatalf("verify-receipt -o json: exit %d\n%s", code, got)
	}

	tampered := filepath.Join(t.TempDir(), "tampered.json")
	os.WriteFile(tampered, []byte(strings.Replace(out, `"output_tokens":6`, `"output_tokens":600`, 1)), 0o644)
	truncated := filepath.Join(t.TempDir(), "journal.jsonl")
	raw, _ := os.ReadFile(filepath.Join(dir, audit.JournalFile))
	lines := strings.SplitAfter(string(raw), "\n")
	os.WriteFile(truncated, []byte(strings.Join(lines[:3], "")), 0o644)
	other, _ := receiptRun(t)
	for _, c := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"tampered usage", []string{tampered, "--journal", dir, "--key-fingerprint", keyID}, 1, "usage differs"},
		{"journal cut before the response", []string{rcpt, "--journal", truncated, "--key", kept}, 1, "ends after 3 complete lines"},
		{"wrong fingerprint", []string{rcpt, "--journal", dir, "--key-fingerprint", strings.Repeat("0", 64)}, 1, "not the pinned"},
		{"another run's key", []string{rcpt, "--journal", dir, "--key", filepath.Join(other, audit.PublicKeyFile)}, 1, "wrong key"},
		{"another run's journal and key", []string{rcpt, "--journal", other}, 125, "needs a pinned key"},
		{"no journal flag", []string{rcpt, "--key", kept}, 125, "needs --journal"},
		{"not a receipt", []string{kept, "--journal", dir, "--key", kept}, 1, "malformed receipt"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, code := runCLI(t, append([]string{"audit", "verify-receipt"}, c.args...)...)
			if code != c.code || !strings.Contains(got, c.want) {
				t.Fatalf("exit %d, want %d with %q:\n%s", code, c.code, c.want, got)
			}
		})
	}
	// receipt refuses what is no completed request, and a bad SEQ.
	for _, c := range []struct {
		seq  string
		code int
		want string
	}{{"2", 1, "no completed request"}, {"9", 1, "no completed request"}, {"x", 125, "not a line number"}} {
		if got, code := runCLI(t, "audit", "receipt", dir, c.seq); code != c.code || !strings.Contains(got, c.want) {
			t.Errorf("receipt SEQ %s: exit %d, want %d with %q\n%s", c.seq, code, c.code, c.want, got)
		}
	}
}
