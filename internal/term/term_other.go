//go:build !linux

// Package term: moat's pty relay is Linux-only, as its backends are.
package term

import (
	"errors"
	"os"
)

// IsTerminal reports false: moat relays no terminal here.
func IsTerminal(f *os.File) bool { return false }

// Relay is not available on this system.
type Relay struct{}

// SetOnSignal does nothing.
func (r *Relay) SetOnSignal(f func(os.Signal)) {}

// Start fails: moat's backends are Linux-only.
func Start(in, out *os.File) (*Relay, error) {
	return nil, errors.New("terminals are relayed on Linux only")
}

// Slave is nil.
func (r *Relay) Slave() *os.File { return nil }

// CloseSlave does nothing.
func (r *Relay) CloseSlave() {}

// Stop does nothing.
func (r *Relay) Stop() error { return nil }
