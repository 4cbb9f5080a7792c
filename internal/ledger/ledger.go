// Package ledger is the budget ledger that sandboxes created with `moat
// sandbox create --parent` share with their ancestors: a request and its
// output tokens are reserved against the sandbox's account and every
// ancestor's, atomically, before the request's pre-effect record, and
// settled with the provider's reported usage when it completes.
//
// # Why a file under flock
//
// Each sandbox has its own supervisor process, so the ledger must be
// shared across processes, and it must outlive any of them: a supervisor
// that is killed between reserving and settling must leave its charge
// counted. The ledger is therefore one file, ledger.json in the root
// sandbox's state directory, beside a lock file ledger.lock. Every
// operation takes an exclusive flock(2) on ledger.lock, reads ledger.json,
// checks and changes it in memory, writes the whole new state to a
// temporary file, fsyncs it, renames it over ledger.json and fsyncs the
// directory, then releases the lock. (The root's supervisor as the ledger
// authority over its control socket was the other design: it makes every
// child depend on that one process staying alive and reachable, and the
// state still has to be made durable for a crash.)
//
// # Crash consistency
//
// rename(2) replaces ledger.json atomically, so after a crash at any point
// the file holds either the state before an operation or the state after
// it, never a mixture; a stale temporary file is ignored and overwritten.
// flock is released by the kernel when its holder dies, so a crashed
// process never blocks the others. A reservation is written (durable)
// before Reserve returns, and the broker takes it before the request's
// pre-effect record, so no request can leave uncharged. A reservation that
// is never settled (the supervisor crashed, the outcome is uncertain)
// stays in the ledger and keeps counting as spent: the ledger errs toward
// refusing, never toward overspending.
//
// # Accounts
//
// An account has an optional parent (every ancestor must exist), a
// request cap and an output-token cap (0: no cap of its own, only its
// ancestors'), and its usage: requests (every request ever reserved,
// whatever its outcome, as the broker's allowance always counted) and
// tokens (settled usage plus the tokens of open reservations). An
// account's usage includes its descendants'. Reserve(account, n) succeeds
// only when, for the account and each ancestor, requests+1 and tokens+n
// stay within its caps; then it adds to all of them in the same write.
// Settle replaces a reservation's tokens by the provider's reported
// output tokens; Keep leaves them as they are.
package ledger

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// File names in the ledger's directory.
const (
	File     = "ledger.json"
	LockFile = "ledger.lock"
	tmpFile  = "ledger.json.tmp"
)

// MaxDepth caps the chain of ancestors of an account.
const MaxDepth = 16

// maxFileBytes caps ledger.json.
const maxFileBytes = 16 << 20

// ErrExhausted is wrapped by Reserve's refusal: a cap would be exceeded.
var ErrExhausted = errors.New("budget exhausted")

// ErrUnknown is wrapped when an account or reservation does not exist.
var ErrUnknown = errors.New("unknown")

// Account is one sandbox's budget and usage.
type Account struct {
	Parent      string `json:"parent,omitempty"`
	MaxRequests int64  `json:"max_requests"`
	MaxTokens   int64  `json:"max_tokens"`
	Requests    int64  `json:"requests"`
	Tokens      int64  `json:"tokens"`
}

// Reservation is an open reservation: charged, not yet settled.
type Reservation struct {
	Account string `json:"account"`
	Tokens  int64  `json:"tokens"`
}

// State is the ledger's content.
type State struct {
	V            int                     `json:"v"`
	Accounts     map[string]*Account     `json:"accounts"`
	Reservations map[string]*Reservation `json:"reservations"`
}

// Balance is one account's caps and usage after an operation.
type Balance struct {
	Account     string `json:"account"`
	Requests    int64  `json:"requests"`
	MaxRequests int64  `json:"max_requests"`
	Tokens      int64  `json:"tokens"`
	MaxTokens   int64  `json:"max_tokens"`
}

// Ledger is a ledger directory.
type Ledger struct{ dir string }

// Open returns the ledger in dir, creating dir's ledger files if needed.
func Open(dir string) (*Ledger, error) {
	if !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("ledger: directory %q is not absolute", dir)
	}
	l := &Ledger{dir: dir}
	err := l.update(func(*State) error { return nil })
	if err != nil {
		return nil, err
	}
	return l, nil
}

// Dir is the ledger's directory.
func (l *Ledger) Dir() string { return l.dir }

// update runs f on the state under the lock and writes the result
// atomically when f succeeds.
func (l *Ledger) update(f func(*State) error) error {
	lf, err := os.OpenFile(filepath.Join(l.dir, LockFile), os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	defer lf.Close()
	for {
		err = unix.Flock(int(lf.Fd()), unix.LOCK_EX)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("ledger: locking %s: %w", lf.Name(), err)
	}
	defer unix.Flock(int(lf.Fd()), unix.LOCK_UN)
	st, err := l.read()
	if err != nil {
		return err
	}
	if err := f(st); err != nil {
		return err
	}
	return l.write(st)
}

func (l *Ledger) read() (*State, error) {
	st := &State{V: 1, Accounts: map[string]*Account{}, Reservations: map[string]*Reservation{}}
	f, err := os.OpenFile(filepath.Join(l.dir, File), os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if errors.Is(err, os.ErrNotExist) {
		return st, nil
	}
	if err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	}
	if !fi.Mode().IsRegular() || fi.Size() > maxFileBytes {
		return nil, fmt.Errorf("ledger: %s is not a regular file of at most %d bytes", f.Name(), maxFileBytes)
	}
	b := make([]byte, fi.Size())
	if _, err := f.ReadAt(b, 0); err != nil && fi.Size() > 0 {
		return nil, fmt.Errorf("ledger: reading %s: %w", f.Name(), err)
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(st); err != nil || st.V != 1 || st.Accounts == nil || st.Reservations == nil {
		// Fail closed: a ledger that cannot be read charges nothing
		// and admits nothing.
		return nil, fmt.Errorf("ledger: %s is damaged (%v); no request can be charged until it is repaired", f.Name(), err)
	}
	return st, nil
}

func (l *Ledger) write(st *State) error {
	b, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	tmp := filepath.Join(l.dir, tmpFile)
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	if _, err = f.Write(b); err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(l.dir, File))
	}
	if err == nil {
		var d *os.File
		if d, err = os.Open(l.dir); err == nil {
			err = d.Sync()
			d.Close()
		}
	}
	if err != nil {
		return fmt.Errorf("ledger: writing %s: %w", filepath.Join(l.dir, File), err)
	}
	return nil
}

// chain returns name and its ancestors, nearest first.
func (st *State) chain(name string) ([]string, error) {
	var out []string
	for n := name; n != ""; {
		a, ok := st.Accounts[n]
		if !ok {
			return nil, fmt.Errorf("ledger: account %q: %w (its sandbox or an ancestor was deleted)", n, ErrUnknown)
		}
		out = append(out, n)
		if len(out) > MaxDepth {
			return nil, fmt.Errorf("ledger: account %q has more than %d ancestors", name, MaxDepth)
		}
		n = a.Parent
	}
	return out, nil
}

func (st *State) balances(chain []string) []Balance {
	out := make([]Balance, len(chain))
	for i, n := range chain {
		a := st.Accounts[n]
		out[i] = Balance{Account: n, Requests: a.Requests, MaxRequests: a.MaxRequests, Tokens: a.Tokens, MaxTokens: a.MaxTokens}
	}
	return out
}

// AddAccount adds an account under parent ("" for a root) with its own
// caps (0: none). The name must be new.
func (l *Ledger) AddAccount(name, parent string, maxRequests, maxTokens int64) error {
	if name == "" || maxRequests < 0 || maxTokens < 0 {
		return fmt.Errorf("ledger: bad account %q (caps %d, %d)", name, maxRequests, maxTokens)
	}
	return l.update(func(st *State) error {
		if _, ok := st.Accounts[name]; ok {
			return fmt.Errorf("ledger: account %q already exists", name)
		}
		if parent != "" {
			c, err := st.chain(parent)
			if err != nil {
				return err
			}
			if len(c) >= MaxDepth {
				return fmt.Errorf("ledger: parent %q is already %d deep", parent, len(c))
			}
		}
		st.Accounts[name] = &Account{Parent: parent, MaxRequests: maxRequests, MaxTokens: maxTokens}
		return nil
	})
}

// Reserve charges one request and tokens output tokens to account and
// every ancestor, under id (unique: the request's id), or refuses with an
// error wrapping ErrExhausted that names the account whose cap it would
// pass. It returns the balances after the charge, nearest first.
func (l *Ledger) Reserve(id, account string, tokens int64) ([]Balance, error) {
	if tokens < 0 {
		return nil, fmt.Errorf("ledger: negative reservation %d", tokens)
	}
	var out []Balance
	err := l.update(func(st *State) error {
		if _, dup := st.Reservations[id]; dup || id == "" {
			return fmt.Errorf("ledger: reservation id %q is empty or in use", id)
		}
		chain, err := st.chain(account)
		if err != nil {
			return err
		}
		for _, n := range chain {
			a := st.Accounts[n]
			if a.MaxRequests > 0 && a.Requests+1 > a.MaxRequests {
				return fmt.Errorf("%w: %s has used %d of its %d requests", ErrExhausted, n, a.Requests, a.MaxRequests)
			}
			if a.MaxTokens > 0 && a.Tokens+tokens > a.MaxTokens {
				return fmt.Errorf("%w: %s has %d of its %d output tokens left, and this request reserves %d (its max_tokens)", ErrExhausted, n, max(a.MaxTokens-a.Tokens, 0), a.MaxTokens, tokens)
			}
		}
		for _, n := range chain {
			a := st.Accounts[n]
			a.Requests++
			a.Tokens += tokens
		}
		st.Reservations[id] = &Reservation{Account: account, Tokens: tokens}
		out = st.balances(chain)
		return nil
	})
	return out, err
}

// Settle closes reservation id with the output tokens the provider
// reported: each account in the chain is charged used instead of the
// reserved amount (more than reserved only if the provider went past the
// request's max_tokens; that is charged too). It returns the balances
// after it and the tokens that had been reserved.
func (l *Ledger) Settle(id string, used int64) (bal []Balance, reserved int64, err error) {
	if used < 0 {
		return nil, 0, fmt.Errorf("ledger: negative usage %d", used)
	}
	return l.close(id, &used)
}

// Keep closes reservation id leaving its charge as spent: the outcome is
// uncertain (the request may have been served).
func (l *Ledger) Keep(id string) (bal []Balance, reserved int64, err error) {
	return l.close(id, nil)
}

func (l *Ledger) close(id string, used *int64) (bal []Balance, reserved int64, err error) {
	err = l.update(func(st *State) error {
		r, ok := st.Reservations[id]
		if !ok {
			return fmt.Errorf("ledger: reservation %q: %w", id, ErrUnknown)
		}
		chain, err := st.chain(r.Account)
		if err != nil {
			return err
		}
		if used != nil {
			for _, n := range chain {
				st.Accounts[n].Tokens += *used - r.Tokens
			}
		}
		delete(st.Reservations, id)
		reserved, bal = r.Tokens, st.balances(chain)
		return nil
	})
	return bal, reserved, err
}

// Snapshot returns a copy of the ledger's state.
func (l *Ledger) Snapshot() (*State, error) {
	var out *State
	err := l.update(func(st *State) error { out = st; return nil })
	return out, err
}

// Retire removes an account whose sandbox is gone, so that its name can
// be used again. What it spent stays counted in its ancestors; its open
// reservations stay charged (they are kept, under no account's name but
// still in the ancestors' usage). An account that is the parent of
// another is not removed (its children still draw through it).
func (l *Ledger) Retire(name string) error {
	return l.update(func(st *State) error {
		if _, ok := st.Accounts[name]; !ok {
			return nil
		}
		for _, a := range st.Accounts {
			if a.Parent == name {
				return nil
			}
		}
		for id, r := range st.Reservations {
			if r.Account == name {
				delete(st.Reservations, id)
			}
		}
		delete(st.Accounts, name)
		return nil
	})
}
