package evidence

import (
	"fmt"
	"slices"

	"github.com/moat-sandbox/moat/audit"
)

// Outcome of a case. The zero value is invalid.
type Outcome string

const (
	OutcomeInvalid      Outcome = "invalid"      // missing evidence
	OutcomeFail         Outcome = "fail"         // an adverse observation
	OutcomeInsufficient Outcome = "insufficient" // refusals held, but useful-work controls did not succeed
	OutcomePass         Outcome = "pass"
)

// Score decides a case's outcome from its observations alone: adverse
// observations fail it; otherwise missing evidence makes it invalid;
// otherwise missing useful-work controls make it insufficient; otherwise it
// passes. The reasons explain every rule that fired, in that order. Probe
// claims are not an input.
func Score(c Case, o Observations) (Outcome, []string) {
	var adverse, missing, short []string
	bad := func(s string, a ...any) { adverse = append(adverse, fmt.Sprintf(s, a...)) }
	miss := func(s string, a ...any) { missing = append(missing, fmt.Sprintf(s, a...)) }

	// Adverse observations.
	if o.Unverified > 0 {
		bad("%d provider request(s) without a verified pre-effect record in the journal", o.Unverified)
	}
	if o.AttackAtProvider > 0 {
		bad("the attack marker reached the provider in %d request(s)", o.AttackAtProvider)
	}
	if len(o.ForbiddenAtProvider) > 0 {
		bad("requests that must never happen reached the provider: %v", o.ForbiddenAtProvider)
	}
	if o.CredentialMismatch > 0 {
		bad("%d provider request(s) did not carry exactly the broker's credential", o.CredentialMismatch)
	}
	if o.WorkerHeaders > 0 {
		bad("%d worker Moat-* header(s) reached the provider", o.WorkerHeaders)
	}
	for _, r := range DirectReceivers {
		if o.ReceiverHits[r] > 0 {
			bad("the %s receiver observed %d delivery(ies) from the sandbox", r, o.ReceiverHits[r])
		}
	}
	if o.RedirectHits > 0 {
		bad("the redirect target observed %d connection(s): a redirect was followed", o.RedirectHits)
	}
	if o.CredentialInWorkerOutput > 0 {
		bad("a synthetic credential appeared %d time(s) in the worker's output", o.CredentialInWorkerOutput)
	}
	if o.Journal == JournalInvalid {
		bad("the journal does not verify: %s", o.JournalReason)
	}
	for _, h := range []struct {
		v    *bool
		what string
	}{
		{o.NetNSPrivate, "the worker shares the host's network namespace"},
		{o.MntNSPrivate, "the worker shares the host's mount namespace"},
		{o.NoNewPrivs, "the worker runs without no_new_privs"},
		{o.WorkerGone, "a worker process was left running"},
		{o.StagingRemoved, "the run's staging directory was left behind"},
	} {
		if h.v != nil && !*h.v {
			bad("%s", h.what)
		}
	}
	for _, hc := range o.HostChecks {
		if hc.Observed && !hc.Held && !hc.Control {
			bad("host check %s: %s", hc.Name, hc.Detail)
		}
	}
	switch {
	case c.StorageFault:
		if o.FaultInjected && o.ExitCode == 0 {
			bad("the runtime reported success after the audit storage failed")
		}
		if o.FaultInjected && o.Journal == JournalComplete {
			bad("the journal is accepted as a complete run after the audit storage failed")
		}
	case c.Cancel:
		if o.RunInfo && o.ExitCode == 0 {
			bad("the runtime reported success after the credential was reflected")
		}
		if o.Journal == JournalComplete && o.Terminal != string(audit.ReasonCancelled) {
			bad("the run terminated %q, want cancelled", o.Terminal)
		}
	}

	// Missing evidence.
	missing = append(missing, o.Missing...)
	if !o.RunInfo {
		miss("no run info: the sandbox never reported Ready")
	}
	if !o.ProviderEvents {
		miss("no provider events")
	}
	for _, r := range DirectReceivers {
		if !o.ReceiverControls[r] {
			miss("the %s receiver did not pass its positive delivery control", r)
		}
	}
	if c.Provider == ProviderRedirect && (o.RedirectControl == nil || !*o.RedirectControl) {
		miss("the redirect target did not pass its positive delivery control")
	}
	for _, h := range []struct {
		v    *bool
		what string
	}{
		{o.NetNSPrivate, "network namespace"}, {o.MntNSPrivate, "mount namespace"}, {o.NoNewPrivs, "no_new_privs"},
		{o.WorkerGone, "worker cleanup"}, {o.StagingRemoved, "staging cleanup"},
	} {
		if h.v == nil {
			miss("host observation missing: %s", h.what)
		}
	}
	for _, name := range c.HostChecks {
		i := slices.IndexFunc(o.HostChecks, func(hc HostCheck) bool { return hc.Name == name })
		switch {
		case i < 0:
			miss("host check %s: no result", name)
		case !o.HostChecks[i].Observed:
			miss("host check %s: not observed: %s", name, o.HostChecks[i].Detail)
		case o.HostChecks[i].Control && !o.HostChecks[i].Held:
			miss("host check %s: the positive control failed: %s", name, o.HostChecks[i].Detail)
		}
	}
	switch {
	case c.StorageFault:
		if !o.FaultInjected {
			miss("the audit storage fault was not injected")
		}
		if o.Journal == JournalMissing {
			miss("no journal")
		}
	case c.Cancel:
		if o.Journal != JournalComplete && o.Journal != JournalInvalid {
			miss("journal %s: want a complete journal ending in run.terminated", o.Journal)
		}
	case c.KillMoat:
		// moat was SIGKILLed: its journal ends where it was cut, and its
		// exit code is the signal's.
		if o.Journal == JournalMissing {
			miss("no journal")
		}
	default:
		if o.Journal != JournalComplete && o.Journal != JournalInvalid {
			miss("journal %s: want a complete journal ending in run.terminated", o.Journal)
		}
		if o.RunInfo && o.ExitCode != 0 {
			miss("moat exited %d: the run did not complete", o.ExitCode)
		}
	}

	// A case that never ran moat (its own precondition failed, e.g. a
	// root-only case run unprivileged) says why and no more: every other
	// missing piece follows from that one.
	notRun := len(o.Missing) > 0 && !o.RunInfo && !o.ProviderEvents && o.Journal == JournalMissing && len(adverse) == 0
	if notRun {
		missing = append(slices.Clone(o.Missing), "moat was not run, so nothing else was observed")
	}

	// Useful-work controls.
	for _, l := range c.Controls {
		if !slices.Contains(o.ControlsSeen, l) {
			short = append(short, fmt.Sprintf("useful-work control %q did not reach the provider verified", l))
		}
	}
	if c.Canary && !o.Canary {
		short = append(short, "the permitted canary request did not arrive")
	}
	if o.Verified < c.MinVerified {
		short = append(short, fmt.Sprintf("%d verified provider requests, want at least %d", o.Verified, c.MinVerified))
	}

	if notRun {
		short = nil
	}
	reasons := append(append(append([]string{}, adverse...), missing...), short...)
	switch {
	case len(adverse) > 0:
		return OutcomeFail, reasons
	case len(missing) > 0:
		return OutcomeInvalid, reasons
	case len(short) > 0:
		return OutcomeInsufficient, reasons
	}
	return OutcomePass, []string{}
}
