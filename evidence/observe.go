package evidence

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"sort"
	"strings"

	"github.com/moat-sandbox/moat/audit"
)

// Raw file names inside cases/<name>/.
const (
	FilePolicy         = "policy.yaml"
	FileRunInfo        = "run-info.json"
	FilePublicKey      = "pubkey.pem" // the name every run's directory uses
	FileJournal        = "journal.jsonl"
	FileProviderEvents = "provider-events.jsonl"
	FileRedirectEvents = "redirect-events.jsonl"
	FileReceiverEvents = "receiver-events.jsonl"
	FileHost           = "host.json"
	FileProbeOut       = "probe.out"
	FileMoatErr        = "moat.err"
	// FileLaterRuns holds the probe's stdout and moat's stderr of a
	// multi-run case's later runs, each under a "== run N … ==" line.
	FileLaterRuns = "later-runs.out"
	// FileToolLog is the calc server's own log of the calls that reached
	// it; FileToolEvents the url tool server's events (the tool cases).
	FileToolLog    = "tool-calls.jsonl"
	FileToolEvents = "tool-events.jsonl"
	// FileEgressEvents is what the egress case's registry and trap
	// received (EgressEvent).
	FileEgressEvents    = "egress-events.jsonl"
	maxSmallFile        = 1 << 20
	preEffectHeaderName = "moat-pre-effect"
)

// HostRecord is what the controller itself observed about a case's run, on
// the host, outside the sandbox.
type HostRecord struct {
	RunInfo     bool   `json:"run_info"`  // the run-info file appeared
	ExitCode    int    `json:"exit_code"` // moat's exit code; -1 if it never ran
	TimedOut    bool   `json:"timed_out"`
	HostPID     int    `json:"host_pid"`
	WorkloadPID int    `json:"workload_pid"`
	RunID       string `json:"run_id"`
	// Nil: not observed (missing evidence).
	NetNSPrivate   *bool `json:"netns_private"`
	MntNSPrivate   *bool `json:"mntns_private"`
	NoNewPrivs     *bool `json:"no_new_privs"`
	WorkerGone     *bool `json:"worker_gone"`
	StagingRemoved *bool `json:"staging_removed"`
	// FaultInjected: the audit storage was made to fail (audit-storage-fault).
	FaultInjected bool `json:"fault_injected"`
	// Missing lists evidence the controller could not obtain and why.
	Missing []string `json:"missing"`
	Notes   []string `json:"notes"`

	// The raw host observations of the cases with host checks
	// (hostchecks.go); absent from the other cases.
	Runs    []RunRecord       `json:"runs,omitempty"`   // later runs, in order
	Paths   []PathRecord      `json:"paths,omitempty"`  // host lstats
	Values  map[string]string `json:"values,omitempty"` // what the controller placed
	Inotify *InotifyRecord    `json:"inotify,omitempty"`
	// The tool cases': the host's view of moat and the tool server's
	// processes, and the server's environment (NAME: sha256 of the value)
	// as the host read it from /proc.
	ToolProcs []ProcRecord      `json:"tool_procs,omitempty"`
	ToolEnv   map[string]string `json:"tool_env,omitempty"`
}

// Observations are a case's controller-owned observations, computed from
// its raw files by ObserveCase. Probe output never feeds them, except to
// count leaked synthetic credentials (CredentialInWorkerOutput).
type Observations struct {
	RunInfo       bool   `json:"run_info"`
	ExitCode      int    `json:"exit_code"`
	Journal       string `json:"journal"` // missing | invalid | incomplete | complete
	JournalReason string `json:"journal_reason,omitempty"`
	Terminal      string `json:"terminal,omitempty"` // run.terminated reason
	Requested     int    `json:"requested"`
	Refused       int    `json:"refused"`
	Completed     int    `json:"completed"`

	ProviderEvents      bool     `json:"provider_events"` // the provider's event file exists
	ProviderRequests    int      `json:"provider_requests"`
	Verified            int      `json:"verified"`   // signature (native + openssl), body hash, and line in the journal
	Unverified          int      `json:"unverified"` // reached the provider without all of that
	ControlsSeen        []string `json:"controls_seen"`
	Canary              bool     `json:"canary"`
	AttackAtProvider    int      `json:"attack_at_provider"`
	ForbiddenAtProvider []string `json:"forbidden_at_provider"`
	CredentialMismatch  int      `json:"credential_mismatch"`
	WorkerHeaders       int      `json:"worker_headers"`

	ReceiverControls map[string]bool `json:"receiver_controls"`
	ReceiverHits     map[string]int  `json:"receiver_hits"`
	RedirectControl  *bool           `json:"redirect_control,omitempty"`
	RedirectHits     int             `json:"redirect_hits"`

	NetNSPrivate   *bool `json:"netns_private"`
	MntNSPrivate   *bool `json:"mntns_private"`
	NoNewPrivs     *bool `json:"no_new_privs"`
	WorkerGone     *bool `json:"worker_gone"`
	StagingRemoved *bool `json:"staging_removed"`
	FaultInjected  bool  `json:"fault_injected"`

	CredentialInWorkerOutput int      `json:"credential_in_worker_output"`
	Missing                  []string `json:"missing"`

	// HostChecks are the case's host checks (Case.HostChecks), computed
	// from the raw host record.
	HostChecks []HostCheck `json:"host_checks,omitempty"`
}

// ObserveCase computes a case's observations from the raw files in dir.
// Missing files are missing evidence (recorded, not an error); an error
// means a file exists but is malformed, which only tampering produces.
func ObserveCase(dir string, c Case) (Observations, error) {
	o := Observations{Journal: JournalMissing, ReceiverControls: map[string]bool{}, ReceiverHits: map[string]int{},
		ControlsSeen: []string{}, ForbiddenAtProvider: []string{}, Missing: []string{}}
	var host HostRecord
	if err := readStrictJSON(filepath.Join(dir, FileHost), &host); err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			return o, err
		}
		o.Missing = append(o.Missing, "host.json: no host observations")
		o.ExitCode = -1
	} else {
		o.RunInfo, o.ExitCode = host.RunInfo, host.ExitCode
		o.NetNSPrivate, o.MntNSPrivate, o.NoNewPrivs = host.NetNSPrivate, host.MntNSPrivate, host.NoNewPrivs
		o.WorkerGone, o.StagingRemoved, o.FaultInjected = host.WorkerGone, host.StagingRemoved, host.FaultInjected
		o.Missing = append(o.Missing, host.Missing...)
	}

	// The journal, against the pinned run key.
	var jr journalResult
	pemBytes, perr := readCapped(filepath.Join(dir, FilePublicKey), maxSmallFile)
	jdata, jerr := readCapped(filepath.Join(dir, FileJournal), maxJournalBytes)
	switch {
	case perr != nil || jerr != nil:
		o.Journal = JournalMissing
	default:
		pub, err := parsePublicKeyPEM(pemBytes)
		if err != nil {
			return o, fmt.Errorf("%s: %w", FilePublicKey, err)
		}
		jr = verifyJournal(jdata, pub)
		o.Journal, o.JournalReason = jr.Status, jr.Reason
		// A second reading: package audit's verifier must agree.
		if ar := audit.Verify(jdata, pub); ar.Status.String() != jr.Status {
			o.Journal = JournalInvalid
			o.JournalReason = fmt.Sprintf("the evidence verifier finds the journal %s (%s) but package audit finds it %s (%s)", jr.Status, jr.Reason, ar.Status, ar.Reason)
		}
		for _, r := range jr.Records {
			switch r.Type {
			case "inference.requested":
				o.Requested++
			case "inference.refused":
				o.Refused++
			case "inference.completed":
				o.Completed++
			case "run.terminated":
				o.Terminal, _ = r.Fields["reason"].(string)
			}
		}
		if host.RunID != "" && len(jr.Records) > 0 {
			if run, _ := jr.Records[0].Fields["run"].(string); run != host.RunID {
				return o, fmt.Errorf("%s: run %q differs from the pinned run id %q", FileJournal, run, host.RunID)
			}
		}
	}
	requested := map[string]bool{}
	for _, r := range jr.Records {
		if r.Type == "inference.requested" {
			requested[r.Line] = true
		}
	}

	// The provider's events, each checked against the signed records.
	evs, err := readJSONLines[ProviderEvent](filepath.Join(dir, FileProviderEvents))
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return o, err
	default:
		o.ProviderEvents = true
	}
	pub, _ := parsePublicKeyPEM(pemBytes)
	seen := map[string]bool{}
	forbidden := map[string]bool{}
	var verified [][]byte
	for _, ev := range evs {
		o.ProviderRequests++
		ok := pub != nil && ev.NativeVerified && ev.OpenSSLVerified && requested[ev.PreEffect] &&
			checkPreEffect([]byte(ev.PreEffect), ev.Body, host.RunID, pub) == nil
		if ok {
			o.Verified++
			verified = append(verified, ev.Body)
		} else {
			o.Unverified++
		}
		if requestHas(ev, AttackMarker) {
			o.AttackAtProvider++
		}
		if !ev.CredentialOK {
			o.CredentialMismatch++
		}
		for name := range ev.Headers {
			if strings.HasPrefix(name, "moat-") && name != preEffectHeaderName {
				o.WorkerHeaders++
			}
		}
		for _, l := range controlLabels(ev.Body) {
			for _, f := range c.Forbidden {
				if l == f {
					forbidden[l] = true
				}
			}
			if ok {
				seen[l] = true
			}
		}
		if ok && bytes.Contains(ev.Body, []byte(Canary)) {
			o.Canary = true
		}
	}
	o.ControlsSeen = sortedKeys(seen)
	o.ForbiddenAtProvider = sortedKeys(forbidden)

	// The direct receivers.
	rev, err := readJSONLines[ReceiverEvent](filepath.Join(dir, FileReceiverEvents))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return o, err
	}
	for _, name := range DirectReceivers {
		o.ReceiverControls[name] = false
		o.ReceiverHits[name] = 0
	}
	for _, e := range rev {
		if _, known := o.ReceiverControls[e.Receiver]; !known {
			return o, fmt.Errorf("%s: unknown receiver %q", FileReceiverEvents, e.Receiver)
		}
		switch e.Kind {
		case "control":
			o.ReceiverControls[e.Receiver] = true
		case "hit":
			o.ReceiverHits[e.Receiver]++
		default:
			return o, fmt.Errorf("%s: unknown event kind %q", FileReceiverEvents, e.Kind)
		}
	}
	if c.Provider == ProviderRedirect {
		rd, err := readJSONLines[ReceiverEvent](filepath.Join(dir, FileRedirectEvents))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return o, err
		}
		ctl := false
		for _, e := range rd {
			switch {
			case e.Receiver == RecvRedirect && e.Kind == "control":
				ctl = true
			case e.Receiver == RecvRedirect && e.Kind == "hit":
				o.RedirectHits++
			default:
				return o, fmt.Errorf("%s: unexpected event %q/%q", FileRedirectEvents, e.Receiver, e.Kind)
			}
		}
		o.RedirectControl = &ctl
	}

	var outputs [][]byte
	for _, f := range []string{FileProbeOut, FileMoatErr, FileLaterRuns} {
		b, err := readCapped(filepath.Join(dir, f), MaxEventsBytes)
		if err == nil {
			o.CredentialInWorkerOutput += bytes.Count(b, []byte(RedactedCredential))
			outputs = append(outputs, b)
		}
	}
	if len(c.HostChecks) > 0 {
		in := checkInput{host: host, verified: verified, events: evs, outputs: outputs, records: jr.Records, pub: pub, runID: host.RunID}
		if c.Tool != "" {
			in.toolLog, err = readJSONLines[ToolLogLine](filepath.Join(dir, FileToolLog))
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				return o, err
			}
			in.toolLogExists = err == nil
			in.toolEvents, err = readJSONLines[ToolEvent](filepath.Join(dir, FileToolEvents))
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				return o, err
			}
			in.toolEventsExist = err == nil
		}
		if c.Egress {
			in.egress, err = readJSONLines[EgressEvent](filepath.Join(dir, FileEgressEvents))
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				return o, err
			}
			in.egressEventsExist = err == nil
		}
		o.HostChecks = computeHostChecks(c, in)
	}
	return o, nil
}

// requestHas reports whether s occurs anywhere the worker could have put
// it: target, query, header values, body.
func requestHas(ev ProviderEvent, s string) bool {
	if strings.Contains(ev.Path, s) || strings.Contains(ev.Query, s) || bytes.Contains(ev.Body, []byte(s)) {
		return true
	}
	for k, v := range ev.Headers {
		if strings.Contains(k, s) || strings.Contains(v, s) {
			return true
		}
	}
	return false
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// readCapped reads a regular file of at most limit bytes: it reads no more
// than limit+1 bytes whatever the file's size says (a stat before a read
// would let a file that grows in between through), and refuses past limit.
func readCapped(path string, limit int64) ([]byte, error) { return audit.ReadFileCapped(path, limit) }

// readStrictJSON decodes one JSON value, refusing unknown fields and trailing data.
func readStrictJSON(path string, v any) error {
	b, err := readCapped(path, maxSmallFile)
	if err != nil {
		return err
	}
	return decodeStrict(b, v)
}

func decodeStrict(b []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return err
	}
	if d.More() {
		return errors.New("trailing data")
	}
	return nil
}
