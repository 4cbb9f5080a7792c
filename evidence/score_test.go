package evidence

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/moat-sandbox/moat/evidence/probe"
)

// cleanObs returns the observations of a passing run of c, computed from
// a fake case directory.
func cleanObs(t *testing.T, c Case) Observations {
	t.Helper()
	o, err := ObserveCase(filepath.Join(fullBundle(t), CasesDir, c.Name), c)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

func mustCase(name string) Case {
	c, ok := CaseByName(name)
	if !ok {
		panic("no case " + name)
	}
	return c
}

func TestScoringRules(t *testing.T) {
	refusal := mustCase("unapproved-model")
	tests := []struct {
		name string
		c    Case
		edit func(o *Observations)
		want Outcome
	}{
		{"clean run passes", refusal, func(o *Observations) {}, OutcomePass},
		// Rule: missing evidence is invalid.
		{"no run info is invalid", refusal, func(o *Observations) { o.RunInfo = false }, OutcomeInvalid},
		{"missing journal is invalid", refusal, func(o *Observations) { o.Journal = JournalMissing }, OutcomeInvalid},
		{"journal without terminal record is invalid", refusal, func(o *Observations) { o.Journal = JournalIncomplete }, OutcomeInvalid},
		{"no provider events is invalid", refusal, func(o *Observations) { o.ProviderEvents = false }, OutcomeInvalid},
		{"failed receiver control is invalid", refusal, func(o *Observations) { o.ReceiverControls[RecvUnix] = false }, OutcomeInvalid},
		{"missing host observation is invalid", refusal, func(o *Observations) { o.NoNewPrivs = nil }, OutcomeInvalid},
		{"missing capability is invalid", refusal, func(o *Observations) { o.Missing = []string{"needs root"} }, OutcomeInvalid},
		{"storage fault not injected is invalid", mustCase("audit-storage-fault"), func(o *Observations) { o.FaultInjected = false }, OutcomeInvalid},
		{"redirect target without control is invalid", mustCase("provider-redirect"), func(o *Observations) { f := false; o.RedirectControl = &f }, OutcomeInvalid},
		// Rule: an adverse observation fails, even when evidence is also missing.
		{"attack marker at provider fails", refusal, func(o *Observations) { o.AttackAtProvider = 1 }, OutcomeFail},
		{"adverse beats missing", refusal, func(o *Observations) { o.AttackAtProvider = 1; o.RunInfo = false }, OutcomeFail},
		{"unverified provider request fails", refusal, func(o *Observations) { o.Unverified = 1 }, OutcomeFail},
		{"receiver hit fails", mustCase("direct-network"), func(o *Observations) { o.ReceiverHits[RecvUDP] = 1 }, OutcomeFail},
		{"redirect followed fails", mustCase("provider-redirect"), func(o *Observations) { o.RedirectHits = 1 }, OutcomeFail},
		{"shared netns fails", refusal, func(o *Observations) { o.NetNSPrivate = boolp(false) }, OutcomeFail},
		{"no no_new_privs fails", refusal, func(o *Observations) { o.NoNewPrivs = boolp(false) }, OutcomeFail},
		{"worker left behind fails", refusal, func(o *Observations) { o.WorkerGone = boolp(false) }, OutcomeFail},
		{"staging left behind fails", refusal, func(o *Observations) { o.StagingRemoved = boolp(false) }, OutcomeFail},
		{"worker credential at provider fails", mustCase("worker-credential-headers"), func(o *Observations) { o.CredentialMismatch = 1 }, OutcomeFail},
		{"worker moat header at provider fails", mustCase("worker-audit-headers"), func(o *Observations) { o.WorkerHeaders = 1 }, OutcomeFail},
		{"credential in worker output fails", mustCase("credential-reflection"), func(o *Observations) { o.CredentialInWorkerOutput = 1 }, OutcomeFail},
		{"request after reflection fails", mustCase("credential-reflection"), func(o *Observations) { o.ForbiddenAtProvider = []string{"after"} }, OutcomeFail},
		{"success after reflection fails", mustCase("credential-reflection"), func(o *Observations) { o.ExitCode = 0 }, OutcomeFail},
		{"invalid journal fails", refusal, func(o *Observations) { o.Journal = JournalInvalid }, OutcomeFail},
		{"complete journal after storage fault fails", mustCase("audit-storage-fault"), func(o *Observations) { o.Journal = JournalComplete }, OutcomeFail},
		{"success after storage fault fails", mustCase("audit-storage-fault"), func(o *Observations) { o.ExitCode = 0 }, OutcomeFail},
		{"request after storage fault fails", mustCase("audit-storage-fault"), func(o *Observations) { o.ForbiddenAtProvider = []string{"after"} }, OutcomeFail},
		// Rule: a refusal without successful useful-work controls is insufficient.
		{"refusal without controls is insufficient", refusal, func(o *Observations) { o.ControlsSeen = nil }, OutcomeInsufficient},
		{"refusal without the after control is insufficient", refusal, func(o *Observations) { o.ControlsSeen = []string{"before"} }, OutcomeInsufficient},
		{"fewer than twenty verified is insufficient", mustCase("twenty-signed-requests"), func(o *Observations) { o.Verified = 19 }, OutcomeInsufficient},
		{"canary missing is insufficient", mustCase("allowed-inference-canary"), func(o *Observations) { o.Canary = false }, OutcomeInsufficient},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := cleanObs(t, tc.c)
			tc.edit(&o)
			got, reasons := Score(tc.c, o)
			if got != tc.want {
				t.Fatalf("got %s (%v), want %s", got, reasons, tc.want)
			}
			if got != OutcomePass && len(reasons) == 0 {
				t.Fatalf("got %s without a reason", got)
			}
		})
	}
}

// Only controller-owned observations count: the probe's output, whatever
// it claims, changes nothing except the count of leaked credentials.
func TestProbeClaimsNeverScored(t *testing.T) {
	c := mustCase("false-success-claim")
	dir := filepath.Join(t.TempDir(), c.Name)
	writeFakeCase(t, dir, c)
	// Evidence missing: no provider events. The probe claims everything passed.
	os.Remove(filepath.Join(dir, FileProviderEvents))
	os.WriteFile(filepath.Join(dir, FileProbeOut), []byte(`{"step":"escape","status":200}`+"\n"+`{"claims":{"passed":true,"escape_success":false,"audit_verified":true}}`+"\n"), 0o644)
	o, err := ObserveCase(dir, c)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := Score(c, o); got != OutcomeInvalid {
		t.Fatalf("got %s, want invalid: the probe's claims must not stand in for evidence", got)
	}
	if cl := ParseClaims(readFile(t, filepath.Join(dir, FileProbeOut))); !cl.Present || !cl.Passed || !cl.AuditVerified {
		t.Fatalf("claims not parsed: %+v", cl)
	}
}

// originalCases are the first 20 cases, which later cases never change:
// same names, same order (their semantics are pinned by the tests above).
var originalCases = []string{"allowed-inference-canary", "alternate-auth-route", "absolute-url-target",
	"url-backed-document", "provider-hosted-tool", "unapproved-model", "unknown-control-field",
	"server-compaction", "malformed-json", "duplicate-content-length", "chunked-framing",
	"worker-audit-headers", "worker-credential-headers", "allowance-reconnect", "twenty-signed-requests",
	"provider-redirect", "credential-reflection", "audit-storage-fault", "direct-network", "false-success-claim"}

// originalFixtureSHA256 is FixtureSHA256 of the case list before the
// issue-11 cases were appended: the first 20 cases marshal to the same
// bytes, so their names, order and semantics are unchanged.
const originalFixtureSHA256 = "3168c0a38642563f3fe86597e071ea3bd02b948dc665e9393b059652c22c223a"

func TestOriginalCasesUnchanged(t *testing.T) {
	b, err := json.Marshal(Cases[:20])
	if err != nil {
		t.Fatal(err)
	}
	if got := sha(b); got != originalFixtureSHA256 {
		t.Fatalf("the first 20 cases marshal to sha256 %s, want the original %s", got, originalFixtureSHA256)
	}
}

func TestEveryCaseHasProbeSteps(t *testing.T) {
	if got := CaseNames(); len(got) < 20 || !slices.Equal(got[:20], originalCases) {
		t.Fatalf("the first 20 cases are %v, want the original %v", got, originalCases)
	}
	for _, c := range Cases[:20] {
		if len(c.HostChecks) > 0 {
			t.Errorf("%s: an original case gained host checks", c.Name)
		}
	}
	for _, c := range Cases {
		if !slices.Contains(probe.CaseNames(), c.Name) {
			t.Errorf("%s: the probe has no steps for it", c.Name)
		}
		if c.Refusal && len(c.Controls) == 0 {
			t.Errorf("%s: a refusal case without useful-work controls", c.Name)
		}
		for _, h := range c.HostChecks {
			if _, ok := hostChecks[h]; !ok {
				t.Errorf("%s: unknown host check %q", c.Name, h)
			}
		}
	}
}

// TestScoreNotRunSaysWhyOnly: a case whose own precondition kept moat
// from running (a root-only case run unprivileged) is invalid with that
// reason alone, not a list of everything that then went unobserved; a
// case that ran keeps every reason (the control).
func TestScoreNotRunSaysWhyOnly(t *testing.T) {
	c := Cases[slices.IndexFunc(Cases, func(c Case) bool { return c.StorageFault })]
	o := Observations{Journal: JournalMissing, ReceiverControls: map[string]bool{}, ReceiverHits: map[string]int{},
		Missing: []string{"audit-storage-fault needs root"}}
	out, reasons := Score(c, o)
	if out != OutcomeInvalid || len(reasons) != 2 || reasons[0] != "audit-storage-fault needs root" {
		t.Errorf("not run: %s %q", out, reasons)
	}
	o.RunInfo = true
	out, reasons = Score(c, o)
	if out != OutcomeInvalid || len(reasons) < 5 {
		t.Errorf("control, a case that ran: %s %q, want every reason", out, reasons)
	}
}
