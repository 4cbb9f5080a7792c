package broker

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/internal/ledger"
)

// Budget is a ledger shared with other sandboxes (a parent and its
// children: internal/ledger, through package sandbox). The broker takes a
// reservation of one request and the request's max_tokens before its
// pre-effect record, and closes it before the request's completion or
// failure record, journaling budget.updated: settled with the provider's
// reported output tokens when the request completed, kept as spent when
// it failed after the reservation (it may have been served). A
// reservation that is never closed (the supervisor died) stays charged.
type Budget interface {
	// Reserve charges one request and tokens output tokens under id, or
	// refuses: an error wrapping ErrBudgetExhausted when a cap would be
	// passed, any other error when the ledger cannot be used (the
	// request is refused too: fail closed).
	Reserve(id string, tokens int64) error
	// Settle closes id with the reported output tokens.
	Settle(id string, used int64) (audit.BudgetUpdated, error)
	// Keep closes id leaving its reservation charged.
	Keep(id string) (audit.BudgetUpdated, error)
}

// ErrBudgetExhausted is wrapped by a Budget's refusal to reserve (the
// ledger's own sentinel).
var ErrBudgetExhausted = ledger.ErrExhausted

// Reasons of a refusal by the shared budget.
const (
	ReasonBudgetExhausted   Reason = "budget_exhausted"
	ReasonBudgetUnavailable Reason = "budget_unavailable"
)

// maxChargedTokens bounds what one request is charged from a provider's
// report (an int the provider chooses): more than any real response, and
// far from overflowing the ledger's sums.
const maxChargedTokens = 1 << 40

// reserveBudget takes x's reservation, before its pre-effect record; a
// refusal is returned for the caller to journal.
func (b *Broker) reserveBudget(x *exchange, tokens int) *frontError {
	bg := b.cfg.Budget
	if bg == nil {
		return nil
	}
	if err := bg.Reserve(x.id, int64(tokens)); err != nil {
		if errors.Is(err, ErrBudgetExhausted) {
			return refuse(ReasonBudgetExhausted, 429, "the shared budget cannot cover this request (%s); no further model requests fit in it", err)
		}
		return refuse(ReasonBudgetUnavailable, 503, "the shared budget ledger could not be used, so the request was not sent (%s)", err)
	}
	x.budgeted = true
	return nil
}

// closeBudget closes x's reservation, if it has one, and journals
// budget.updated. usage is nil when the outcome is uncertain (kept).
func (b *Broker) closeBudget(x *exchange, usage *audit.Usage) {
	if !x.budgeted {
		return
	}
	x.budgeted = false
	var (
		rec audit.BudgetUpdated
		err error
	)
	// A response that reports no usage (both counts 0) is not settled
	// with 0: its reservation is kept, as for an uncertain outcome.
	if usage != nil && usage.OutputTokens >= 0 && *usage != (audit.Usage{}) {
		rec, err = b.cfg.Budget.Settle(x.id, int64(min(usage.OutputTokens, maxChargedTokens)))
	} else {
		rec, err = b.cfg.Budget.Keep(x.id)
	}
	if err != nil {
		// The reservation stays open in the ledger, so it stays charged:
		// nothing is lost but the record of it.
		b.log.Warn("moat.broker budget", slog.String("request_id", x.id), slog.String("detail", fmt.Sprintf("closing the reservation failed; it stays charged: %v", err)))
		return
	}
	b.append(rec)
}
