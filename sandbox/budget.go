package sandbox

import (
	"fmt"
	"slices"
	"strconv"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/broker"
	"github.com/moat-sandbox/moat/internal/ledger"
)

// Shared budgets (issue 14 item 2). Every sandbox has an account in a
// budget ledger (internal/ledger), whose caps are its policy's
// inference.max_requests and --max-tokens (0: none): a sandbox created
// without --parent is the root of a new ledger in its own state
// directory; one created with --parent P gets an account under P's in
// P's ledger, so that every request of the child is charged to P and to
// each of P's ancestors too, atomically, before it leaves. Only the
// operator's CLI on the host creates children: the state directory is
// never reachable from a workload.

// budgetArgs are the supervisor's arguments after AUDITDIR: the ledger
// directory ("" for a new ledger in the sandbox's own directory), the
// parent's name and the sandbox's own output-token cap.
func budgetArgs(ledgerDir, parent string, maxTokens int64) []string {
	return []string{ledgerDir, parent, strconv.FormatInt(maxTokens, 10)}
}

// parentLedger checks that parent names a Ready sandbox whose supervisor
// is alive and returns its ledger directory.
func parentLedger(st *store, parent string) (string, error) {
	if err := ValidateName(parent); err != nil {
		return "", &RefusedError{Msg: "--parent: " + err.Error()}
	}
	ps, err := st.read(parent)
	if err != nil {
		return "", &RefusedError{Msg: fmt.Sprintf("--parent %s: %v", parent, err)}
	}
	if ps.Phase != boundary.PhaseReady || !ps.alive() {
		return "", &RefusedError{Msg: fmt.Sprintf("--parent %s: the sandbox is %s, not Ready with a live supervisor; a child draws on a running parent's budget", parent, ps.Phase)}
	}
	if ps.Ledger == "" {
		return "", &RefusedError{Msg: fmt.Sprintf("--parent %s: the sandbox has no budget ledger (it was created by an older moat); recreate it", parent)}
	}
	return ps.Ledger, nil
}

// openBudget gives the supervisor of sandbox name (state directory dir)
// its account: in a new ledger in dir when ledgerDir is "", else under
// parent in ledgerDir. It returns the broker's Budget and the ledger
// directory.
func openBudget(dir, name, ledgerDir, parent string, maxRequests int, maxTokens string) (broker.Budget, *ledger.Ledger, error) {
	mt, err := strconv.ParseInt(maxTokens, 10, 64)
	if err != nil || mt < 0 {
		return nil, nil, fmt.Errorf("budget: --max-tokens %q is not a count of tokens", maxTokens)
	}
	if ledgerDir == "" {
		if parent != "" {
			return nil, nil, fmt.Errorf("budget: a parent (%s) without its ledger", parent)
		}
		ledgerDir = dir
	}
	l, err := ledger.Open(ledgerDir)
	if err != nil {
		return nil, nil, fmt.Errorf("budget: %w", err)
	}
	// An account of this name is left by a supervisor that was killed
	// (it retires its account when it ends): the name is unique in the
	// state directory (Create made the sandbox's directory), so that
	// account is stale. Retiring it keeps what it spent, and its open
	// reservations, charged to the ancestors.
	if err := l.Retire(name); err != nil {
		return nil, nil, fmt.Errorf("budget: %w", err)
	}
	if err := l.AddAccount(name, parent, int64(maxRequests), mt); err != nil {
		return nil, nil, fmt.Errorf("budget: %w", err)
	}
	return ledger.Charger{L: l, Account: name}, l, nil
}

// liveChildren names the sandboxes drawing on s's budget whose supervisor
// is alive: deleting s would take their budget (for a root: the ledger
// itself) away, so Delete refuses until they are deleted.
func liveChildren(st *store, s *State) []string {
	if s.Ledger == "" {
		return nil
	}
	l, err := ledger.Open(s.Ledger)
	if err != nil {
		return nil // no ledger left: nothing draws on it
	}
	snap, err := l.Snapshot()
	if err != nil {
		return nil
	}
	var out []string
	for name, a := range snap.Accounts {
		if a.Parent != s.Name || ValidateName(name) != nil {
			continue
		}
		if cs, err := st.read(name); err == nil && cs.alive() && cs.Parent == s.Name {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}
