package conformance

import (
	"bytes"
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// The verdict's order of precedence: a violation, then a failed control,
// then missing evidence, then no control at all, then root-only gaps; a
// pass needs at least one control and counts what held.
func TestVerdictPrecedence(t *testing.T) {
	for _, tc := range []struct {
		name       string
		build      func(v *verdict)
		outcome    Outcome
		reason     string
		unpriv     bool
		violations int
	}{
		{"pass", func(v *verdict) {
			v.violation(true, "read /etc/shadow")
			v.violation(true, "connect 1.1.1.1")
			v.control(true, "read the grant")
		}, Pass, "2 violations failed, 1 controls worked", false, 0},
		{"violations first, sorted", func(v *verdict) {
			v.control(false, "write the grant")
			v.violation(false, "zeta escaped")
			v.violation(false, "alpha escaped")
			v.invalid("no report")
		}, Fail, "violation succeeded: alpha escaped; zeta escaped", false, 2},
		{"failed control before missing evidence", func(v *verdict) {
			v.control(true, "read")
			v.control(false, "write the grant")
			v.invalid("no report")
		}, Fail, "positive control failed: write the grant", false, 0},
		{"missing evidence", func(v *verdict) {
			v.control(true, "read")
			v.invalid("the probe did not report x")
			v.needsRoot("setuid")
		}, Invalid, "the probe did not report x", false, 0},
		{"no control ran", func(v *verdict) {
			v.violation(true, "read /etc/shadow")
		}, Invalid, "no positive control ran", false, 0},
		{"only root-only gaps", func(v *verdict) {
			v.control(true, "read")
			v.needsRoot("setuid a")
			v.needsRoot("setuid b")
		}, Invalid, "needs root: setuid a; setuid b", true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := &verdict{}
			tc.build(v)
			r := v.result()
			if r.Outcome != tc.outcome || r.Reason != tc.reason || r.Unprivileged != tc.unpriv {
				t.Fatalf("got %s %q unprivileged=%v, want %s %q unprivileged=%v", r.Outcome, r.Reason, r.Unprivileged, tc.outcome, tc.reason, tc.unpriv)
			}
			if n := countPrefix(r.Observations, "VIOLATED: "); n != tc.violations {
				t.Fatalf("observations %q: %d VIOLATED, want %d", r.Observations, n, tc.violations)
			}
		})
	}
}

func sampleReport(results ...Result) *Report {
	return &Report{Backend: "native", Binary: "/usr/bin/moat", Started: time.Date(2026, 12, 1, 1, 0, 0, 0, time.UTC), Results: results}
}

func TestWriteTable(t *testing.T) {
	pass := Result{Scenario: "fs-confinement", Outcome: Pass, Reason: "3 violations failed, 1 controls worked"}
	root := Result{Scenario: "privilege-floor", Outcome: Invalid, Unprivileged: true, Reason: "needs root: setuid"}
	unav := Result{Scenario: "attribution", Outcome: Unavailable, Reason: "endpoint-only"}
	fail := Result{Scenario: "egress", Outcome: Fail, Reason: "violation succeeded: connect"}

	var b bytes.Buffer
	if err := sampleReport(pass, root, unav).WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 6 || !strings.HasPrefix(lines[0], "SCENARIO") {
		t.Fatalf("got %d lines:\n%s", len(lines), out)
	}
	for _, want := range []string{
		"privilege-floor  invalid (needs root)  needs root: setuid",
		"backend native: 1 pass, 0 fail, 1 invalid, 1 unavailable",
		"only lack root-only checks",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}

	// A failure: the invalid one no longer reads as harmless.
	b.Reset()
	if err := sampleReport(pass, root, fail).WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	if out := b.String(); strings.Contains(out, "not a failure") || !strings.Contains(out, "1 pass, 1 fail, 1 invalid, 0 unavailable") {
		t.Fatalf("with a failure:\n%s", out)
	}
}

func TestWriteJSON(t *testing.T) {
	rep := sampleReport(
		Result{Scenario: "a", Outcome: Pass, Reason: "ok", Observations: []string{"held: x"}, DurationMS: 12},
		Result{Scenario: "b", Outcome: Invalid, Unprivileged: true, Reason: "needs root: y", Observations: []string{}},
	)
	rep.Root = false
	var b bytes.Buffer
	if err := rep.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	var back Report
	dec := json.NewDecoder(&b)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(&back, rep) {
		t.Fatalf("round trip: got %+v, want %+v", back, *rep)
	}
	b.Reset()
	rep.WriteJSON(&b)
	if got := strings.Count(b.String(), `"unprivileged": true`); got != 1 || strings.Contains(b.String(), `"unprivileged": false`) {
		t.Fatalf("unprivileged is written only when true:\n%s", b.String())
	}
}

func TestCheckScenarios(t *testing.T) {
	names := Names()
	sorted := slices.Sorted(slices.Values(names))
	if len(names) != len(scenarios) || len(slices.Compact(sorted)) != len(names) {
		t.Fatalf("Names() = %q: want every scenario once", names)
	}
	if len(names) > 0 {
		if err := CheckScenarios(names); err != nil {
			t.Fatalf("every known scenario: %v", err)
		}
	}
	err := CheckScenarios(append(slices.Clone(names), "no-such-scenario"))
	if err == nil || !strings.Contains(err.Error(), `"no-such-scenario"`) || !strings.Contains(err.Error(), strings.Join(names, ", ")) {
		t.Fatalf("unknown scenario: got %v, want an error naming it and the known ones", err)
	}
	if err := CheckScenarios(nil); err != nil {
		t.Fatalf("no names (all scenarios): %v", err)
	}
}
