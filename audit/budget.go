package audit

import (
	"fmt"
	"strconv"
)

// TypeBudgetUpdated records a charge to the shared budget ledger of a
// sandbox created with `moat sandbox create --parent` (issue 14 item 2).
const TypeBudgetUpdated = "budget.updated"

// Budget outcomes (budget.updated's outcome).
const (
	// BudgetSettled: the request completed; the provider's reported
	// output tokens replaced the reservation.
	BudgetSettled = "settled"
	// BudgetKept: the outcome is uncertain (the request failed after its
	// pre-effect record: it may have reached the provider); the
	// reservation stays charged as spent.
	BudgetKept = "kept"
)

// BudgetUpdated is written after a request's reservation is settled or
// kept, and before the request's completion or failure record.
type BudgetUpdated struct {
	RequestID      string          `json:"request_id"`
	Outcome        string          `json:"outcome"` // BudgetSettled or BudgetKept
	ReservedTokens int64           `json:"reserved_tokens"`
	ChargedTokens  int64           `json:"charged_tokens"`
	Accounts       []BudgetBalance `json:"accounts"` // the sandbox's account first, then each ancestor's
}

// BudgetBalance is one account of the ledger after the charge: its usage
// (which includes its descendants') and its caps (0: none of its own).
type BudgetBalance struct {
	Account     string `json:"account"`
	Requests    int64  `json:"requests"`
	MaxRequests int64  `json:"max_requests"`
	Tokens      int64  `json:"tokens"`
	MaxTokens   int64  `json:"max_tokens"`
}

func (BudgetUpdated) RecordType() string { return TypeBudgetUpdated }

func init() { recordTypes[TypeBudgetUpdated] = decodeAs[BudgetUpdated] }

func describeBudget(r BudgetUpdated) string {
	s := fmt.Sprintf("id=%s outcome=%s reserved=%d charged=%d", r.RequestID, r.Outcome, r.ReservedTokens, r.ChargedTokens)
	for _, a := range r.Accounts {
		s += fmt.Sprintf(" %s=%d/%s req,%d/%s tok", a.Account, a.Requests, capText(a.MaxRequests), a.Tokens, capText(a.MaxTokens))
	}
	return s
}

func capText(n int64) string {
	if n == 0 {
		return "-"
	}
	return strconv.FormatInt(n, 10)
}
