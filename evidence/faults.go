package evidence

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
)

// The faults suite (issue 14) is a second report beside the containment
// suite, in its own bundle, never merged into its count. Each case records
// raw host-side observations (host.json: process samples by pid and start
// time, the signal sent; the journal and its public key as moat left
// them; the exit code of moat audit verify), and its outcome is decided
// from those alone, by ScoreFault, here and again by the offline verifier.
const (
	FaultsSuiteName     = "moat-faults-evidence"
	FaultsReportVersion = 1
	// FileFaultHost is a faults case's raw host observations.
	FileFaultHost = "host.json"
	// faultDeathWait bounds the wait for the workload's death after the
	// supervisor's loss, beyond process.supervisor_timeout.
	faultDeathWait = 15 * 1000 // ms
)

// FaultCase is one case of the faults suite.
type FaultCase struct {
	Name   string `json:"name"`
	Kind   string `json:"kind"`             // FaultKind*
	Signal string `json:"signal,omitempty"` // supervisor: sent to the supervisor of a moat sandbox, SIGSTOP or SIGKILL
	Stage  string `json:"stage,omitempty"`  // interrupt: the broker's audit stage (broker.FaultStages)
	// Hooks: the case runs the moat_test_hooks build (--hooks-binary);
	// without it the case is invalid, not run.
	Hooks bool   `json:"hooks,omitempty"`
	Doc   string `json:"doc"`
}

// FaultCases is the faults suite's fixed case list, in order.
var FaultCases = []FaultCase{
	{Name: "supervisor-stop", Kind: FaultKindSupervisor, Signal: "SIGSTOP", Doc: "the supervisor of a moat sandbox is stopped (SIGSTOP): the init's heartbeat watch kills the workload within process.supervisor_timeout, while the supervisor is still stopped; a healthy supervisor first kept it alive past twice the timeout; the journal is an intact prefix"},
	{Name: "supervisor-kill", Kind: FaultKindSupervisor, Signal: "SIGKILL", Doc: "the supervisor of a moat sandbox is killed (SIGKILL): the workload dies; a healthy supervisor first kept it alive past twice the timeout; the journal is an intact prefix"},
	{Name: "workers-shared-budget", Kind: FaultKindWorkers, Doc: "8 native child sandboxes (moat sandbox create --parent) under one parent budget of 24 requests, 4 workers each firing model requests at once until refused: the provider's own log holds exactly 24 requests, each with a durable pre-effect line of a child journal; every child journal verifies complete; each child's refusals are journaled as budget_exhausted with a detail that says the budget is spent; the ledger holds 24 requests and no open reservation"},
	{Name: "interrupt-pre-durable", Kind: FaultKindInterrupt, Stage: "pre-durable", Hooks: true, Doc: "moat (the sandbox's supervisor, whose broker the test-only fault hook stopped after a control request was served) is killed (SIGKILL) before the second request's pre-effect record is written: the journal is an intact prefix (moat audit verify exit 2), it holds the control's records only, and the provider got the control alone"},
	{Name: "interrupt-pre-send", Kind: FaultKindInterrupt, Stage: "pre-send", Hooks: true, Doc: "moat is killed after the second request's pre-effect record is durable, before the provider got it: the journal is an intact prefix with that record, the provider got the control alone, and the ledger keeps the uncertain reservation charged"},
	{Name: "interrupt-pre-complete", Kind: FaultKindInterrupt, Stage: "pre-complete", Hooks: true, Doc: "moat is killed after the provider answered the second request, before its budget settlement and completion record: the journal is an intact prefix, every provider request carries a durable pre-effect line of it, and the ledger keeps the uncertain reservation charged"},
	{Name: "approval-substitution", Kind: FaultKindApproval, Doc: "two requests of a sandbox are held for approval (A, then a changed B); the operator's approval of A's digest presented for B is refused and journaled as approval.substitution, and B's refusal is journaled; B never reaches the provider; A, approved with its digest, reaches it exactly once after its durable approval.decided; approving A again is refused as a replay"},
}

// FaultCaseNames lists FaultCases' names in order.
func FaultCaseNames() []string {
	out := make([]string, len(FaultCases))
	for i, c := range FaultCases {
		out[i] = c.Name
	}
	return out
}

func faultCaseByName(n string) (FaultCase, bool) {
	for _, c := range FaultCases {
		if c.Name == n {
			return c, true
		}
	}
	return FaultCase{}, false
}

// ProcSample is one host-side look at the sandbox's processes, at TMS
// milliseconds after the case started. WorkloadStart is the workload's
// start time (field 22 of /proc/pid/stat) if a live process has its pid,
// "" otherwise; SupervisorState is the supervisor's state letter, "" when
// gone.
type ProcSample struct {
	TMS             int64  `json:"t_ms"`
	WorkloadStart   string `json:"workload_start"`
	SupervisorState string `json:"supervisor_state"`
}

// FaultHost is host.json: what the controller saw of one case, raw.
type FaultHost struct {
	Precondition        string       `json:"precondition,omitempty"` // why the case could not be set up; "" when it was
	SupervisorTimeoutMS int64        `json:"supervisor_timeout_ms"`
	WorkloadPID         int          `json:"workload_pid"`
	WorkloadStart       string       `json:"workload_start"` // at the start of the case
	SupervisorPID       int          `json:"supervisor_pid"`
	ReadyMS             int64        `json:"ready_ms"` // the workload was found
	Signal              string       `json:"signal"`
	SignalMS            int64        `json:"signal_ms"` // 0: not sent
	SignalError         string       `json:"signal_error,omitempty"`
	Samples             []ProcSample `json:"samples"`
	AuditVerifyExit     int          `json:"audit_verify_exit"` // moat audit verify of the journal, -1 not run
	AuditVerifyOutput   string       `json:"audit_verify_output"`
}

// FaultObservations are what the raw files give, recomputed by the
// verifier.
type FaultObservations struct {
	ControlAliveMS    int64  `json:"control_alive_ms"`   // the workload was seen alive this long after it was found, before the signal
	DiedBeforeSignal  bool   `json:"died_before_signal"` // the workload died under a healthy supervisor
	DeathAfterMS      int64  `json:"death_after_ms"`     // first sample without the workload, after the signal; -1 never seen
	SupervisorAtDeath string `json:"supervisor_at_death"`
	Journal           string `json:"journal"` // JournalMissing | Invalid | Incomplete | Complete, verified natively
	JournalReason     string `json:"journal_reason,omitempty"`
	JournalRecords    int    `json:"journal_records"`
	AuditVerifyExit   int    `json:"audit_verify_exit"`
	// Broker holds a broker case's observations (nil for a supervisor
	// case); the fields above then summarize its worst journal.
	Broker *BrokerObservations `json:"broker,omitempty"`
}

// FaultCaseReport is one faults case's entry.
type FaultCaseReport struct {
	Name         string            `json:"name"`
	Outcome      Outcome           `json:"outcome"`
	Reasons      []string          `json:"reasons"`
	Observations FaultObservations `json:"observations"`
	DurationMS   int64             `json:"duration_ms"`
}

// FaultsReport is a faults bundle's report.json.
type FaultsReport struct {
	Suite    string            `json:"suite"`
	Version  int               `json:"version"`
	Complete bool              `json:"complete"`
	Planned  []string          `json:"planned"`
	Cases    []FaultCaseReport `json:"cases"`
	Binary   BinaryInfo        `json:"binary"`
	// HooksBinary is the moat_test_hooks build that ran the interrupt
	// cases (path and sha256), absent when none was given.
	HooksBinary    *FileInfo         `json:"hooks_binary,omitempty"`
	Fixture        FileInfo          `json:"fixture"`
	Kernel         string            `json:"kernel"`
	Arch           string            `json:"arch"`
	ControllerUID  int               `json:"controller_uid"`
	SuitePublicKey string            `json:"suite_public_key"`
	SuiteKeyID     string            `json:"suite_keyid"`
	Started        string            `json:"started"`
	Finished       string            `json:"finished"`
	Summary        Summary           `json:"summary"`
	CaseFiles      map[string]string `json:"case_files"`
}

// faultCaseFiles are the only files a faults case directory holds.
var faultCaseFiles = []string{FileFaultHost, FileJournal, FilePublicKey}

// faultFileOK says whether case c's directory may hold the file fn: a
// supervisor case faultCaseFiles, a broker case brokerCaseFileOK.
func faultFileOK(c FaultCase, fn string) bool {
	if c.Kind == FaultKindSupervisor {
		return slices.Contains(faultCaseFiles, fn)
	}
	return brokerCaseFileOK(fn)
}

// FaultsFixtureSHA256 is the sha256 of the faults case list as JSON.
func FaultsFixtureSHA256() string {
	b, err := json.Marshal(FaultCases)
	if err != nil {
		panic("BUG: marshal fault case list: " + err.Error())
	}
	return sha256Hex(b)
}

// ObserveFault recomputes a faults case's observations from its raw files
// in dir.
func ObserveFault(dir string) (FaultHost, FaultObservations, error) {
	var h FaultHost
	o := FaultObservations{DeathAfterMS: -1, Journal: JournalMissing}
	if err := readStrictJSON(filepath.Join(dir, FileFaultHost), &h); err != nil {
		return h, o, fmt.Errorf("%s: %w", FileFaultHost, err)
	}
	o.AuditVerifyExit = h.AuditVerifyExit
	last := int64(-1)
	for _, s := range h.Samples {
		if s.TMS < last {
			return h, o, fmt.Errorf("%s: samples out of order at t_ms %d", FileFaultHost, s.TMS)
		}
		last = s.TMS
		alive := h.WorkloadStart != "" && s.WorkloadStart == h.WorkloadStart
		if h.SignalMS == 0 || s.TMS < h.SignalMS {
			if alive {
				if d := s.TMS - h.ReadyMS; d > o.ControlAliveMS {
					o.ControlAliveMS = d
				}
			} else {
				o.DiedBeforeSignal = true
			}
			continue
		}
		if !alive && o.DeathAfterMS < 0 {
			o.DeathAfterMS = s.TMS - h.SignalMS
			o.SupervisorAtDeath = s.SupervisorState
		}
	}
	jb, jerr := readCapped(filepath.Join(dir, FileJournal), maxJournalBytes)
	pb, perr := readCapped(filepath.Join(dir, FilePublicKey), maxSmallFile)
	switch {
	case jerr != nil && perr != nil:
	case jerr != nil || perr != nil:
		o.Journal, o.JournalReason = JournalInvalid, "the journal or its public key is missing"
	default:
		pub, err := parsePublicKeyPEM(pb)
		if err != nil {
			o.Journal, o.JournalReason = JournalInvalid, "public key: "+err.Error()
			break
		}
		r := verifyJournal(jb, pub)
		o.Journal, o.JournalReason, o.JournalRecords = r.Status, r.Reason, len(r.Records)
	}
	return h, o, nil
}

// ScoreFault decides a faults case's outcome from its raw observations:
// adverse observations fail it, missing evidence makes it invalid.
func ScoreFault(c FaultCase, h FaultHost, o FaultObservations) (Outcome, []string) {
	var adverse, missing []string
	bad := func(s string, a ...any) { adverse = append(adverse, fmt.Sprintf(s, a...)) }
	miss := func(s string, a ...any) { missing = append(missing, fmt.Sprintf(s, a...)) }
	if h.Precondition != "" {
		return OutcomeInvalid, []string{"precondition: " + h.Precondition}
	}
	if h.Signal != c.Signal {
		miss("signal %q recorded, the case sends %q", h.Signal, c.Signal)
	}
	if h.SupervisorTimeoutMS <= 0 || h.WorkloadPID <= 0 || h.WorkloadStart == "" || h.SupervisorPID <= 0 {
		miss("no supervisor timeout, workload pid and start time, or supervisor pid recorded")
	}
	// Adverse.
	if o.DiedBeforeSignal {
		bad("the workload died under a healthy supervisor (before the signal)")
	}
	if h.SignalMS > 0 && h.SignalError == "" && o.DeathAfterMS < 0 && len(h.Samples) > 0 && h.Samples[len(h.Samples)-1].TMS-h.SignalMS >= h.SupervisorTimeoutMS+faultDeathWait {
		bad("the workload was still alive %d ms after the supervisor's %s (timeout %d ms)", h.Samples[len(h.Samples)-1].TMS-h.SignalMS, c.Signal, h.SupervisorTimeoutMS)
	}
	if o.DeathAfterMS > h.SupervisorTimeoutMS+faultDeathWait {
		bad("the workload died %d ms after the supervisor's %s, beyond the timeout %d ms + %d ms", o.DeathAfterMS, c.Signal, h.SupervisorTimeoutMS, faultDeathWait)
	}
	if o.Journal == JournalInvalid {
		bad("the journal does not verify: %s", o.JournalReason)
	}
	if o.Journal == JournalComplete {
		bad("the journal is complete although the supervisor was lost before closing it")
	}
	if h.AuditVerifyExit != 2 && h.AuditVerifyExit != -1 && o.Journal == JournalIncomplete {
		bad("moat audit verify exited %d on a journal that verifies natively as an intact prefix (want exit 2)", h.AuditVerifyExit)
	}
	// Missing evidence.
	if h.SignalMS == 0 || h.SignalError != "" {
		miss("the signal was not delivered: %s", h.SignalError)
	}
	if o.ControlAliveMS < 2*h.SupervisorTimeoutMS {
		miss("positive control: the workload was seen alive only %d ms under a healthy supervisor, want ≥ %d ms (twice the timeout)", o.ControlAliveMS, 2*h.SupervisorTimeoutMS)
	}
	if o.DeathAfterMS < 0 && len(adverse) == 0 {
		miss("the workload's death was not observed")
	}
	if c.Signal == "SIGSTOP" && o.DeathAfterMS >= 0 && o.SupervisorAtDeath != "T" {
		miss("the supervisor was in state %q, not stopped (T), when the workload's death was seen: the death is not the heartbeat's", o.SupervisorAtDeath)
	}
	if o.Journal == JournalMissing {
		miss("no journal")
	}
	if h.AuditVerifyExit == -1 {
		miss("moat audit verify was not run")
	}
	switch {
	case len(adverse) > 0:
		return OutcomeFail, append(adverse, missing...)
	case len(missing) > 0:
		return OutcomeInvalid, missing
	}
	return OutcomePass, []string{}
}

// finishFaultsBundle writes report.json, report.dsse.json, report.md and
// manifest.json, and returns the manifest's sha256.
func finishFaultsBundle(out string, rep *FaultsReport, priv ed25519.PrivateKey) (string, error) {
	pub := priv.Public().(ed25519.PublicKey)
	rep.SuitePublicKey, rep.SuiteKeyID = string(publicKeyPEM(pub)), keyIDOf(pub)
	rep.Summary = summarizeFaults(rep.Cases)
	cf, err := CaseFileHashes(out)
	if err != nil {
		return "", fmt.Errorf("hashing the case files: %w", err)
	}
	rep.CaseFiles = cf
	rb, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return "", err
	}
	rb = append(rb, '\n')
	sig, err := SignReport(rb, priv)
	if err != nil {
		return "", err
	}
	for name, b := range map[string][]byte{FileReport: rb, FileReportDSSE: sig, FileReportMD: renderFaultsMarkdown(rep)} {
		if err := os.WriteFile(filepath.Join(out, name), b, 0o644); err != nil {
			return "", err
		}
	}
	return WriteManifest(out)
}

func summarizeFaults(cs []FaultCaseReport) Summary {
	all := make([]CaseReport, len(cs))
	for i, c := range cs {
		all[i].Outcome = c.Outcome
	}
	return Summarize(all)
}

// renderFaultsMarkdown is a faults bundle's report.md.
func renderFaultsMarkdown(r *FaultsReport) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "# moat faults evidence\n\nA second report beside the containment suite, never merged into its count. Kernel `%s`, %s, controller uid %d.\n\n", r.Kernel, r.Arch, r.ControllerUID)
	fmt.Fprintf(&b, "Result: %d pass, %d fail, %d invalid (of %d planned).\n\n| # | case | outcome | control alive | death after signal | provider requests | journal |\n|---|---|---|---|---|---|---|\n", r.Summary.Pass, r.Summary.Fail, r.Summary.Invalid, len(r.Planned))
	for i, c := range r.Cases {
		if o := c.Observations; o.Broker != nil {
			fmt.Fprintf(&b, "| %d | %s | **%s** | - | - | %d | %s (%d) |\n", i+1, c.Name, c.Outcome, o.Broker.ProviderRequests, o.Journal, len(o.Broker.Journals))
			continue
		}
		fmt.Fprintf(&b, "| %d | %s | **%s** | %d ms | %d ms | - | %s |\n", i+1, c.Name, c.Outcome, c.Observations.ControlAliveMS, c.Observations.DeathAfterMS, c.Observations.Journal)
	}
	fmt.Fprintf(&b, "\n## Reasons\n\n")
	for _, c := range r.Cases {
		for _, why := range c.Reasons {
			fmt.Fprintf(&b, "- %s: %s\n", c.Name, why)
		}
	}
	fmt.Fprintf(&b, "\n## How outcomes are decided\n\nFrom host-side observations only (cases/NAME/host.json). Supervisor cases: the workload's host pid and start time sampled before and after the signal to the supervisor, the supervisor's state, and the journal verified natively against its key (an intact prefix) and by moat audit verify (exit 2). Broker cases (workers, interrupt, approval): the fake provider's own request log with each request's Moat-Pre-Effect line, each sandbox's journal (journal-NAME.jsonl, pubkey-NAME.pem) verified natively and by moat audit verify, the budget ledger as moat left it (ledger.json), the fault hook's marker and the supervisor's state. The journal column of a broker case shows its worst journal and the number of journals. moat evidence verify recomputes every outcome from these files.\n\n- moat binary `%s`: sha256 %s at start, %s at end\n- case list sha256 %s\n- suite keyid %s\n", r.Binary.Path, r.Binary.SHA256, r.Binary.SHA256End, r.Fixture.SHA256, r.SuiteKeyID)
	return []byte(b.String())
}

// isFaultsBundle says whether dir's report.json names the faults suite.
func isFaultsBundle(dir string) bool {
	b, err := readCapped(filepath.Join(dir, FileReport), MaxReportBytes)
	if err != nil {
		return false
	}
	var v struct {
		Suite string `json:"suite"`
	}
	return json.Unmarshal(b, &v) == nil && v.Suite == FaultsSuiteName
}

// verifyFaultsBundle is VerifyBundlePinned for a faults bundle, after the
// manifest: the signature, the exact file set, report.md, the planned list
// and every outcome recomputed from the raw files.
func verifyFaultsBundle(dir string, pins Pins, files map[string]string, res *VerifyResult, bad func(string, ...any)) {
	rb, err := readCapped(filepath.Join(dir, FileReport), MaxReportBytes)
	if err != nil {
		bad("report: %v", err)
		return
	}
	var rep FaultsReport
	if err := decodeStrict(rb, &rep); err != nil {
		bad("report.json: %v", err)
		return
	}
	res.SuiteKeyID, res.Planned = rep.SuiteKeyID, len(rep.Planned)
	if pins.SuiteKeyFingerprint != "" && !strings.EqualFold(pins.SuiteKeyFingerprint, rep.SuiteKeyID) {
		bad("suite key fingerprint %s is not the pinned %s", rep.SuiteKeyID, pins.SuiteKeyFingerprint)
	}
	verifySignedBy(dir, rb, rep.SuitePublicKey, rep.SuiteKeyID, bad)
	if rep.Version != FaultsReportVersion {
		bad("report: version %d, want %d", rep.Version, FaultsReportVersion)
	}
	if rep.Fixture.SHA256 != FaultsFixtureSHA256() {
		bad("report: case list sha256 %s differs from this verifier's %s", rep.Fixture.SHA256, FaultsFixtureSHA256())
	}
	if rep.Binary.Unchanged != (rep.Binary.SHA256 != "" && rep.Binary.SHA256 == rep.Binary.SHA256End) {
		bad("report: binary unchanged=%v contradicts its hashes", rep.Binary.Unchanged)
	}
	for _, name := range sortedNames(files) {
		if name == FileReport || name == FileReportDSSE || name == FileReportMD {
			continue
		}
		rest, ok := strings.CutPrefix(name, CasesDir+"/")
		cn, fn, _ := strings.Cut(rest, "/")
		c, known := faultCaseByName(cn)
		if !ok || !known || !slices.Contains(rep.Planned, cn) || !faultFileOK(c, fn) {
			bad("%s: not a file that a faults bundle holds", name)
			continue
		}
		if want, listed := rep.CaseFiles[name]; !listed || want != files[name] {
			bad("%s: sha256 %s, report.json lists %q", name, files[name], want)
		}
	}
	for _, name := range sortedNames(rep.CaseFiles) {
		if _, ok := files[name]; !ok {
			bad("%s: listed in report.json but missing", name)
		}
	}
	if md, err := readCapped(filepath.Join(dir, FileReportMD), MaxReportBytes); err != nil {
		bad("report.md: %v", err)
	} else if want := renderFaultsMarkdown(&rep); !bytes.Equal(md, want) {
		bad("report.md differs from the one regenerated from report.json (%s)", firstDiff(md, want))
	}
	full := checkPlanned(rep.Planned, FaultCaseNames(), rep.Complete, bad)
	if len(rep.Cases) != len(rep.Planned) {
		bad("%d planned cases, %d reported", len(rep.Planned), len(rep.Cases))
	}
	for i, cr := range rep.Cases {
		if i < len(rep.Planned) && cr.Name != rep.Planned[i] {
			bad("case %d is %q, planned %q", i+1, cr.Name, rep.Planned[i])
		}
		c, ok := faultCaseByName(cr.Name)
		if !ok {
			bad("case %q is not in the faults list", cr.Name)
			continue
		}
		o, outcome, reasons, err := observeFaultCase(filepath.Join(dir, CasesDir, c.Name), c)
		if err != nil {
			bad("%s: %v", c.Name, err)
			continue
		}
		if !reflect.DeepEqual(mustJSON(o), mustJSON(cr.Observations)) {
			bad("%s: recorded observations differ from the raw files:\n  recorded   %s\n  recomputed %s", c.Name, mustJSON(cr.Observations), mustJSON(o))
		}
		if outcome != cr.Outcome {
			bad("%s: recorded outcome %q, the raw observations give %q (%s)", c.Name, cr.Outcome, outcome, strings.Join(reasons, "; "))
		}
		if !slices.Equal(reasons, cr.Reasons) {
			bad("%s: recorded reasons differ from the recomputed ones", c.Name)
		}
	}
	if got := summarizeFaults(rep.Cases); got != rep.Summary {
		bad("summary %+v does not match the outcomes %+v", rep.Summary, got)
	}
	res.Summary = rep.Summary
	if full {
		res.Verdict = VerdictComplete
	} else {
		res.Verdict = VerdictSubset
	}
}
