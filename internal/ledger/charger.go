package ledger

import "github.com/moat-sandbox/moat/audit"

// Charger charges one account of a ledger: it is the broker's Budget for
// the sandbox that owns the account (broker.Budget).
type Charger struct {
	L       *Ledger
	Account string
}

// Reserve charges one request and tokens output tokens to the account and
// its ancestors under id; a refusal for a cap wraps ErrExhausted.
func (c Charger) Reserve(id string, tokens int64) error {
	_, err := c.L.Reserve(id, c.Account, tokens)
	return err
}

// Settle closes id with the reported output tokens and returns the
// budget.updated record.
func (c Charger) Settle(id string, used int64) (audit.BudgetUpdated, error) {
	bal, reserved, err := c.L.Settle(id, used)
	return record(id, audit.BudgetSettled, reserved, used, bal), err
}

// Keep closes id leaving its reservation charged and returns the
// budget.updated record.
func (c Charger) Keep(id string) (audit.BudgetUpdated, error) {
	bal, reserved, err := c.L.Keep(id)
	return record(id, audit.BudgetKept, reserved, reserved, bal), err
}

func record(id, outcome string, reserved, charged int64, bal []Balance) audit.BudgetUpdated {
	r := audit.BudgetUpdated{RequestID: id, Outcome: outcome, ReservedTokens: reserved, ChargedTokens: charged,
		Accounts: make([]audit.BudgetBalance, len(bal))}
	for i, b := range bal {
		r.Accounts[i] = audit.BudgetBalance{Account: b.Account, Requests: b.Requests, MaxRequests: b.MaxRequests, Tokens: b.Tokens, MaxTokens: b.MaxTokens}
	}
	return r
}
