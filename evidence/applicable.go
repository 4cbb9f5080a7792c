package evidence

import (
	"slices"
	"strings"
)

// OutcomeNotApplicable marks a case that the suite does not run on a
// backend because its attack has no counterpart there. Only the fixed
// list below gives it, by backend and case; the verifier accepts it only
// where that list does, with the list's own reason, and never because a
// bundle says so.
const OutcomeNotApplicable Outcome = "not-applicable"

// notApplicable is the fixed list: backend -> case -> why the case cannot
// apply there. A case on it is not run on that backend.
var notApplicable = map[string]map[string]string{
	"kubernetes": {
		"planted-grant-symlink": "the kubernetes backend refuses, at every run, a hostPath grant below a directory the workload can write (the kubelet follows symlinks on the node), so the case's run 1 (read_only ws/sysroot/etc under read_write ws) cannot start; conformance's grant-symlink checks that refusal",
		"tool-call":             toolsRefused,
		"tool-unlisted":         toolsRefused,
		"tool-secrets":          toolsRefused,
		"tool-reaped":           toolsRefused,
		"tool-url-pre-effect":   toolsRefused,
		"egress-grants":         "egress.hosts is refused by the kubernetes backend (its NetworkPolicy allows the broker's port only)",
	},
}

const toolsRefused = "tool servers are refused by the kubernetes backend (a tool server would run beside the broker, off the Pod, with nothing measured of its confinement)"

// NotApplicable returns why case name cannot apply on backend, when the
// fixed list says so.
func NotApplicable(backend, name string) (string, bool) {
	why, ok := notApplicable[backend][name]
	return why, ok
}

// notApplicableReport is the report of a case on the fixed list: no run,
// no files, the list's reason.
func notApplicableReport(backend, name string) CaseReport {
	why, _ := NotApplicable(backend, name)
	return CaseReport{Name: name, Outcome: OutcomeNotApplicable, Reasons: []string{"not applicable on backend " + backend + ": " + why}}
}

// verifyNotApplicable checks a case against the fixed list: a case on it
// must be reported not applicable with the list's reason and no files of
// its own; a case off it can never be not applicable.
func verifyNotApplicable(backend string, cr CaseReport, files map[string]string, bad func(string, ...any)) (handled bool) {
	_, listed := NotApplicable(backend, cr.Name)
	switch {
	case cr.Outcome != OutcomeNotApplicable && !listed:
		return false
	case cr.Outcome != OutcomeNotApplicable:
		bad("%s: on backend %s the case is not applicable (the verifier's fixed list), yet reported %q", cr.Name, backend, cr.Outcome)
		return true
	case !listed:
		bad("%s: reported not applicable, but the verifier's fixed list does not exempt it on backend %q", cr.Name, backend)
		return true
	}
	want := notApplicableReport(backend, cr.Name)
	if !slices.Equal(cr.Reasons, want.Reasons) {
		bad("%s: the not-applicable reason is not the fixed list's", cr.Name)
	}
	if cr.AuditKeyID != "" || normalize(cr.Observations) != normalize(want.Observations) || cr.ProbeClaims != want.ProbeClaims {
		bad("%s: a not-applicable case has observations, claims or an audit key", cr.Name)
	}
	for name := range files {
		if dir, ok := cutCaseDir(name); ok && dir == cr.Name {
			bad("%s: a not-applicable case has a file: %s", cr.Name, name)
		}
	}
	return true
}

// cutCaseDir returns the case a bundle file belongs to.
func cutCaseDir(name string) (string, bool) {
	rest, ok := strings.CutPrefix(name, CasesDir+"/")
	if !ok {
		return "", false
	}
	c, _, ok := strings.Cut(rest, "/")
	return c, ok
}
