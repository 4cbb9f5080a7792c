package evidence

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The broker cases' fixtures (testdata/faults/CASE) are the raw files of
// real passing runs of moat evidence run --suite faults (native
// sandboxes, the fake provider, the moat_test_hooks build for the
// interrupt cases): host.json, each sandbox's journal and key, the
// ledger.

// copyBrokerCase copies testdata/faults/name into dir.
func copyBrokerCase(t *testing.T, name, dir string) {
	t.Helper()
	src := filepath.Join("testdata", "faults", name)
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func readBrokerHost(t *testing.T, dir string) BrokerFaultHost {
	t.Helper()
	var h BrokerFaultHost
	b, err := os.ReadFile(filepath.Join(dir, FileFaultHost))
	if err != nil || json.Unmarshal(b, &h) != nil {
		t.Fatalf("host.json: %v", err)
	}
	return h
}

func writeBrokerHost(t *testing.T, dir string, h BrokerFaultHost) {
	t.Helper()
	b, _ := json.MarshalIndent(h, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, FileFaultHost), append(b, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestScoreBroker: each broker case's real run passes (the control), and
// each adverse or missing observation turns it to fail or invalid.
func TestScoreBroker(t *testing.T) {
	tests := []struct {
		cas  string
		name string
		edit func(h *BrokerFaultHost, o *BrokerObservations)
		want Outcome
		why  string
	}{
		{"workers-shared-budget", "pass", func(*BrokerFaultHost, *BrokerObservations) {}, OutcomePass, ""},
		{"workers-shared-budget", "overspent", func(h *BrokerFaultHost, o *BrokerObservations) { o.ProviderRequests++ }, OutcomeFail, "more than the parent budget"},
		{"workers-shared-budget", "stopped short", func(h *BrokerFaultHost, o *BrokerObservations) { o.ProviderRequests-- }, OutcomeFail, "fewer than the parent budget"},
		{"workers-shared-budget", "unrecorded", func(h *BrokerFaultHost, o *BrokerObservations) { o.ProviderUnrecorded = 1 }, OutcomeFail, "lack a durable pre-effect record"},
		{"workers-shared-budget", "journal cut", func(h *BrokerFaultHost, o *BrokerObservations) { o.Journals[2].Status = JournalIncomplete }, OutcomeFail, "unterminated prefix"},
		{"workers-shared-budget", "journal invalid", func(h *BrokerFaultHost, o *BrokerObservations) { o.Journals[2].Status = JournalInvalid }, OutcomeFail, "does not verify"},
		{"workers-shared-budget", "audit verify disagrees", func(h *BrokerFaultHost, o *BrokerObservations) { o.Journals[0].AuditVerifyExit = 1 }, OutcomeFail, "moat audit verify exited 1"},
		{"workers-shared-budget", "never refused", func(h *BrokerFaultHost, o *BrokerObservations) { o.Journals[1].BudgetRefusals = 0 }, OutcomeInvalid, "no budget refusal"},
		{"workers-shared-budget", "refusal unexplained", func(h *BrokerFaultHost, o *BrokerObservations) { o.RefusalsUnexplained = 1 }, OutcomeFail, "without a detail"},
		{"workers-shared-budget", "ledger open", func(h *BrokerFaultHost, o *BrokerObservations) { o.LedgerOpen = 1 }, OutcomeFail, "open reservations"},
		{"workers-shared-budget", "seven children", func(h *BrokerFaultHost, o *BrokerObservations) { o.Journals = o.Journals[:7] }, OutcomeFail, ""},
		{"workers-shared-budget", "precondition", func(h *BrokerFaultHost, o *BrokerObservations) { h.Precondition = "create failed" }, OutcomeInvalid, "precondition: create failed"},
		{"interrupt-pre-durable", "pass", func(*BrokerFaultHost, *BrokerObservations) {}, OutcomePass, ""},
		{"interrupt-pre-durable", "record written", func(h *BrokerFaultHost, o *BrokerObservations) { o.Journals[0].Requested = 2 }, OutcomeFail, "2 pre-effect records, want 1"},
		{"interrupt-pre-send", "pass", func(*BrokerFaultHost, *BrokerObservations) {}, OutcomePass, ""},
		{"interrupt-pre-send", "sent anyway", func(h *BrokerFaultHost, o *BrokerObservations) { o.ProviderRequests = 2 }, OutcomeFail, "the provider received 2 requests, want 1"},
		{"interrupt-pre-send", "refunded", func(h *BrokerFaultHost, o *BrokerObservations) { o.LedgerOpen, o.LedgerOpenTokens = 0, 0 }, OutcomeFail, "uncertain charge was not kept"},
		{"interrupt-pre-send", "no ledger", func(h *BrokerFaultHost, o *BrokerObservations) { o.LedgerRequests = -1 }, OutcomeInvalid, "no ledger account"},
		{"interrupt-pre-send", "complete journal", func(h *BrokerFaultHost, o *BrokerObservations) { o.Journals[0].Status = JournalComplete }, OutcomeFail, "journal is complete"},
		{"interrupt-pre-send", "audit verify exit 0", func(h *BrokerFaultHost, o *BrokerObservations) { o.Journals[0].AuditVerifyExit = 0 }, OutcomeFail, "want exit 2"},
		{"interrupt-pre-send", "no marker", func(h *BrokerFaultHost, o *BrokerObservations) { h.Marker, h.MarkerMS = "", 0 }, OutcomeInvalid, "did not report stopping"},
		{"interrupt-pre-send", "marker of another process", func(h *BrokerFaultHost, o *BrokerObservations) { h.SupervisorPID++ }, OutcomeInvalid, "is not the supervisor's"},
		{"interrupt-pre-send", "supervisor running", func(h *BrokerFaultHost, o *BrokerObservations) { h.SupervisorState = "S" }, OutcomeInvalid, "not stopped"},
		{"interrupt-pre-send", "no control", func(h *BrokerFaultHost, o *BrokerObservations) { o.Journals[0].Completed = 0 }, OutcomeInvalid, "positive control"},
		{"interrupt-pre-send", "not applicable", func(h *BrokerFaultHost, o *BrokerObservations) { h.Precondition = faultHooksNotApplicable }, OutcomeInvalid, "not applicable without --hooks-binary"},
		{"interrupt-pre-complete", "pass", func(*BrokerFaultHost, *BrokerObservations) {}, OutcomePass, ""},
		{"interrupt-pre-complete", "unrecorded", func(h *BrokerFaultHost, o *BrokerObservations) { o.ProviderUnrecorded = 1 }, OutcomeFail, "lack a durable pre-effect record"},
		{"interrupt-pre-complete", "completed", func(h *BrokerFaultHost, o *BrokerObservations) { o.Journals[0].Completed = 2 }, OutcomeFail, "2 completion records"},
		{"interrupt-pre-complete", "settled", func(h *BrokerFaultHost, o *BrokerObservations) { o.LedgerOpen = 0 }, OutcomeFail, "uncertain charge was not kept"},
		{"approval-substitution", "pass", func(*BrokerFaultHost, *BrokerObservations) {}, OutcomePass, ""},
		{"approval-substitution", "substitute sent", func(h *BrokerFaultHost, o *BrokerObservations) { o.SubstitutedAtProvider, o.ProviderRequests = 1, 2 }, OutcomeFail, "substituted request (digest B) reached the provider"},
		{"approval-substitution", "approved twice", func(h *BrokerFaultHost, o *BrokerObservations) { o.ApprovedAtProvider, o.ProviderRequests = 2, 2 }, OutcomeFail, "2 times, want once"},
		{"approval-substitution", "substitute accepted", func(h *BrokerFaultHost, o *BrokerObservations) { h.SubstituteExit = 0 }, OutcomeFail, "approving B with A's digest succeeded"},
		{"approval-substitution", "replay accepted", func(h *BrokerFaultHost, o *BrokerObservations) { h.ReplayExit = 0 }, OutcomeFail, "approving A a second time succeeded"},
		{"approval-substitution", "not journaled", func(h *BrokerFaultHost, o *BrokerObservations) { o.SubstitutionJournaled = false }, OutcomeFail, "no approval.substitution"},
		{"approval-substitution", "refusal not journaled", func(h *BrokerFaultHost, o *BrokerObservations) { o.SubstitutedRefused = false }, OutcomeFail, "refusal (approval_substituted) is not journaled"},
		{"approval-substitution", "sent before decided", func(h *BrokerFaultHost, o *BrokerObservations) { o.ApprovedBeforeSend = false }, OutcomeFail, "durable approval.decided"},
		{"approval-substitution", "approved never sent", func(h *BrokerFaultHost, o *BrokerObservations) { o.ApprovedAtProvider, o.ProviderRequests = 0, 0 }, OutcomeInvalid, "positive control"},
		{"approval-substitution", "same digests", func(h *BrokerFaultHost, o *BrokerObservations) { h.DigestB = h.DigestA }, OutcomeInvalid, "different digests"},
	}
	for _, tt := range tests {
		t.Run(tt.cas+"/"+tt.name, func(t *testing.T) {
			c, _ := faultCaseByName(tt.cas)
			dir := t.TempDir()
			copyBrokerCase(t, tt.cas, dir)
			h, o, err := ObserveBrokerFault(dir)
			if err != nil {
				t.Fatal(err)
			}
			tt.edit(&h, &o)
			got, why := scoreBroker(c, h, o)
			if got != tt.want || !strings.Contains(strings.Join(why, "; "), tt.why) {
				t.Fatalf("got %s %q, want %s with %q", got, why, tt.want, tt.why)
			}
		})
	}
}

// TestFaultsBrokerTamper: raw files of the broker cases changed after the
// run are caught, re-signed or not; TestFaultsBundleVerifies is the
// control.
func TestFaultsBrokerTamper(t *testing.T) {
	edits := []struct {
		name, cas string
		edit      func(t *testing.T, dir string)
		want      string
	}{
		{"an extra provider request", "workers-shared-budget", func(t *testing.T, dir string) {
			h := readBrokerHost(t, dir)
			h.Provider = append(h.Provider, h.Provider[0])
			writeBrokerHost(t, dir, h)
		}, "recorded outcome"},
		{"a provider request without its record", "interrupt-pre-complete", func(t *testing.T, dir string) {
			h := readBrokerHost(t, dir)
			h.Provider[1].PreEffect = ""
			writeBrokerHost(t, dir, h)
		}, "recorded outcome"},
		{"the substitute reached the provider", "approval-substitution", func(t *testing.T, dir string) {
			h := readBrokerHost(t, dir)
			h.Provider = append(h.Provider, ProviderHit{Path: "/v1/messages", BodySHA256: h.DigestB})
			writeBrokerHost(t, dir, h)
		}, "recorded outcome"},
		{"a refunded ledger", "interrupt-pre-send", func(t *testing.T, dir string) {
			p := filepath.Join(dir, FileFaultLedger)
			b, _ := os.ReadFile(p)
			var st map[string]any
			if err := json.Unmarshal(b, &st); err != nil {
				t.Fatal(err)
			}
			st["reservations"] = map[string]any{}
			nb, _ := json.Marshal(st)
			os.WriteFile(p, nb, 0o644)
		}, "recorded outcome"},
		{"a flipped journal byte", "workers-shared-budget", func(t *testing.T, dir string) {
			p := filepath.Join(dir, "journal-w3.jsonl")
			b, _ := os.ReadFile(p)
			b[len(b)/2] ^= 1
			os.WriteFile(p, b, 0o644)
		}, "recorded outcome"},
		{"a journal of another sandbox", "approval-substitution", func(t *testing.T, dir string) {
			b, _ := os.ReadFile(filepath.Join(dir, "journal-a.jsonl"))
			os.WriteFile(filepath.Join(dir, "journal-zz.jsonl"), b, 0o644)
		}, "which host.json does not name"},
		{"a file no bundle holds", "interrupt-pre-durable", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, "journal.jsonl"), []byte("x"), 0o644)
		}, "not a file that a faults bundle holds"},
	}
	for _, e := range edits {
		for _, resign := range []bool{false, true} {
			t.Run(e.name+map[bool]string{false: "", true: "/resigned"}[resign], func(t *testing.T) {
				dir, rep := faultsBundle(t)
				e.edit(t, filepath.Join(dir, CasesDir, e.cas))
				want := "manifest"
				if resign {
					resignFaults(t, dir, rep)
					want = e.want
				}
				r := VerifyBundle(dir, "")
				if r.Verdict != VerdictInvalid || !strings.Contains(strings.Join(r.Problems, "\n"), want) {
					t.Fatalf("verdict %v, problems %q; want invalid with %q", r.Verdict, r.Problems, want)
				}
			})
		}
	}
}

func FuzzObserveBrokerFault(f *testing.F) {
	for _, c := range []string{"workers-shared-budget", "interrupt-pre-send", "approval-substitution"} {
		b, err := os.ReadFile(filepath.Join("testdata", "faults", c, FileFaultHost))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"sandboxes":["a","a"]}`))
	f.Add([]byte(`{"sandboxes":["../x"],"provider":[{"pre_effect":"{}"}]}`))
	cases := []FaultCase{}
	for _, c := range FaultCases {
		if c.Kind != FaultKindSupervisor {
			cases = append(cases, c)
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, FileFaultHost), b, 0o644); err != nil {
			t.Fatal(err)
		}
		h, o, err := ObserveBrokerFault(dir)
		if err != nil {
			return
		}
		for _, c := range cases {
			if got, why := scoreBroker(c, h, o); got == OutcomePass {
				t.Fatalf("%s passes with no journal: %v", c.Name, why)
			}
		}
	})
}
