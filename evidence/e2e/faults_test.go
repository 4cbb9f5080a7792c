package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/evidence"
)

// runMoat runs the moat binary and returns its stdout, stderr and exit
// code.
func runMoat(t *testing.T, moat string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(moat, args...)
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return so.String(), se.String(), ee.ExitCode()
	case err != nil:
		t.Fatal(err)
	}
	return so.String(), se.String(), 0
}

// TestEvidenceFaultsSuite runs `moat evidence run --suite faults` with the
// real binary: the supervisor of a moat sandbox stopped and killed, each
// after a healthy-supervisor control; both cases pass from host-side
// observations, the bundle verifies pinned, and a flipped raw observation
// makes it invalid.
func TestEvidenceFaultsSuite(t *testing.T) {
	moat, _ := bins(t)
	out := filepath.Join(t.TempDir(), "faults")
	so, se, code := runMoat(t, moat, "evidence", "run", "--suite", "faults", "--out", out, "-o", "json")
	var res struct {
		Complete       bool             `json:"complete"`
		Summary        evidence.Summary `json:"summary"`
		ManifestSHA256 string           `json:"manifest_sha256"`
		SuiteKeyID     string           `json:"suite_keyid"`
	}
	if err := json.Unmarshal([]byte(so), &res); err != nil || code != 0 || !res.Complete || res.Summary.Pass != len(evidence.FaultCases) {
		t.Fatalf("evidence run --suite faults: exit %d, %v\n%s\n%s", code, err, so, se)
	}
	for _, c := range evidence.FaultCases {
		var h evidence.FaultHost
		b, err := os.ReadFile(filepath.Join(out, "cases", c.Name, evidence.FileFaultHost))
		if err != nil || json.Unmarshal(b, &h) != nil {
			t.Fatalf("%s: host.json: %v", c.Name, err)
		}
		if h.AuditVerifyExit != 2 || h.WorkloadPID == 0 || h.Samples[len(h.Samples)-1].WorkloadStart != "" {
			t.Errorf("%s: host.json does not show the workload's death and an intact prefix: %s", c.Name, b)
		}
	}
	// Positive control: the untouched bundle verifies, pinned.
	if so, se, code := runMoat(t, moat, "evidence", "verify", out, "--manifest-sha256", res.ManifestSHA256, "--suite-key-fingerprint", res.SuiteKeyID); code != 0 || !strings.Contains(so, "valid and complete: 2 pass") {
		t.Fatalf("verify: exit %d\n%s\n%s", code, so, se)
	}
	// A flipped raw observation: the workload alive at the last sample.
	hp := filepath.Join(out, "cases", "supervisor-stop", evidence.FileFaultHost)
	var h evidence.FaultHost
	b, _ := os.ReadFile(hp)
	if err := json.Unmarshal(b, &h); err != nil {
		t.Fatal(err)
	}
	h.Samples[len(h.Samples)-1].WorkloadStart = h.WorkloadStart
	nb, _ := json.MarshalIndent(h, "", "  ")
	os.WriteFile(hp, append(nb, '\n'), 0o644)
	if so, se, code := runMoat(t, moat, "evidence", "verify", out); code != 1 || !strings.Contains(se, "cases/supervisor-stop/host.json") {
		t.Fatalf("verify of a tampered bundle: exit %d, want 1 naming host.json\n%s\n%s", code, so, se)
	}
	// An unknown suite is refused before anything runs.
	if _, se, code := runMoat(t, moat, "evidence", "run", "--suite", "nope", "--out", filepath.Join(t.TempDir(), "x")); code != 125 || !strings.Contains(se, "--suite") {
		t.Fatalf("--suite nope: exit %d\n%s", code, se)
	}
	if _, se, code := runMoat(t, moat, "evidence", "run", "--suite", "faults", "--backend", "gvisor", "--out", filepath.Join(t.TempDir(), "x")); code != 125 || !strings.Contains(se, "native backend") {
		t.Fatalf("--suite faults --backend gvisor: exit %d\n%s", code, se)
	}
}

// TestEvidenceFaultsSubset: one case is a subset bundle (verify exit 2).
func TestEvidenceFaultsSubset(t *testing.T) {
	moat, _ := bins(t)
	out := filepath.Join(t.TempDir(), "faults")
	if so, se, code := runMoat(t, moat, "evidence", "run", "--suite", "faults", "--case", "supervisor-kill", "--out", out); code != 0 {
		t.Fatalf("run: exit %d\n%s\n%s", code, so, se)
	}
	if so, se, code := runMoat(t, moat, "evidence", "verify", out); code != 2 || !strings.Contains(so, "SUBSET") {
		t.Fatalf("verify: exit %d, want 2\n%s\n%s", code, so, se)
	}
}
