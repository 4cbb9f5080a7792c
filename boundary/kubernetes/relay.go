package kubernetes

import (
	"errors"
	"io"
	"strings"
	"sync"
	"time"
)

// notStartedErrors are what the runtime answers when an exec failed
// before any process was made for it: containerd's CRI (execInternal)
// loads the container's task (a state call to the shim, under a 2 s
// timeout that a loaded node misses), then creates the exec, which only
// records its state, then starts it, and only then attaches its stdin.
// Such an exec can be made again, with the stdin the failed attempt was
// given (stdinRelay replays it). Nothing else is retried: an exec that
// may have run is never made twice.
var notStartedErrors = []string{
	"failed to exec in container: failed to load task:",
	"failed to exec in container: failed to create exec ",
}

// An exec is made again while less than execRetryFor has passed since
// its first attempt; execBackoff is the wait before the second attempt,
// doubling for each after it up to maxExecBackoff (variables for the
// tests). A loaded node's runtime stays slow for tens of seconds (CI's
// TestKubernetesScale still failed one create in 20 after five attempts
// in 14 s), and the measurement allows a minute.
var (
	execRetryFor   = 30 * time.Second
	execBackoff    = 250 * time.Millisecond
	maxExecBackoff = 2 * time.Second
)

// maxReplayBytes bounds what stdinRelay keeps of the caller's stdin to
// give a later attempt; an exec given more is not made again.
const maxReplayBytes = 1 << 20

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

// maxEmptyReads is how many reads of the caller's stdin in a row may
// return nothing and no error before the relay gives io.ErrNoProgress.
const maxEmptyReads = 100

// stdinRelay hands the caller's stdin to one exec attempt after
// another: it reads src only when the live attempt asks (client-go's
// stdin copy starts as soon as the streams exist, before the runtime
// answers, and outlives the attempt), keeps what it handed on, up to
// maxReplayBytes, and gives it again from the start to the next
// attempt; an ended attempt's pending read returns and takes nothing.
type stdinRelay struct {
	src io.Reader

	mu       sync.Mutex
	sent     []byte // what attempts were given, while not overflowed
	overflow bool   // more than maxReplayBytes were given: no replay
	pending  []byte // read from src, given to no attempt yet
	err      error  // src's error, once it gave one
	filling  chan struct{}
	empty    int // (0, nil) reads of src in a row
}

func newStdinRelay(src io.Reader) *stdinRelay { return &stdinRelay{src: src} }

// attempt is the stdin of one exec attempt; end it before the next
// attempt begins.
func (r *stdinRelay) attempt() *relayAttempt {
	return &relayAttempt{r: r, over: make(chan struct{})}
}

// replayable reports whether a next attempt can be given everything
// the earlier ones were.
func (r *stdinRelay) replayable() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return !r.overflow
}

func (r *stdinRelay) fill(done chan struct{}) {
	buf := make([]byte, 32<<10)
	n, err := r.src.Read(buf)
	r.mu.Lock()
	r.pending = append(r.pending, buf[:n]...)
	switch {
	case err != nil:
		r.err = err
	case n > 0:
		r.empty = 0
	default:
		if r.empty++; r.empty >= maxEmptyReads {
			r.err = io.ErrNoProgress
		}
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
	off  int  // how much of r.sent this attempt was given (under r.mu)
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
		case len(p) == 0:
			r.mu.Unlock()
			return 0, nil
		case !r.overflow && a.off < len(r.sent):
			n := copy(p, r.sent[a.off:])
			a.off += n
			r.mu.Unlock()
			return n, nil
		case len(r.pending) > 0:
			n := copy(p, r.pending)
			r.pending = r.pending[n:]
			if !r.overflow {
				if len(r.sent)+n > maxReplayBytes {
					r.overflow, r.sent = true, nil
				} else {
					r.sent = append(r.sent, p[:n]...)
					a.off = len(r.sent)
				}
			}
			r.mu.Unlock()
			return n, nil
		case r.err != nil:
			err := r.err
			r.mu.Unlock()
			return 0, err
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
