package sandbox

import (
	"context"
	"os"
	"time"
)

// stateDirPoll is how often a supervisor checks that its state directory
// and control socket are still the ones it made.
const stateDirPoll = time.Second

// watchStateDir returns a channel closed once dir or the control socket
// sock is removed or replaced (another file at the name). Without them no
// `moat sandbox` command can find or reach the supervisor, delete
// included: a supervisor left so would run its sandbox unseen, so it ends
// it instead (SupervisorMain). Nothing to watch (either missing at the
// call): closed at once.
func watchStateDir(ctx context.Context, dir, sock string, every time.Duration) <-chan struct{} {
	gone := make(chan struct{})
	d0, derr := os.Lstat(dir)
	s0, serr := os.Lstat(sock)
	if derr != nil || serr != nil {
		close(gone)
		return gone
	}
	same := func(p string, was os.FileInfo) bool {
		fi, err := os.Lstat(p)
		return err == nil && os.SameFile(fi, was)
	}
	return pollUntil(ctx, every, func() bool { return !same(dir, d0) || !same(sock, s0) })
}

// pollUntil returns a channel closed once cond, asked every interval,
// holds; never closed if ctx ends first.
func pollUntil(ctx context.Context, every time.Duration, cond func() bool) <-chan struct{} {
	gone := make(chan struct{})
	go func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if cond() {
					close(gone)
					return
				}
			}
		}
	}()
	return gone
}
