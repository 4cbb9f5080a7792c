// Package conformance checks a backend's properties from the outside, by
// driving the real moat CLI: each scenario attempts a violation, requires
// it to fail, and requires the matching allowed action to succeed in the
// same setup. It is backend-neutral: the same scenarios run on every
// backend, and they would catch a backend that claims a property it does
// not enforce (tests run them against a lying backend, compiled into
// tests only, that confines moat's measurement but not the workload).
//
// Outcomes: pass; fail (an adverse observation, or a positive control that
// did not work); invalid (evidence missing, e.g. a root-only check run
// unprivileged); unavailable (the backend declared the property
// unavailable and the policy does not require it).
//
// A scenario that is invalid only because a root-only check could not run
// unprivileged is marked Unprivileged. It is still not a pass (the check
// did not run), but it is not a failure of the host or the backend either:
// a run by a non-root user is OK when every other scenario passed or is
// unavailable. Run as root, no check is skipped for that reason.
//
// Observations that decide outcomes are the suite's own: receivers on the
// host and in a test network namespace, files on the host, the journal
// verified against the key pinned from --run-info, processes on the host.
// What the in-sandbox probe prints is evidence of what it tried, and is
// checked against those observations where it claims a success.
package conformance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/moat-sandbox/moat/internal/kubeapi/kubeopt"
)

// Outcome of a scenario. The zero value is invalid.
type Outcome string

const (
	Invalid     Outcome = "invalid"
	Pass        Outcome = "pass"
	Fail        Outcome = "fail"
	Unavailable Outcome = "unavailable"
	// NotApplicable: the scenario's attack has no counterpart on the
	// backend. Only the suite's fixed list (notApplicable) gives it, by
	// backend and scenario, never a run's observation.
	NotApplicable Outcome = "not-applicable"
)

// Result is one scenario's outcome with its evidence.
type Result struct {
	Scenario     string   `json:"scenario"`
	Outcome      Outcome  `json:"outcome"`
	Reason       string   `json:"reason"`
	Observations []string `json:"observations"`
	DurationMS   int64    `json:"duration_ms"`
	// Unprivileged marks an invalid outcome whose only missing evidence
	// is a root-only check that a non-root run cannot make.
	Unprivileged bool `json:"unprivileged,omitempty"`
}

// errNeedsRoot is the reason a root-only check did not run.
var errNeedsRoot = errors.New("not root")

// Report is the whole run.
type Report struct {
	Backend string    `json:"backend"`
	Binary  string    `json:"binary"`
	Root    bool      `json:"root"`
	Started time.Time `json:"started"`
	Results []Result  `json:"results"`
}

// OK reports whether every scenario passed or is unavailable; run
// unprivileged, a scenario invalid only because its root-only checks could
// not run is accepted too (see the package doc).
func (r *Report) OK() bool {
	for _, res := range r.Results {
		switch {
		case res.Outcome == Pass, res.Outcome == Unavailable:
		case res.Outcome == Invalid && res.Unprivileged && !r.Root:
		default:
			return false
		}
	}
	return len(r.Results) > 0
}

// Options configure a run.
type Options struct {
	Backend   string
	Binary    string   // the moat binary to drive; default os.Executable()
	Scenarios []string // default: all
	Progress  io.Writer
	// Kubernetes describes the cluster for --backend kubernetes (the
	// policy's kubernetes section); other backends ignore it.
	Kubernetes *Kubernetes
}

// Kubernetes is what the scenarios' policies need for the kubernetes
// backend (kubeopt.Options). The workspace and the probe's directory are
// hostPath grants, so the cluster's node must be this host (as
// scripts/k8s-cluster's is).
type Kubernetes = kubeopt.Options

// checkKubernetes refuses a kubernetes run that lacks what the policy
// needs, before any scenario runs; it makes the kubeconfig's path
// absolute.
func checkKubernetes(k *Kubernetes) error { return kubeopt.Check(k) }

type scenario struct {
	name string
	run  func(ctx context.Context, h *harness) Result
}

// Names lists the scenarios in their fixed order.
func Names() []string {
	var n []string
	for _, s := range scenarios {
		n = append(n, s.name)
	}
	return n
}

// CheckScenarios refuses a scenario name that does not exist, naming the
// known ones.
func CheckScenarios(names []string) error {
	for _, want := range names {
		found := false
		for _, s := range scenarios {
			found = found || s.name == want
		}
		if !found {
			return fmt.Errorf("unknown scenario %q (known: %s)", want, strings.Join(Names(), ", "))
		}
	}
	return nil
}

// Run runs the chosen scenarios against a backend.
func Run(ctx context.Context, o Options) (*Report, error) {
	if o.Backend == "" {
		o.Backend = "native"
	}
	if o.Binary == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, err
		}
		o.Binary = exe
	}
	if err := CheckScenarios(o.Scenarios); err != nil {
		return nil, err
	}
	if o.Backend == "kubernetes" {
		if err := checkKubernetes(o.Kubernetes); err != nil {
			return nil, err
		}
	}
	chosen := scenarios
	if len(o.Scenarios) > 0 {
		chosen = nil
		for _, want := range o.Scenarios {
			for _, s := range scenarios {
				if s.name == want {
					chosen = append(chosen, s)
				}
			}
		}
	}
	rep := &Report{Backend: o.Backend, Binary: o.Binary, Root: os.Geteuid() == 0, Started: time.Now().UTC()}
	for i, s := range chosen {
		h, err := newHarness(o.Binary, o.Backend, o.Kubernetes)
		if err != nil {
			return nil, err
		}
		start := time.Now()
		res := s.run(ctx, h)
		h.close()
		res.Scenario = s.name
		if res.Outcome == "" {
			res.Outcome = Invalid
		}
		res.DurationMS = time.Since(start).Milliseconds()
		rep.Results = append(rep.Results, res)
		if o.Progress != nil {
			fmt.Fprintf(o.Progress, "[%2d/%d] %s … %s (%.1f s)\n", i+1, len(chosen), s.name, res.Outcome, time.Since(start).Seconds())
		}
	}
	return rep, nil
}

// WriteTable prints the report for people.
func (r *Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "SCENARIO\tOUTCOME\tREASON\n")
	for _, res := range r.Results {
		outcome := string(res.Outcome)
		if res.Unprivileged {
			outcome += " (needs root)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", res.Scenario, outcome, res.Reason)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	counts := map[Outcome]int{}
	for _, res := range r.Results {
		counts[res.Outcome]++
	}
	var parts []string
	for _, o := range []Outcome{Pass, Fail, Invalid, Unavailable} {
		parts = append(parts, fmt.Sprintf("%d %s", counts[o], o))
	}
	if _, err := fmt.Fprintf(w, "backend %s: %s\n", r.Backend, strings.Join(parts, ", ")); err != nil {
		return err
	}
	if r.OK() && counts[Invalid] > 0 {
		_, err := fmt.Fprintf(w, "the invalid scenarios only lack root-only checks, which a run as root makes; not a failure\n")
		return err
	}
	return nil
}

// WriteJSON prints the report as JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// verdict builds a result from violations and controls: pass only when
// there was at least one control, every control worked and no violation
// was observed.
type verdict struct {
	obs        []string
	adverse    []string
	controlsOK int
	controlBad []string
	missing    []string
	rootOnly   []string // missing evidence that only a run as root can give
}

func (v *verdict) observe(format string, a ...any) { v.obs = append(v.obs, fmt.Sprintf(format, a...)) }

// violation records a violation attempt: held is true when it failed as required.
func (v *verdict) violation(held bool, format string, a ...any) {
	s := fmt.Sprintf(format, a...)
	if held {
		v.observe("held: %s", s)
	} else {
		v.observe("VIOLATED: %s", s)
		v.adverse = append(v.adverse, s)
	}
}

// control records a positive control: ok when the allowed action worked.
func (v *verdict) control(ok bool, format string, a ...any) {
	s := fmt.Sprintf(format, a...)
	if ok {
		v.controlsOK++
		v.observe("control ok: %s", s)
	} else {
		v.observe("CONTROL FAILED: %s", s)
		v.controlBad = append(v.controlBad, s)
	}
}

// invalid records missing evidence.
func (v *verdict) invalid(format string, a ...any) {
	s := fmt.Sprintf(format, a...)
	v.observe("missing evidence: %s", s)
	v.missing = append(v.missing, s)
}

// needsRoot records a root-only check that could not run unprivileged.
func (v *verdict) needsRoot(format string, a ...any) {
	s := fmt.Sprintf(format, a...)
	v.observe("missing evidence (needs root): %s", s)
	v.rootOnly = append(v.rootOnly, s)
}

func (v *verdict) result() Result {
	sort.Strings(v.adverse)
	switch {
	case len(v.adverse) > 0:
		return Result{Outcome: Fail, Reason: "violation succeeded: " + strings.Join(v.adverse, "; "), Observations: v.obs}
	case len(v.controlBad) > 0:
		return Result{Outcome: Fail, Reason: "positive control failed: " + strings.Join(v.controlBad, "; "), Observations: v.obs}
	case len(v.missing) > 0:
		return Result{Outcome: Invalid, Reason: strings.Join(v.missing, "; "), Observations: v.obs}
	case v.controlsOK == 0:
		return Result{Outcome: Invalid, Reason: "no positive control ran", Observations: v.obs}
	case len(v.rootOnly) > 0:
		return Result{Outcome: Invalid, Unprivileged: true, Reason: "needs root: " + strings.Join(v.rootOnly, "; "), Observations: v.obs}
	}
	return Result{Outcome: Pass, Reason: fmt.Sprintf("%d violations failed, %d controls worked", countPrefix(v.obs, "held: "), v.controlsOK), Observations: v.obs}
}

func countPrefix(ss []string, p string) int {
	n := 0
	for _, s := range ss {
		if strings.HasPrefix(s, p) {
			n++
		}
	}
	return n
}
