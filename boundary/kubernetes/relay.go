package kubernetes

import (
	"errors"
	"io"
	"strings"
	"sync"
	"time"
)

// notStartedErrors are what the runtime answers when an exec failed
// before any process was made for it: containerd's CRI loads the
// container's task (one state call to the shim, under a 2 s timeout
// that a loaded node misses) and creates the exec before it starts
// anything. Such an exec can be made again, if the caller's stdin gave
// it nothing (stdinRelay). Nothing else is retried: an exec that may
// have run is never run twice.
var notStartedErrors = []string{
	"failed to exec in container: failed to load task:",
	"failed to exec in container: failed to create exec ",
}

// execAttempts bounds how often one exec is made.
const execAttempts = 5

// execBackoff is the wait before an exec's second attempt, doubling for
// each after it (a variable for the tests).
var execBackoff = 250 * time.Millisecond

// notStarted reports whether err says the exec started nothing.
func notStarted(err error) bool {
	if err == nil || exitCode(err) >= 0 {
		return false
	}
	msg := err.Error()
	for _, s := range notStartedErrors {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// errAttemptOver is what an abandoned attempt's reader returns.
var errAttemptOver = errors.New("kubernetes: this exec attempt is over")

// stdinRelay hands the caller's stdin to one exec attempt after
// another without losing a byte to an abandoned one: it reads src
// only when an attempt asks, keeps what it read until a live attempt
// takes it, and says whether any attempt was given a byte (after which
// the exec is not made again).
type stdinRelay struct {
	src io.Reader

	mu        sync.Mutex
	pending   []byte
	err       error         // src's error, once it gave one
	filling   chan struct{} // closed when the read under way returns
	delivered bool
}

func newStdinRelay(src io.Reader) *stdinRelay { return &stdinRelay{src: src} }

// attempt is the stdin of one exec attempt; end it (end) before the
// next attempt begins.
func (r *stdinRelay) attempt() *relayAttempt {
	return &relayAttempt{r: r, over: make(chan struct{})}
}

// gaveAny reports whether an attempt was given any byte of src.
func (r *stdinRelay) gaveAny() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.delivered
}

func (r *stdinRelay) fill(done chan struct{}) {
	buf := make([]byte, 32<<10)
	n, err := r.src.Read(buf)
	r.mu.Lock()
	r.pending = append(r.pending, buf[:n]...)
	if err != nil {
		r.err = err
	}
	r.filling = nil
	r.mu.Unlock()
	close(done)
}

type relayAttempt struct {
	r    *stdinRelay
	over chan struct{}
	once sync.Once
	dead bool // under r.mu
}

// end marks the attempt over: its reader gives nothing more, and a read
// it has pending returns.
func (a *relayAttempt) end() {
	a.once.Do(func() {
		a.r.mu.Lock()
		a.dead = true
		a.r.mu.Unlock()
		close(a.over)
	})
}

func (a *relayAttempt) Read(p []byte) (int, error) {
	r := a.r
	for {
		r.mu.Lock()
		switch {
		case a.dead:
			r.mu.Unlock()
			return 0, errAttemptOver
		case len(r.pending) > 0:
			n := copy(p, r.pending)
			r.pending = r.pending[n:]
			r.delivered = true
			r.mu.Unlock()
			return n, nil
		case r.err != nil:
			err := r.err
			r.mu.Unlock()
			return 0, err
		case len(p) == 0:
			r.mu.Unlock()
			return 0, nil
		}
		if r.filling == nil {
			r.filling = make(chan struct{})
			go r.fill(r.filling)
		}
		wait := r.filling
		r.mu.Unlock()
		select {
		case <-wait:
		case <-a.over:
		}
	}
}
