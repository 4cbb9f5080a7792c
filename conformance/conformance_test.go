package conformance

import (
	"strings"
	"testing"
)

// The exit rule: pass and unavailable are OK; invalid only for want of
// root is OK when the run was unprivileged, and never as root; anything
// else (fail, other invalid) is not.
func TestReportOK(t *testing.T) {
	pass := Result{Outcome: Pass}
	unav := Result{Outcome: Unavailable}
	needsRoot := Result{Outcome: Invalid, Unprivileged: true}
	invalid := Result{Outcome: Invalid}
	fail := Result{Outcome: Fail}
	cases := []struct {
		name    string
		root    bool
		results []Result
		ok      bool
	}{
		{"all pass", false, []Result{pass, pass}, true},
		{"pass and unavailable", true, []Result{pass, unav}, true},
		{"needs root, run unprivileged", false, []Result{pass, needsRoot}, true},
		{"needs root, yet run as root", true, []Result{pass, needsRoot}, false},
		{"invalid for another reason", false, []Result{pass, invalid}, false},
		{"a failure", false, []Result{needsRoot, fail}, false},
		{"nothing ran", false, nil, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := &Report{Root: c.root, Results: c.results}
			if got := r.OK(); got != c.ok {
				t.Fatalf("OK() = %v, want %v", got, c.ok)
			}
		})
	}
}

// A verdict lacking only root-only evidence is invalid and marked
// unprivileged; any other missing evidence, a failed control or a
// violation outranks it.
func TestVerdictNeedsRoot(t *testing.T) {
	v := &verdict{}
	v.control(true, "allowed")
	v.needsRoot("the setuid-root check needs root")
	if r := v.result(); r.Outcome != Invalid || !r.Unprivileged || !strings.Contains(r.Reason, "needs root") {
		t.Fatalf("got %+v, want invalid and unprivileged", r)
	}
	v.invalid("the probe did not report x")
	if r := v.result(); r.Outcome != Invalid || r.Unprivileged {
		t.Fatalf("with other missing evidence: got %+v, want invalid, not unprivileged", r)
	}
	w := &verdict{}
	w.control(true, "allowed")
	w.needsRoot("root only")
	w.violation(false, "escaped")
	if r := w.result(); r.Outcome != Fail || r.Unprivileged {
		t.Fatalf("with a violation: got %+v, want fail", r)
	}
	x := &verdict{}
	x.control(true, "allowed")
	if r := x.result(); r.Outcome != Pass {
		t.Fatalf("control only: got %+v, want pass", r)
	}
}
