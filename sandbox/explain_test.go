package sandbox

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/boundary/seccomp"
)

// filteredBackend is a backend whose processes run behind package
// seccomp's filter; plainBackend is one without (the control).
type filteredBackend struct{ plainBackend }

func (filteredBackend) Name() string { return "explain-filtered" }
func (filteredBackend) SeccompOptions() seccomp.Options {
	return seccomp.Options{AllowUnixSockets: true}
}

type plainBackend struct{}

func (plainBackend) Name() string { return "explain-plain" }
func (plainBackend) Prepare(context.Context, boundary.Spec) (boundary.Sandbox, error) {
	return nil, boundary.ErrUnsupported
}

// --explain states the filter's rules, those of the Options the backend
// builds it with, in order; a backend without the filter states none.
func TestExplainStatesFilter(t *testing.T) {
	boundary.Register(filteredBackend{})
	boundary.Register(plainBackend{})
	rules := seccomp.Policy(filteredBackend{}.SeccompOptions())
	var w bytes.Buffer
	explain(&w, "explain-filtered", boundary.Properties{}, boundary.LimitsStatus{})
	var got []string
	for _, l := range strings.Split(w.String(), "\n") {
		if r, ok := strings.CutPrefix(l, "    "); ok {
			got = append(got, r)
		}
	}
	if len(rules) == 0 {
		if !strings.Contains(w.String(), "seccomp filter: none on this system") {
			t.Errorf("no filter on this system, and --explain does not say so:\n%s", w.String())
		}
	} else if len(got) != len(rules) {
		t.Fatalf("got %d rule lines, want %d:\n%s", len(got), len(rules), w.String())
	}
	for i, r := range rules {
		if got[i] != r.String() {
			t.Errorf("rule %d: got %q, want %q", i, got[i], r.String())
		}
	}
	// The Options matter: AF_UNIX sockets are allowed with these.
	if len(rules) > 0 && !strings.Contains(w.String(), "socket: allow when domain is AF_UNIX") {
		t.Errorf("the rules are not those of the backend's Options:\n%s", w.String())
	}

	w.Reset()
	explain(&w, "explain-plain", boundary.Properties{}, boundary.LimitsStatus{})
	if strings.Contains(w.String(), "seccomp") {
		t.Errorf("control: a backend without the filter states one:\n%s", w.String())
	}
}
