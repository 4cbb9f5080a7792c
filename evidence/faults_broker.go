package evidence

import (
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/internal/ledger"
)

// The faults suite's broker cases (issue 14): simultaneous workers under
// one parent budget, interruption at three audit stages, substitution
// during a pending approval. Each runs real native sandboxes against a
// local fake provider (internal/fakeprovider) and records, in host.json,
// the provider's own request log (what reached it, with the
// Moat-Pre-Effect line it carried), the moat commands' exit codes and,
// beside it, each sandbox's journal and key and the budget ledger as moat
// left them on disk. ScoreFault decides from those alone.

// Fault case kinds.
const (
	FaultKindSupervisor = "supervisor" // the supervisor is stopped or killed
	FaultKindWorkers    = "workers"    // ≥ 8 child sandboxes draw on one parent budget at once
	FaultKindInterrupt  = "interrupt"  // moat is killed at an audit stage (the fault hook)
	FaultKindApproval   = "approval"   // a substitution during a pending approval
)

// Broker case parameters, fixed by the case list.
const (
	faultWorkersChildren = 8
	faultWorkersConc     = 4  // goroutines per child
	faultWorkersBudget   = 24 // the parent's inference.max_requests
	faultModel           = "claude-faults"
	// FileFaultLedger is the budget ledger (ledger.json) as moat left it.
	FileFaultLedger = "ledger.json"
)

// faultHooksNotApplicable is an interrupt case's precondition without
// the hooks binary.
const faultHooksNotApplicable = "not applicable without --hooks-binary: this case stops moat's broker at an audit stage through the test-only fault hook (MOAT_FAULT_STAGE), which only moat built with -tags moat_test_hooks has (--hooks-binary F, default $MOAT_HOOKS_BIN); a normal moat refuses MOAT_FAULT_STAGE with exit 125, so the case was not run"

// ProviderHit is one request as the fake provider received it: its own
// log, kept by the controller, never by moat.
type ProviderHit struct {
	Path       string `json:"path"`
	BodySHA256 string `json:"body_sha256"`
	// PreEffect is the decoded Moat-Pre-Effect header: the journal line
	// the broker made durable before sending ("" when absent).
	PreEffect string `json:"pre_effect"`
}

// BrokerFaultHost is host.json of a broker case: what the controller saw,
// raw.
type BrokerFaultHost struct {
	Precondition string `json:"precondition,omitempty"`
	// Sandboxes whose journals lie beside host.json as
	// journal-NAME.jsonl and pubkey-NAME.pem, in order; Root is the
	// sandbox whose ledger account is the budget (the parent).
	Sandboxes []string `json:"sandboxes"`
	Root      string   `json:"root"`
	// AuditVerify is each sandbox's moat audit verify exit code (-1: not
	// run), AuditVerifyOutput its output (cut).
	AuditVerify       map[string]int    `json:"audit_verify"`
	AuditVerifyOutput map[string]string `json:"audit_verify_output"`
	Provider          []ProviderHit     `json:"provider"`
	// Budget is the root's inference.max_requests.
	Budget int `json:"budget"`
	// Interrupt: the stage, the marker the hook wrote ("STAGE PID"), when
	// it was seen, the supervisor's pid and state letter then, and the
	// SIGKILL.
	Stage           string `json:"stage,omitempty"`
	Marker          string `json:"marker,omitempty"`
	MarkerMS        int64  `json:"marker_ms,omitempty"`
	SupervisorPID   int    `json:"supervisor_pid,omitempty"`
	SupervisorState string `json:"supervisor_state,omitempty"`
	SignalMS        int64  `json:"signal_ms,omitempty"`
	SignalError     string `json:"signal_error,omitempty"`
	// Approval: the two held requests (A approved, B the substitution's
	// target), their digests as moat approvals list printed them, and the
	// exit codes of approving B with A's digest, approving A, and
	// approving A again (a replay).
	ApprovalA        string `json:"approval_a,omitempty"`
	DigestA          string `json:"digest_a,omitempty"`
	ApprovalB        string `json:"approval_b,omitempty"`
	DigestB          string `json:"digest_b,omitempty"`
	SubstituteExit   int    `json:"substitute_exit,omitempty"`
	ApproveExit      int    `json:"approve_exit,omitempty"`
	ReplayExit       int    `json:"replay_exit,omitempty"`
	CommandsOutput   string `json:"commands_output,omitempty"`
	WorkloadOutput   string `json:"workload_output,omitempty"` // supporting only
	WorkloadExitCode int    `json:"workload_exit_code,omitempty"`
}

// BrokerJournal is one sandbox's journal, verified natively.
type BrokerJournal struct {
	Sandbox         string `json:"sandbox"`
	Status          string `json:"status"` // JournalMissing | Invalid | Incomplete | Complete
	Reason          string `json:"reason,omitempty"`
	Records         int    `json:"records"`
	Requested       int    `json:"requested"`       // inference.requested
	Completed       int    `json:"completed"`       // inference.completed
	BudgetRefusals  int    `json:"budget_refusals"` // inference.refused budget_exhausted
	AuditVerifyExit int    `json:"audit_verify_exit"`
}

// BrokerObservations are what a broker case's raw files give.
type BrokerObservations struct {
	Journals         []BrokerJournal `json:"journals"`
	ProviderRequests int             `json:"provider_requests"`
	// ProviderUnrecorded counts the provider's requests without a durable
	// pre-effect record: no Moat-Pre-Effect line byte-identical to an
	// inference.requested line of a case journal that verifies, or one
	// whose body_sha256 is not the body's.
	ProviderUnrecorded int `json:"provider_unrecorded"`
	// The root's ledger account as ledger.json holds it (-1: no ledger),
	// and the reservations left open (charged, never settled).
	LedgerRequests int64 `json:"ledger_requests"`
	LedgerTokens   int64 `json:"ledger_tokens"`
	LedgerOpen     int   `json:"ledger_open"`
	// LedgerOpenTokens sums the open reservations' tokens.
	LedgerOpenTokens int64 `json:"ledger_open_tokens"`
	// RefusalsUnexplained counts budget refusals whose journaled detail
	// does not say the budget is spent.
	RefusalsUnexplained int `json:"refusals_unexplained"`
	// Approval case.
	ApprovedAtProvider    int  `json:"approved_at_provider"`    // provider requests with body digest A
	SubstitutedAtProvider int  `json:"substituted_at_provider"` // with body digest B
	SubstitutionJournaled bool `json:"substitution_journaled"`  // approval.substitution on B presenting A's digest
	ReplayJournaled       bool `json:"replay_journaled"`        // approval.substitution (replay) on A
	ApprovedBeforeSend    bool `json:"approved_before_send"`    // approval.decided (approved, digest A) before A's inference.requested
	SubstitutedRefused    bool `json:"substituted_refused"`     // inference.refused approval_substituted
}

// Compiled on first use, not in every moat process's start-up.
var brokerFileRE = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^(journal-[a-z0-9]{1,16}\.jsonl|pubkey-[a-z0-9]{1,16}\.pem)$`)
})

// brokerCaseFileOK says whether a broker case directory may hold fn.
func brokerCaseFileOK(fn string) bool {
	return fn == FileFaultHost || fn == FileFaultLedger || brokerFileRE().MatchString(fn)
}

func brokerJournalFile(sb string) string { return "journal-" + sb + ".jsonl" }
func brokerPubkeyFile(sb string) string  { return "pubkey-" + sb + ".pem" }

// ObserveBrokerFault recomputes a broker case's observations from its raw
// files in dir.
func ObserveBrokerFault(dir string) (BrokerFaultHost, BrokerObservations, error) {
	var h BrokerFaultHost
	o := BrokerObservations{Journals: []BrokerJournal{}, LedgerRequests: -1, LedgerTokens: -1}
	if err := readStrictJSON(filepath.Join(dir, FileFaultHost), &h); err != nil {
		return h, o, fmt.Errorf("%s: %w", FileFaultHost, err)
	}
	for i, sb := range h.Sandboxes {
		if !brokerFileRE().MatchString(brokerJournalFile(sb)) || slices.Contains(h.Sandboxes[:i], sb) {
			return h, o, fmt.Errorf("%s: sandbox name %q invalid or repeated", FileFaultHost, sb)
		}
	}
	// No journal or key of a sandbox the case does not name.
	ents, err := os.ReadDir(dir)
	if err != nil {
		return h, o, err
	}
	for _, e := range ents {
		n := e.Name()
		if !brokerFileRE().MatchString(n) {
			continue
		}
		sb := strings.TrimSuffix(strings.TrimSuffix(strings.TrimPrefix(strings.TrimPrefix(n, "journal-"), "pubkey-"), ".jsonl"), ".pem")
		if !slices.Contains(h.Sandboxes, sb) {
			return h, o, fmt.Errorf("%s: a file of sandbox %q, which %s does not name", n, sb, FileFaultHost)
		}
	}
	// Every inference.requested line of a journal that verifies.
	requested := map[string]string{} // line → body_sha256
	type rec struct {
		sb  string
		seq int
		e   *audit.Entry
	}
	var all []rec
	for _, sb := range h.Sandboxes {
		j := BrokerJournal{Sandbox: sb, Status: JournalMissing, AuditVerifyExit: -1}
		if v, ok := h.AuditVerify[sb]; ok {
			j.AuditVerifyExit = v
		}
		jb, jerr := readCapped(filepath.Join(dir, brokerJournalFile(sb)), maxJournalBytes)
		pb, perr := readCapped(filepath.Join(dir, brokerPubkeyFile(sb)), maxSmallFile)
		var pub ed25519.PublicKey
		switch {
		case jerr != nil && perr != nil:
		case jerr != nil || perr != nil:
			j.Status, j.Reason = JournalInvalid, "the journal or its public key is missing"
		default:
			var err error
			if pub, err = parsePublicKeyPEM(pb); err != nil {
				j.Status, j.Reason = JournalInvalid, "public key: "+err.Error()
				break
			}
			r := verifyJournal(jb, pub)
			j.Status, j.Reason, j.Records = r.Status, r.Reason, len(r.Records)
			if r.Status == JournalInvalid {
				break
			}
			for _, jr := range r.Records {
				e, err := audit.ParseLine([]byte(jr.Line))
				if err != nil {
					j.Status, j.Reason = JournalInvalid, fmt.Sprintf("line %d: %v", jr.Seq, err)
					break
				}
				all = append(all, rec{sb, jr.Seq, e})
				switch r := e.Record.(type) {
				case audit.InferenceRequested:
					j.Requested++
					requested[jr.Line] = r.BodySHA256
				case audit.InferenceCompleted:
					j.Completed++
				case audit.InferenceRefused:
					if r.Reason == "budget_exhausted" {
						j.BudgetRefusals++
						if !strings.Contains(r.Detail, "budget") {
							o.RefusalsUnexplained++
						}
					}
					if r.Reason == "approval_substituted" {
						o.SubstitutedRefused = true
					}
				}
			}
		}
		o.Journals = append(o.Journals, j)
	}
	o.ProviderRequests = len(h.Provider)
	for _, p := range h.Provider {
		if sum, ok := requested[p.PreEffect]; !ok || sum != p.BodySHA256 {
			o.ProviderUnrecorded++
		}
		if h.DigestA != "" && p.BodySHA256 == h.DigestA {
			o.ApprovedAtProvider++
		}
		if h.DigestB != "" && p.BodySHA256 == h.DigestB {
			o.SubstitutedAtProvider++
		}
	}
	// The approval records, in journal order.
	decidedA := false
	for _, r := range all {
		switch x := r.e.Record.(type) {
		case audit.ApprovalDecided:
			if h.ApprovalA != "" && x.ApprovalID == h.ApprovalA && x.Decision == audit.ApprovalApproved && x.RequestSHA256 == h.DigestA {
				decidedA = true
			}
		case audit.InferenceRequested:
			if h.DigestA != "" && x.BodySHA256 == h.DigestA && decidedA {
				o.ApprovedBeforeSend = true
			}
		case audit.ApprovalSubstitution:
			if h.ApprovalB != "" && x.ApprovalID == h.ApprovalB && x.PresentedSHA256 == h.DigestA && x.RequestSHA256 == h.DigestB {
				o.SubstitutionJournaled = true
			}
			if h.ApprovalA != "" && x.ApprovalID == h.ApprovalA && x.Reason == audit.SubstitutionReplay {
				o.ReplayJournaled = true
			}
		}
	}
	if lb, err := readCapped(filepath.Join(dir, FileFaultLedger), maxSmallFile); err == nil {
		var st ledger.State
		if err := json.Unmarshal(lb, &st); err != nil {
			return h, o, fmt.Errorf("%s: %w", FileFaultLedger, err)
		}
		if a := st.Accounts[h.Root]; a != nil {
			o.LedgerRequests, o.LedgerTokens = a.Requests, a.Tokens
		}
		o.LedgerOpen = len(st.Reservations)
		for _, r := range st.Reservations {
			if r != nil {
				o.LedgerOpenTokens += r.Tokens
			}
		}
	}
	return h, o, nil
}

// scoreBroker decides a broker case's outcome from its raw observations:
// adverse observations fail it, missing evidence makes it invalid.
func scoreBroker(c FaultCase, h BrokerFaultHost, o BrokerObservations) (Outcome, []string) {
	var adverse, missing []string
	bad := func(s string, a ...any) { adverse = append(adverse, fmt.Sprintf(s, a...)) }
	miss := func(s string, a ...any) { missing = append(missing, fmt.Sprintf(s, a...)) }
	if h.Precondition != "" {
		return OutcomeInvalid, []string{"precondition: " + h.Precondition}
	}
	if len(o.Journals) == 0 {
		miss("no sandbox journal recorded")
	}
	if o.ProviderUnrecorded > 0 {
		bad("%d of the %d requests that reached the provider lack a durable pre-effect record in a journal that verifies", o.ProviderUnrecorded, o.ProviderRequests)
	}
	requested, completed := 0, 0
	for _, j := range o.Journals {
		requested += j.Requested
		completed += j.Completed
		switch {
		case j.Status == JournalMissing:
			miss("%s: no journal", j.Sandbox)
		case j.Status == JournalInvalid:
			bad("%s: the journal does not verify: %s", j.Sandbox, j.Reason)
		case j.AuditVerifyExit == -1:
			miss("%s: moat audit verify was not run", j.Sandbox)
		}
	}
	switch c.Kind {
	case FaultKindWorkers:
		if len(o.Journals) < faultWorkersChildren {
			miss("%d child journals, want %d", len(o.Journals), faultWorkersChildren)
		}
		for _, j := range o.Journals {
			if j.Status == JournalIncomplete {
				bad("%s: the journal is an unterminated prefix after moat sandbox delete: %s", j.Sandbox, j.Reason)
			}
			if j.Status == JournalComplete && j.AuditVerifyExit != 0 {
				bad("%s: moat audit verify exited %d on a journal that verifies complete natively (want 0)", j.Sandbox, j.AuditVerifyExit)
			}
			if j.Status != JournalMissing && j.BudgetRefusals == 0 {
				miss("%s: no budget refusal journaled: its workers never reached the end of the budget", j.Sandbox)
			}
		}
		if h.Budget <= 0 {
			miss("no budget recorded")
		}
		if o.ProviderRequests > h.Budget {
			bad("the provider received %d requests, more than the parent budget of %d", o.ProviderRequests, h.Budget)
		} else if o.ProviderRequests < h.Budget {
			bad("the provider received %d requests, fewer than the parent budget of %d: workers were refused with budget left", o.ProviderRequests, h.Budget)
		}
		if requested != o.ProviderRequests {
			bad("the child journals hold %d pre-effect records, the provider received %d requests", requested, o.ProviderRequests)
		}
		if o.RefusalsUnexplained > 0 {
			bad("%d budget refusals are journaled without a detail that says the budget is spent", o.RefusalsUnexplained)
		}
		if o.LedgerRequests < 0 {
			miss("no ledger account of the parent %q", h.Root)
		} else if o.LedgerRequests != int64(h.Budget) || o.LedgerOpen != 0 {
			bad("the ledger holds %d requests of the parent (budget %d) and %d open reservations", o.LedgerRequests, h.Budget, o.LedgerOpen)
		}
	case FaultKindInterrupt:
		// One control request completes, then the faulted one stops at
		// the stage.
		want := map[string][2]int{ // stage → {pre-effect records, provider requests}
			"pre-durable": {1, 1}, "pre-send": {2, 1}, "pre-complete": {2, 2}}[c.Stage]
		if h.Stage != c.Stage || h.MarkerMS == 0 || !strings.HasPrefix(h.Marker, c.Stage+" ") {
			miss("the fault hook did not report stopping at %s (marker %q)", c.Stage, h.Marker)
		} else if h.Marker != fmt.Sprintf("%s %d", c.Stage, h.SupervisorPID) {
			miss("the marker %q is not the supervisor's (pid %d)", h.Marker, h.SupervisorPID)
		}
		if h.SupervisorState != "T" && h.MarkerMS != 0 {
			miss("the supervisor was in state %q, not stopped (T), before the SIGKILL", h.SupervisorState)
		}
		if h.SignalMS == 0 || h.SignalError != "" {
			miss("the SIGKILL was not delivered: %s", h.SignalError)
		}
		for _, j := range o.Journals {
			if j.Status == JournalComplete {
				bad("%s: the journal is complete although moat was killed before closing it", j.Sandbox)
			}
			if j.Status == JournalIncomplete && j.AuditVerifyExit != 2 {
				bad("%s: moat audit verify exited %d on a journal that verifies natively as an intact prefix (want exit 2)", j.Sandbox, j.AuditVerifyExit)
			}
		}
		if completed < 1 || o.ProviderRequests < 1 {
			miss("positive control: the first request was not served and completed (%d completion records, %d provider requests)", completed, o.ProviderRequests)
		} else {
			if completed != 1 {
				bad("%d completion records, want the control's only", completed)
			}
			if requested != want[0] {
				bad("%d pre-effect records, want %d when moat stops %s", requested, want[0], c.Stage)
			}
			if o.ProviderRequests != want[1] {
				bad("the provider received %d requests, want %d when moat stops %s", o.ProviderRequests, want[1], c.Stage)
			}
		}
		if c.Stage != "pre-durable" {
			switch {
			case o.LedgerRequests < 0:
				miss("no ledger account of %q", h.Root)
			case o.LedgerRequests != 2 || o.LedgerOpen != 1 || o.LedgerOpenTokens != faultsWorkerMaxTokens:
				bad("the uncertain charge was not kept: the ledger holds %d requests and %d open reservations of %d tokens (want 2 requests and the faulted one's reservation of %d tokens, open)", o.LedgerRequests, o.LedgerOpen, o.LedgerOpenTokens, faultsWorkerMaxTokens)
			}
		}
	case FaultKindApproval:
		for _, j := range o.Journals {
			if j.Status == JournalIncomplete {
				bad("%s: the journal is an unterminated prefix after moat sandbox delete: %s", j.Sandbox, j.Reason)
			}
			if j.Status == JournalComplete && j.AuditVerifyExit != 0 {
				bad("%s: moat audit verify exited %d (want 0)", j.Sandbox, j.AuditVerifyExit)
			}
		}
		if h.DigestA == "" || h.DigestB == "" || h.DigestA == h.DigestB || h.ApprovalA == "" || h.ApprovalB == "" {
			miss("two held requests with different digests were not recorded")
		}
		if o.SubstitutedAtProvider > 0 {
			bad("the substituted request (digest B) reached the provider %d times", o.SubstitutedAtProvider)
		}
		if o.ApprovedAtProvider > 1 {
			bad("the approved request reached the provider %d times, want once", o.ApprovedAtProvider)
		}
		if o.ProviderRequests > o.ApprovedAtProvider+o.SubstitutedAtProvider {
			bad("the provider received %d requests that are neither held request", o.ProviderRequests-o.ApprovedAtProvider-o.SubstitutedAtProvider)
		}
		if h.SubstituteExit == 0 {
			bad("approving B with A's digest succeeded (exit 0)")
		}
		if h.ReplayExit == 0 {
			bad("approving A a second time succeeded (exit 0)")
		}
		if !o.SubstitutionJournaled {
			bad("no approval.substitution on B presenting A's digest in the journal")
		}
		if !o.SubstitutedRefused {
			bad("the substituted request's refusal (approval_substituted) is not journaled")
		}
		if !o.ReplayJournaled {
			bad("the replayed approval of A is not journaled as a substitution")
		}
		if o.ApprovedAtProvider == 0 {
			miss("positive control: the approved request A never reached the provider")
		} else if !o.ApprovedBeforeSend {
			bad("A's pre-effect record does not follow its durable approval.decided")
		}
	default:
		miss("unknown case kind %q", c.Kind)
	}
	switch {
	case len(adverse) > 0:
		return OutcomeFail, append(adverse, missing...)
	case len(missing) > 0:
		return OutcomeInvalid, missing
	}
	return OutcomePass, []string{}
}

// observeFaultCase recomputes any faults case's observations from dir and
// scores them.
func observeFaultCase(dir string, c FaultCase) (FaultObservations, Outcome, []string, error) {
	if c.Kind == FaultKindSupervisor {
		h, o, err := ObserveFault(dir)
		if err != nil {
			return o, "", nil, err
		}
		outcome, reasons := ScoreFault(c, h, o)
		return o, outcome, reasons, nil
	}
	o := FaultObservations{DeathAfterMS: -1, Journal: JournalMissing, AuditVerifyExit: -1}
	h, bo, err := ObserveBrokerFault(dir)
	if err != nil {
		return o, "", nil, err
	}
	o.Broker = &bo
	// The summary columns: the worst journal.
	for _, j := range bo.Journals {
		if o.Journal == JournalMissing || journalRank(j.Status) < journalRank(o.Journal) {
			o.Journal, o.JournalReason, o.JournalRecords, o.AuditVerifyExit = j.Status, j.Reason, j.Records, j.AuditVerifyExit
		}
	}
	outcome, reasons := scoreBroker(c, h, bo)
	return o, outcome, reasons, nil
}

func journalRank(s string) int {
	return slices.Index([]string{JournalInvalid, JournalMissing, JournalIncomplete, JournalComplete}, s)
}
