package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
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
// real binary and the moat_test_hooks build (--hooks-binary): the
// supervisor of a moat sandbox stopped and killed, each after a
// healthy-supervisor control; eight child sandboxes under one parent
// budget; moat killed at three audit stages by the fault hook; a
// substitution during a pending approval. Every case passes from
// host-side observations, the bundle verifies pinned, and a flipped raw
// observation (of a supervisor case, of a broker case) makes it invalid.
func TestEvidenceFaultsSuite(t *testing.T) {
	moat, _ := bins(t)
	hooks := hooksBin(t)
	out := filepath.Join(t.TempDir(), "faults")
	so, se, code := runMoat(t, moat, "evidence", "run", "--suite", "faults", "--hooks-binary", hooks, "--out", out, "-o", "json")
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
		b, err := os.ReadFile(filepath.Join(out, "cases", c.Name, evidence.FileFaultHost))
		if err != nil {
			t.Fatalf("%s: host.json: %v", c.Name, err)
		}
		if c.Kind != evidence.FaultKindSupervisor {
			var h evidence.BrokerFaultHost
			if err := json.Unmarshal(b, &h); err != nil {
				t.Fatalf("%s: host.json: %v", c.Name, err)
			}
			// What the provider's own log shows, per kind.
			want := map[string]int{evidence.FaultKindWorkers: h.Budget, evidence.FaultKindApproval: 1}[c.Kind]
			if c.Kind == evidence.FaultKindInterrupt {
				want = map[string]int{"pre-durable": 1, "pre-send": 1, "pre-complete": 2}[c.Stage]
			}
			if len(h.Provider) != want || want == 0 {
				t.Errorf("%s: the provider received %d requests, want %d", c.Name, len(h.Provider), want)
			}
			if c.Kind == evidence.FaultKindInterrupt && (h.AuditVerify["x"] != 2 || !strings.HasPrefix(h.Marker, c.Stage+" ")) {
				t.Errorf("%s: audit verify %v, marker %q", c.Name, h.AuditVerify, h.Marker)
			}
			continue
		}
		var h evidence.FaultHost
		if err := json.Unmarshal(b, &h); err != nil {
			t.Fatalf("%s: host.json: %v", c.Name, err)
		}
		if h.AuditVerifyExit != 2 || h.WorkloadPID == 0 || h.Samples[len(h.Samples)-1].WorkloadStart != "" {
			t.Errorf("%s: host.json does not show the workload's death and an intact prefix: %s", c.Name, b)
		}
	}
	// Positive control: the untouched bundle verifies, pinned.
	if so, se, code := runMoat(t, moat, "evidence", "verify", out, "--manifest-sha256", res.ManifestSHA256, "--suite-key-fingerprint", res.SuiteKeyID); code != 0 || !strings.Contains(so, fmt.Sprintf("valid and complete: %d pass", len(evidence.FaultCases))) {
		t.Fatalf("verify: exit %d\n%s\n%s", code, so, se)
	}
	// A broker case's provider log with one more request than the budget.
	wp := filepath.Join(out, "cases", "workers-shared-budget", evidence.FileFaultHost)
	orig, _ := os.ReadFile(wp)
	var wh evidence.BrokerFaultHost
	if err := json.Unmarshal(orig, &wh); err != nil {
		t.Fatal(err)
	}
	wh.Provider = append(wh.Provider, wh.Provider[0])
	nb, _ := json.MarshalIndent(wh, "", "  ")
	os.WriteFile(wp, append(nb, '\n'), 0o644)
	if so, se, code := runMoat(t, moat, "evidence", "verify", out); code != 1 || !strings.Contains(se, "cases/workers-shared-budget/host.json") {
		t.Fatalf("verify of a tampered broker case: exit %d, want 1 naming host.json\n%s\n%s", code, so, se)
	}
	os.WriteFile(wp, orig, 0o644)
	// A flipped raw observation: the workload alive at the last sample.
	hp := filepath.Join(out, "cases", "supervisor-stop", evidence.FileFaultHost)
	var h evidence.FaultHost
	b, _ := os.ReadFile(hp)
	if err := json.Unmarshal(b, &h); err != nil {
		t.Fatal(err)
	}
	h.Samples[len(h.Samples)-1].WorkloadStart = h.WorkloadStart
	nb, _ = json.MarshalIndent(h, "", "  ")
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

// TestEvidenceFaultsWithoutHooks: without the hooks binary (none given,
// $MOAT_HOOKS_BIN unset) an interrupt case is not run: it is invalid with
// the reason the case list states, and the run exits 1; in the same run
// the approval case (the normal binary's) passes, and the subset bundle
// verifies (exit 2). A normal moat refuses the hook's variable itself.
func TestEvidenceFaultsWithoutHooks(t *testing.T) {
	moat, _ := bins(t)
	out := filepath.Join(t.TempDir(), "faults")
	cmd := exec.Command(moat, "evidence", "run", "--suite", "faults", "--case", "interrupt-pre-send", "--case", "approval-substitution", "--out", out, "-o", "json")
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MOAT_HOOKS_BIN=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	so, err := cmd.Output()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("run without the hooks binary: %v, want exit 1\n%s", err, so)
	}
	b, err := os.ReadFile(filepath.Join(out, "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rep evidence.FaultsReport
	if err := json.Unmarshal(b, &rep); err != nil || len(rep.Cases) != 2 {
		t.Fatalf("report: %v\n%s", err, b)
	}
	if c := rep.Cases[0]; c.Outcome != evidence.OutcomeInvalid || len(c.Reasons) != 1 || !strings.Contains(c.Reasons[0], "not applicable without --hooks-binary") {
		t.Errorf("interrupt-pre-send without hooks: %s %q", c.Outcome, c.Reasons)
	}
	if c := rep.Cases[1]; c.Outcome != evidence.OutcomePass {
		t.Errorf("approval-substitution (control): %s %q", c.Outcome, c.Reasons)
	}
	if so, se, code := runMoat(t, moat, "evidence", "verify", out); code != 2 {
		t.Fatalf("verify: exit %d, want 2 (a valid subset)\n%s\n%s", code, so, se)
	}
	c := exec.Command(moat, "version")
	c.Env = append(os.Environ(), "MOAT_FAULT_STAGE=pre-send")
	if b, err := c.CombinedOutput(); !errors.As(err, &ee) || ee.ExitCode() != 125 || !strings.Contains(string(b), "moat_test_hooks") {
		t.Fatalf("normal moat with MOAT_FAULT_STAGE: %v\n%s", err, b)
	}
}
