//go:build linux

package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/internal/fakeprovider"
	"github.com/moat-sandbox/moat/internal/ledger"
)

// budgetPolicy writes a policy with one Anthropic provider at p and the
// given request cap, with its own workspace.
func (e *env) budgetPolicy(name string, p *provider, maxRequests int) string {
	return e.policyAt(filepath.Join(e.dir, name+".yaml"), e.newWorkspace(name), fmt.Sprintf(`inference:
  max_requests: %d
  max_output_tokens: 1024
  providers:
    - name: anthropic
      api: anthropic-messages
      base_url: http://127.0.0.1:%d
      credential_env: E2E_ANTHROPIC_KEY
      models: [claude-e2e]
`, maxRequests, p.Port()))
}

// sandboxCmd runs a lifecycle command with the provider's credential in
// the environment (the supervisor inherits it at create).
func (e *env) sandboxCmd(args ...string) result {
	e.t.Helper()
	cmd := e.command(args...)
	cmd.Env = append(cmd.Env, "E2E_ANTHROPIC_KEY="+anthropicCred)
	var so, se strings.Builder
	cmd.Stdout, cmd.Stderr = &so, &se
	cmd.Run()
	return result{so.String(), se.String(), cmd.ProcessState.ExitCode()}
}

func (e *env) ledgerOf(root string) *ledger.State {
	e.t.Helper()
	l, err := ledger.Open(filepath.Join(e.stateDir, "sandboxes", root))
	if err != nil {
		e.t.Fatal(err)
	}
	st, err := l.Snapshot()
	if err != nil {
		e.t.Fatal(err)
	}
	return st
}

// TestBudgetSharedByChildren: eight real child sandboxes under one parent
// whose budget is 13 requests, each child asking for 4 at the same time
// (32 in all): the provider receives exactly 13; each served request has
// budget.updated (settled) before its inference.completed in its child's
// journal, which verifies complete after delete.
func TestBudgetSharedByChildren(t *testing.T) {
	e := newEnv(t)
	p, err := fakeprovider.Start(fakeprovider.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	const children, each, budget = 8, 4, 13
	if r := e.sandboxCmd("sandbox", "create", "lead", "--policy", e.budgetPolicy("lead", p, budget)); r.code != 0 {
		t.Fatalf("create lead: %s", r)
	}
	t.Cleanup(func() { e.moat("sandbox", "delete", "lead", "--ignore-not-found") })
	// --parent is checked: a missing parent is refused.
	if r := e.sandboxCmd("sandbox", "create", "orphan", "--policy", e.budgetPolicy("orphan", p, 64), "--parent", "nosuch"); r.code != 125 || !strings.Contains(r.stderr, "--parent nosuch") {
		t.Fatalf("create under a missing parent: %s", r)
	}
	var wg sync.WaitGroup
	for i := range children {
		name := fmt.Sprintf("w%d", i)
		if r := e.sandboxCmd("sandbox", "create", name, "--policy", e.budgetPolicy(name, p, 64), "--parent", "lead"); r.code != 0 {
			t.Fatalf("create %s: %s", name, r)
		}
		t.Cleanup(func() { e.moat("sandbox", "delete", name, "--ignore-not-found") })
	}
	outs := make([]result, children)
	for i := range children {
		wg.Add(1)
		go func() {
			defer wg.Done()
			args := []string{"sandbox", "exec", fmt.Sprintf("w%d", i), "--", e.probe, helperArg}
			for range each {
				args = append(args, "sdk-anthropic=claude-e2e")
			}
			outs[i] = e.moat(args...)
		}()
	}
	wg.Wait()
	served := 0
	for i, r := range outs {
		served += strings.Count(r.stdout, "sdk-anthropic=claude-e2e ok")
		if n := strings.Count(r.stdout, "sdk-anthropic=claude-e2e "); n != each {
			t.Errorf("w%d: %d answers, want %d\n%s", i, n, each, r)
		}
	}
	if got := p.Count(); got != budget || served != budget {
		t.Fatalf("provider saw %d requests, the workers were served %d; want exactly the budget %d", got, served, budget)
	}
	if st := e.ledgerOf("lead"); st.Accounts["lead"].Requests != budget || st.Accounts["lead"].Tokens != 5*budget || len(st.Reservations) != 0 {
		t.Fatalf("ledger: %+v, %d open", st.Accounts["lead"], len(st.Reservations))
	}
	// The parent cannot be deleted under its running children.
	if r := e.moat("sandbox", "delete", "lead"); r.code != 125 || !strings.Contains(r.stderr, "running children drawing on its budget (w0, w1, w2") {
		t.Fatalf("delete the parent first: %s", r)
	}
	// Each child's journal: budget.updated right before each completion.
	settled := 0
	for i := range children {
		name := fmt.Sprintf("w%d", i)
		s, _ := e.get(name)
		if r := e.moat("sandbox", "delete", name); r.code != 0 {
			t.Fatalf("delete %s: %s", name, r)
		}
		raw, err := os.ReadFile(s.Journal)
		if err != nil {
			t.Fatal(err)
		}
		var prev string
		for _, line := range strings.Split(strings.TrimSuffix(string(raw), "\n"), "\n") {
			ent, err := audit.ParseLine([]byte(line))
			if err != nil {
				t.Fatal(err)
			}
			switch r := ent.Record.(type) {
			case audit.InferenceCompleted:
				if prev != audit.TypeBudgetUpdated {
					t.Errorf("%s: inference.completed after %s, want budget.updated", name, prev)
				}
			case audit.BudgetUpdated:
				if r.Outcome != audit.BudgetSettled || r.ChargedTokens != 5 || r.Accounts[1].Account != "lead" {
					t.Errorf("%s: %+v", name, r)
				}
				settled++
			}
			prev = ent.Header.Type
		}
		if v := e.moat("audit", "verify", s.Journal, "--key-fingerprint", s.KeyID); v.code != 0 {
			t.Errorf("%s journal: %s", name, v)
		}
	}
	if settled != budget {
		t.Errorf("%d budget.updated records, want %d", settled, budget)
	}
	// Without children the parent is deleted (control).
	if r := e.moat("sandbox", "delete", "lead"); r.code != 0 {
		t.Fatalf("delete the parent last: %s", r)
	}
}

// TestBudgetUncertainKept: a child whose request the provider drops after
// receiving it keeps the charge (its reservation of max_tokens) in the
// parent's token budget; a request that then still fits is served
// (control), and one that does not is refused without reaching the
// provider.
func TestBudgetUncertainKept(t *testing.T) {
	e := newEnv(t)
	p, err := fakeprovider.Start(fakeprovider.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	// The SDK asks for max_tokens 64. The first request is dropped after
	// it arrived: its 64 stay charged (of 140).
	if r := e.sandboxCmd("sandbox", "create", "lead2", "--policy", e.budgetPolicy("lead2", p, 64), "--max-tokens", "140"); r.code != 0 {
		t.Fatalf("create: %s", r)
	}
	t.Cleanup(func() { e.moat("sandbox", "delete", "lead2", "--ignore-not-found") })
	if r := e.sandboxCmd("sandbox", "create", "c1", "--policy", e.budgetPolicy("c1", p, 64), "--parent", "lead2"); r.code != 0 {
		t.Fatalf("create child: %s", r)
	}
	t.Cleanup(func() { e.moat("sandbox", "delete", "c1", "--ignore-not-found") })
	var calls atomic.Int64
	p.SetRespond(func(w http.ResponseWriter, r *http.Request, body []byte) {
		if calls.Add(1) == 1 {
			c, _, _ := w.(http.Hijacker).Hijack()
			c.Close() // the provider got it; the answer is lost
			return
		}
		fakeprovider.Respond(w, r, body)
	})
	if r := e.moat("sandbox", "exec", "c1", "--", e.probe, helperArg, "sdk-anthropic=claude-e2e"); !strings.Contains(r.stdout, "sdk-anthropic=claude-e2e err") || p.Count() != 1 {
		t.Fatalf("the dropped request: provider %d\n%s", p.Count(), r)
	}
	if st := e.ledgerOf("lead2"); st.Accounts["lead2"].Tokens != 64 || st.Accounts["c1"].Tokens != 64 || len(st.Reservations) != 0 {
		t.Fatalf("after the dropped request: %+v, %d open", st.Accounts, len(st.Reservations))
	}
	// 64 -> 128 -> 69 -> 133 -> 74 -> 138 -> 79: three are served (the
	// control), then 79+64 > 140 is refused before the provider.
	r := e.moat("sandbox", "exec", "c1", "--", e.probe, helperArg, "sdk-anthropic=claude-e2e", "sdk-anthropic=claude-e2e", "sdk-anthropic=claude-e2e", "sdk-anthropic=claude-e2e")
	if got := strings.Count(r.stdout, " ok"); got != 3 || !strings.Contains(r.stdout, "the shared budget cannot cover this request") || p.Count() != 4 {
		t.Fatalf("under the kept charge: %d served, provider %d\n%s", got, p.Count(), r)
	}
	if st := e.ledgerOf("lead2"); st.Accounts["lead2"].Tokens != 79 || st.Accounts["lead2"].Requests != 4 {
		t.Fatalf("ledger at the end: %+v", st.Accounts["lead2"])
	}
	s, _ := e.get("c1")
	raw, _ := os.ReadFile(s.Journal)
	var kept int
	for _, line := range strings.Split(strings.TrimSuffix(string(raw), "\n"), "\n") {
		var m map[string]any
		ent, err := audit.ParseLine([]byte(line))
		if err != nil {
			t.Fatal(err)
		}
		json.Unmarshal(ent.Payload, &m)
		if m["type"] == audit.TypeBudgetUpdated && m["outcome"] == audit.BudgetKept {
			kept++
		}
	}
	if kept != 1 {
		t.Errorf("%d kept budget.updated records, want 1", kept)
	}
}

// TestBudgetSupervisorKilledKeepsCharge: a child's supervisor SIGKILLed
// while its request is at the provider leaves the reservation charged
// to the parent; the child's name can be used again, and the charge
// still counts: of 130 tokens, 64 are gone, so one more request of 64
// fits (control) and the next does not.
func TestBudgetSupervisorKilledKeepsCharge(t *testing.T) {
	e := newEnv(t)
	p, err := fakeprovider.Start(fakeprovider.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	release := make(chan struct{})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	t.Cleanup(free)
	p.SetRespond(func(w http.ResponseWriter, r *http.Request, body []byte) {
		<-release
		fakeprovider.Respond(w, r, body)
	})
	if r := e.sandboxCmd("sandbox", "create", "lead3", "--policy", e.budgetPolicy("lead3", p, 64), "--max-tokens", "130"); r.code != 0 {
		t.Fatalf("create: %s", r)
	}
	t.Cleanup(func() { e.moat("sandbox", "delete", "lead3", "--ignore-not-found") })
	if r := e.sandboxCmd("sandbox", "create", "k1", "--policy", e.budgetPolicy("k1", p, 64), "--parent", "lead3"); r.code != 0 {
		t.Fatalf("create child: %s", r)
	}
	t.Cleanup(func() { e.moat("sandbox", "delete", "k1", "--ignore-not-found") })
	s, _ := e.get("k1")
	cmd := e.command("sandbox", "exec", "k1", "--", e.probe, helperArg, "sdk-anthropic=claude-e2e")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the request at the provider", 30*e2eSecond, func() bool { return p.Count() == 1 })
	if err := syscall.Kill(s.SupervisorPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	free()
	if st := e.ledgerOf("lead3"); st.Accounts["lead3"].Tokens != 64 || len(st.Reservations) != 1 {
		t.Fatalf("after the supervisor was killed: %+v, %d open", st.Accounts["lead3"], len(st.Reservations))
	}
	if r := e.moat("sandbox", "delete", "k1"); r.code != 0 {
		t.Fatalf("delete the killed child: %s", r)
	}
	if r := e.sandboxCmd("sandbox", "create", "k1", "--policy", e.budgetPolicy("k1b", p, 64), "--parent", "lead3"); r.code != 0 {
		t.Fatalf("create the child again: %s", r)
	}
	if st := e.ledgerOf("lead3"); st.Accounts["lead3"].Tokens != 64 || st.Accounts["k1"].Tokens != 0 {
		t.Fatalf("after the child was made again: %+v", st.Accounts)
	}
	r := e.moat("sandbox", "exec", "k1", "--", e.probe, helperArg, "sdk-anthropic=claude-e2e", "sdk-anthropic=claude-e2e")
	if got := strings.Count(r.stdout, " ok"); got != 1 || !strings.Contains(r.stdout, "the shared budget cannot cover this request") || p.Count() != 2 {
		t.Fatalf("after the kept charge: %d served, provider %d\n%s", got, p.Count(), r)
	}
}
