package measure

import (
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-json-experiment/json"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/internal/reexec"
)

// Synthetic helpers stand in for the real one, to test how Confirm judges
// reports: the mode is part of the helper name (synthName).
func synthName(mode string) string { return reexec.Prefix + "test-measure-" + mode }

var synthModes = []string{
	"perfect",       // every violation failed, every control succeeded, broker greeted
	"perfect-exit1", // the same report, but exit code 1
	"empty",         // no output
	"garbage",       // not JSON
	"trailing",      // a perfect report followed by more JSON
	"unknown-field", // a perfect report with an extra member
	"duplicate",     // a perfect report with one result twice
	"unknown-id",    // a perfect report plus a result for an unplanned probe
	"missing-one",   // a perfect report without its first violation
	"flip-violation",
	"flip-control",
	"bad-outcome", // an outcome that is not one of the three
	"huge",        // more than MaxReportBytes
	"no-broker",   // perfect, but never connects to the broker
}

// hangMode never answers; it is run by TestConfirmHelperHangs only.
const hangMode = "hang"

func synthHelpers() []reexec.Helper {
	h := []reexec.Helper{{Name: synthName(hangMode), Main: func([]string) int {
		time.Sleep(time.Hour)
		return 0
	}}}
	for _, m := range synthModes {
		h = append(h, reexec.Helper{Name: synthName(m), Main: func(args []string) int { return synthHelper(m, args) }})
	}
	return h
}

func synthHelper(mode string, args []string) int {
	if mode == "empty" {
		return 0
	}
	if mode == "garbage" {
		fmt.Print("Segmentation fault (core dumped)\n")
		return 0
	}
	if mode == "huge" {
		os.Stdout.WriteString(`{"v":1,"results":[],"x":"` + strings.Repeat("a", MaxReportBytes) + `"}`)
		return 0
	}
	pl, err := decodePlan(args[0])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 125
	}
	var rs []result
	flipped := false
	for _, p := range pl.Probes {
		r := result{ID: p.ID, Outcome: OutcomeFailed, Detail: "synthetic"}
		if isControl(p.ID) {
			r.Outcome = OutcomeSucceeded
		}
		if p.Op == opTCPBroker && mode != "no-broker" {
			r.Outcome, r.Detail = probeBroker(p.Addr, pl.Nonce)
		}
		switch {
		case mode == "missing-one" && !flipped && !isControl(p.ID):
			flipped = true
			continue
		case mode == "flip-violation" && !flipped && !isControl(p.ID):
			flipped, r.Outcome = true, OutcomeSucceeded
		case mode == "flip-control" && !flipped && isControl(p.ID) && p.Op != opTCPBroker:
			flipped, r.Outcome = true, OutcomeFailed
		case mode == "bad-outcome" && !flipped:
			flipped, r.Outcome = true, "probably"
		}
		rs = append(rs, r)
	}
	switch mode {
	case "duplicate":
		rs = append(rs, rs[0])
	case "unknown-id":
		rs = append(rs, result{ID: "fs/read-secret:/nowhere", Outcome: OutcomeFailed})
	}
	b, _ := json.Marshal(report{V: 1, Results: rs})
	switch mode {
	case "trailing":
		b = append(b, `{"v":1}`...)
	case "unknown-field":
		b = append(b[:len(b)-1], `,"verdict":"all enforced"}`...)
	}
	os.Stdout.Write(b)
	if mode == "perfect-exit1" {
		return 1
	}
	return 0
}

// TestConfirmJudgesReports: the one synthetic report that shows every
// violation failing and every control succeeding yields all four
// properties enforced; every defect in a report, however small, yields
// not enforced.
func TestConfirmJudgesReports(t *testing.T) {
	h := newHostSetup(t)
	for _, mode := range synthModes {
		t.Run(mode, func(t *testing.T) {
			sb := newFakeSandbox(t)
			sb.helper = synthName(mode)
			props, rep, err := Confirm(context.Background(), sb, h.config())
			if err != nil {
				t.Fatalf("Confirm: %v", err)
			}
			if mode == "perfect" {
				if err := boundary.Ready(props, boundary.Requirements{RequireAttribution: true}); err != nil {
					t.Fatalf("a perfect report is not ready: %v\n%+v", err, rep)
				}
				return
			}
			// Which properties the defect touches depends on the mode;
			// at least one must be not enforced, and none of them may be
			// enforced on a report that is invalid as a whole.
			var notEnforced []string
			for _, np := range props.Named() {
				if !np.Enforced {
					notEnforced = append(notEnforced, np.Name+": "+np.Detail)
				}
			}
			if len(notEnforced) == 0 {
				t.Fatalf("mode %s: every property enforced", mode)
			}
			whole := map[string]bool{"perfect-exit1": true, "empty": true, "garbage": true, "trailing": true,
				"unknown-field": true, "duplicate": true, "unknown-id": true, "bad-outcome": true, "huge": true}
			if whole[mode] {
				for _, np := range props.Named() {
					if np.Name != PropAttribution && np.Enforced {
						t.Errorf("mode %s: %s enforced on an invalid report", mode, np.Name)
					}
				}
				if c := checkByName(t, rep, "priv/"+opExec); c.Outcome != OutcomeMissing || !strings.HasPrefix(c.Detail, "no valid report") {
					t.Errorf("mode %s: exec check %+v, want missing: no valid report", mode, c)
				}
			}
			t.Logf("not enforced: %s", strings.Join(notEnforced, " | "))
		})
	}
}

// TestConfirmHelperHangs: a helper that never finishes is killed when the
// context ends; Confirm returns an error and nothing enforced.
func TestConfirmHelperHangs(t *testing.T) {
	h := newHostSetup(t)
	sb := newFakeSandbox(t)
	sb.helper = synthName(hangMode)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	props, rep, err := Confirm(ctx, sb, h.config())
	if err == nil || !strings.Contains(err.Error(), "did not finish") {
		t.Errorf("got error %v, want: did not finish", err)
	}
	for _, np := range props.Named() {
		if np.Enforced || !strings.Contains(np.Detail, "did not finish") {
			t.Errorf("%s for a helper that never answered: enforced=%v %s", np.Name, np.Enforced, np.Detail)
		}
	}
	if rep == nil || len(rep.Checks) == 0 {
		t.Fatal("no report of what was missing")
	}
	if pid := int(sb.lastPID.Load()); pid > 0 {
		if err := syscall.Kill(pid, 0); err == nil {
			t.Errorf("the helper (pid %d) is still alive", pid)
		}
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("Confirm took %v after its context ended", d)
	}
}

// BenchmarkConfirm measures a whole confirmation on the unconfined fake:
// the helper's start, every probe, the broker round trip and attribution.
func BenchmarkConfirm(b *testing.B) {
	d := b.TempDir()
	rw, ro := d+"/ws", d+"/ro"
	os.Mkdir(rw, 0o755)
	os.Mkdir(ro, 0o755)
	cfg := Config{ReadWrite: []string{rw}, ReadOnly: []string{ro}, HostSecrets: []string{"/etc/shadow"}}
	sb := newFakeSandbox(b)
	for b.Loop() {
		if _, _, err := Confirm(context.Background(), sb, cfg); err != nil {
			b.Fatal(err)
		}
	}
}
