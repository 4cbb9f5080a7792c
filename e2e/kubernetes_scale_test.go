//go:build linux

package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/internal/k8stest"
)

// TestKubernetesScale: twenty kubernetes sandboxes created at once on the
// test cluster's single node all reach Ready, and each is Ready by its
// own measurement: its journal's boundary.confirmed says ready with
// filesystem confinement, egress interception and the privilege floor
// enforced, each backed by violations that failed and controls that
// worked in that Pod, and attribution declared unavailable. Each is a Pod
// and a NetworkPolicy of its own. Deleting them all at once writes each
// journal's terminal record (deleted; the journal verifies) and leaves
// no Pod or NetworkPolicy.
//
// The time to all Ready is logged with a line in bench/RESULTS.md's table
// format; with MOAT_BENCH_LINES set to a file the line is appended there
// too, for bench/ to collect.
func TestKubernetesScale(t *testing.T) {
	c := k8stest.Need(t)
	e := newEnv(t)
	ns := c.Namespace(t, "moat-k8s-scale")
	pol := e.k8sPolicy(c, ns)
	const n = 20
	name := func(i int) string { return fmt.Sprintf("scale%02d", i) }

	type created struct {
		took time.Duration
		r    result
	}
	res := make([]created, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			r := e.moat("sandbox", "create", "--name", name(i), "--policy", pol)
			res[i] = created{time.Since(t0), r}
		}()
	}
	wg.Wait()
	all := time.Since(start)
	// Delete every sandbox this test made, whatever happens below.
	t.Cleanup(func() {
		for i := range n {
			e.moat("sandbox", "delete", name(i))
		}
	})
	var took []time.Duration
	for i, cr := range res {
		if cr.r.code != 0 {
			t.Errorf("create %s: %s", name(i), cr.r)
		}
		took = append(took, cr.took)
	}
	if t.Failed() {
		t.FailNow()
	}
	slices.Sort(took)
	t.Logf("%d kubernetes sandboxes created at once: all Ready in %.1f s (each: min %.1f s, median %.1f s, max %.1f s)",
		n, all.Seconds(), took[0].Seconds(), took[n/2].Seconds(), took[n-1].Seconds())
	line := fmt.Sprintf("| %d kubernetes sandboxes at once (single node, gVisor Pods): time to all Ready | %.2f s | - | - | (no target) | measured |", n, all.Seconds())
	t.Logf("bench: %s", line)
	if p := os.Getenv("MOAT_BENCH_LINES"); p != "" {
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err == nil {
			_, err = fmt.Fprintln(f, line)
			f.Close()
		}
		if err != nil {
			t.Errorf("MOAT_BENCH_LINES: %v", err)
		}
	}

	states := make([]sbState, n)
	for i := range n {
		s, r := e.get(name(i))
		if s.Phase != "Ready" || s.Journal == "" {
			t.Errorf("%s: not Ready: %s", name(i), r)
			continue
		}
		states[i] = s
		checkMeasuredReady(t, name(i), s.Journal)
	}
	// Twenty Pods, each Running, and twenty NetworkPolicies: one each.
	pods := strings.Fields(c.MustRun(t, nil, "-n", ns, "get", "pods", "-l", "moat.sandbox/run", "-o", "jsonpath={range .items[*]}{.status.phase}{\" \"}{end}"))
	if len(pods) != n || slices.ContainsFunc(pods, func(p string) bool { return p != "Running" }) {
		t.Errorf("pods in %s: %v, want %d Running", ns, pods, n)
	}
	if nps := strings.Fields(c.MustRun(t, nil, "-n", ns, "get", "networkpolicies", "-l", "moat.sandbox/run", "-o", "name")); len(nps) != n {
		t.Errorf("networkpolicies in %s: %d, want %d", ns, len(nps), n)
	}

	start = time.Now()
	dels := make([]result, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dels[i] = e.moat("sandbox", "delete", name(i))
		}()
	}
	wg.Wait()
	t.Logf("%d kubernetes sandboxes deleted at once in %.1f s", n, time.Since(start).Seconds())
	for i, r := range dels {
		if r.code != 0 {
			t.Errorf("delete %s: %s", name(i), r)
			continue
		}
		if states[i].Journal == "" {
			continue
		}
		v := e.moat("audit", "verify", states[i].Journal, "--pubkey", states[i].PublicKey)
		if v.code != 0 || !strings.Contains(v.stdout, "deleted") {
			t.Errorf("%s: the journal after delete does not end deleted and verify: %s", name(i), v)
		}
	}
	noneLeft(t, c, ns)
}

// checkMeasuredReady checks the sandbox's own measurement in its journal:
// boundary.confirmed ready, the three properties enforced, each with at
// least one violation that failed and one control that worked, no check
// that went the unsafe way, and attribution declared unavailable.
func checkMeasuredReady(t *testing.T, name, journal string) {
	t.Helper()
	var bc *audit.BoundaryConfirmed
	for _, p := range payloadsOf(t, journal) {
		if p["type"] != "boundary.confirmed" {
			continue
		}
		b, _ := json.Marshal(p)
		var got audit.BoundaryConfirmed
		if err := json.Unmarshal(b, &got); err != nil {
			t.Errorf("%s: boundary.confirmed: %v", name, err)
			return
		}
		bc = &got
	}
	if bc == nil || !bc.Ready {
		t.Errorf("%s: no boundary.confirmed ready in %s", name, journal)
		return
	}
	props := bc.Properties
	for _, np := range props.Named() {
		if np.Name == "request_attribution" {
			if !np.Unavailable || np.Enforced {
				t.Errorf("%s: request_attribution %+v, want declared unavailable", name, *np.EnforcedProperty)
			}
			continue
		}
		if !np.Enforced {
			t.Errorf("%s: %s not enforced: %+v", name, np.Name, *np.EnforcedProperty)
		}
		var violations, controls int
		for _, c := range bc.Checks {
			if c.Property != np.Name {
				continue
			}
			if !c.OK {
				t.Errorf("%s: %s check %s (%s) went the unsafe way: %s %s", name, np.Name, c.Name, c.Kind, c.Outcome, c.Detail)
			}
			switch c.Kind {
			case "violation":
				violations++
			case "control":
				controls++
			}
		}
		if violations == 0 || controls == 0 {
			t.Errorf("%s: %s enforced on %d violations and %d controls measured in the Pod, want at least one of each", name, np.Name, violations, controls)
		}
	}
	if !strings.Contains(props.EgressInterception.Mechanism, "networkpolicy") {
		t.Errorf("%s: egress_interception mechanism %q does not name the NetworkPolicy", name, props.EgressInterception.Mechanism)
	}
}
