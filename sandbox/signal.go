package sandbox

import (
	"fmt"
	"syscall"
)

// forwardable are the signals a `moat sandbox exec` client forwards to
// the process it started: what a terminal or a caller sends to end or
// interrupt it.
var forwardable = map[syscall.Signal]bool{
	syscall.SIGINT: true, syscall.SIGTERM: true, syscall.SIGHUP: true, syscall.SIGQUIT: true,
}

// Signal sends sig to a process started with Start and still running.
func (s *Session) Signal(id string, sig syscall.Signal) error {
	if !forwardable[sig] {
		return fmt.Errorf("signal %d is not forwarded (only SIGINT, SIGTERM, SIGHUP, SIGQUIT)", int(sig))
	}
	s.mu.Lock()
	p := s.running[id]
	s.mu.Unlock()
	if p == nil {
		return fmt.Errorf("no running process %q", id)
	}
	return p.Signal(sig)
}
