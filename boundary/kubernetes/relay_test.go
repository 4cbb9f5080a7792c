package kubernetes

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"

	"github.com/moat-sandbox/moat/boundary"
)

// loadTaskErr is what the exec API answered in CI when containerd's
// CRI could not load the container's task in time.
var loadTaskErr = errors.New("Internal error occurred: error executing command in container: failed to exec in container: failed to load task: context deadline exceeded")

// flakyExec is an exec whose attempts are scripted: attempt i runs
// script[i] (the last one for every attempt after), which reads the
// stage's frame and does what the test says with the rest.
type flakyExec struct {
	frame  []byte
	script []func(stdin io.Reader, stdout io.Writer) error

	mu       sync.Mutex
	attempts int
}

func (f *flakyExec) Stream(o remotecommand.StreamOptions) error {
	return f.StreamWithContext(context.Background(), o)
}

func (f *flakyExec) StreamWithContext(_ context.Context, o remotecommand.StreamOptions) error {
	f.mu.Lock()
	i := f.attempts
	f.attempts++
	f.mu.Unlock()
	if o.Stdin == nil {
		return errors.New("no stdin")
	}
	got := make([]byte, len(f.frame))
	if _, err := io.ReadFull(o.Stdin, got); err != nil || !bytes.Equal(got, f.frame) {
		return fmt.Errorf("attempt %d: the frame is not at the head of stdin (%q, %v)", i+1, got, err)
	}
	return f.script[min(i, len(f.script)-1)](o.Stdin, o.Stdout)
}

func (f *flakyExec) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.attempts
}

func fastBackoff(t *testing.T) {
	old := execBackoff
	execBackoff = time.Millisecond
	t.Cleanup(func() { execBackoff = old })
}

func failWith(err error) func(io.Reader, io.Writer) error {
	return func(io.Reader, io.Writer) error { return err }
}

func echo(stdin io.Reader, stdout io.Writer) error {
	_, err := io.Copy(stdout, stdin)
	return err
}

func TestNotStarted(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{loadTaskErr, true},
		{errors.New(`Internal error occurred: error executing command in container: failed to exec in container: failed to create exec "abc": ttrpc: closed`), true},
		{errors.New("Internal error occurred: error executing command in container: failed to exec in container: failed to start exec \"abc\": OCI runtime exec failed"), false},
		{errors.New("error dialing backend: EOF"), false},
		{utilexec.CodeExitError{Err: loadTaskErr, Code: 1}, false},
		{nil, false},
	} {
		if got := notStarted(c.err); got != c.want {
			t.Errorf("notStarted(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// An exec that the runtime refused before starting anything is made
// again, with the frame and the caller's whole stdin, what the failed
// attempts read of it included; one that may have run (any other error)
// is not, nor one that was given more than the relay keeps.
func TestStreamRetriesOnlyWhatStartedNothing(t *testing.T) {
	fastBackoff(t)
	frame := []byte("\x00\x00\x00\x05frame")
	s := &sandbox{gone: make(chan struct{})}
	run := func(stdin string, script ...func(io.Reader, io.Writer) error) (*flakyExec, string, error) {
		f := &flakyExec{frame: frame, script: script}
		var out bytes.Buffer
		err := s.stream(context.Background(), f, remotecommand.StreamOptions{Stdout: &out}, frame, newStdinRelay(strings.NewReader(stdin)), nil)
		return f, out.String(), err
	}
	// readAllThen reads the whole stdin (as client-go's copy does before
	// the runtime answers) and then fails with err.
	readAllThen := func(err error) func(io.Reader, io.Writer) error {
		return func(stdin io.Reader, _ io.Writer) error {
			io.Copy(io.Discard, stdin)
			return err
		}
	}

	f, out, err := run("the caller's input", failWith(loadTaskErr), readAllThen(loadTaskErr), echo)
	if err != nil || out != "the caller's input" || f.count() != 3 {
		t.Errorf("two refusals that started nothing (one after reading all stdin), then a start: %d attempts, %q, %v", f.count(), out, err)
	}

	// Control: the same script with an error after which the exec may
	// have run is made once.
	started := errors.New("Internal error occurred: error executing command in container: failed to exec in container: failed to start exec \"x\": context deadline exceeded")
	if f, _, err := run("input", failWith(started), echo); f.count() != 1 || err == nil || !strings.Contains(err.Error(), "failed to start exec") {
		t.Errorf("an exec that may have started: %d attempts, %v", f.count(), err)
	}
	// An exit code is the process's own: not retried, not annotated.
	if f, _, err := run("input", failWith(utilexec.CodeExitError{Err: loadTaskErr, Code: 3}), echo); f.count() != 1 || exitCode(err) != 3 {
		t.Errorf("an exit code: %d attempts, %v", f.count(), err)
	}

	// An attempt given more than the relay keeps is not made again.
	big := strings.Repeat("x", maxReplayBytes+1)
	if f, _, err := run(big, readAllThen(loadTaskErr), echo); f.count() != 1 || !errors.Is(err, loadTaskErr) {
		t.Errorf("an attempt given %d bytes: %d attempts, %v", len(big), f.count(), err)
	}
	// Control: as much as the relay keeps is replayed whole.
	fits := strings.Repeat("y", maxReplayBytes)
	if f, out, err := run(fits, readAllThen(loadTaskErr), echo); f.count() != 2 || err != nil || out != fits {
		t.Errorf("an attempt given %d bytes: %d attempts, %d bytes out, %v", len(fits), f.count(), len(out), err)
	}

	// Attempts are bounded in time, and the error says how many were
	// made: with a 1 ms backoff doubling to at most 8 ms, the waits
	// (never shorter than asked) of 1+2+4+8·23 ms fit in 200 ms, so at
	// most 27 attempts are made, and at least two.
	defer func(d, m time.Duration) { execRetryFor, maxExecBackoff = d, m }(execRetryFor, maxExecBackoff)
	execRetryFor, maxExecBackoff = 200*time.Millisecond, 8*time.Millisecond
	f, _, err = run("input", failWith(loadTaskErr))
	if n := f.count(); n < 2 || n > 27 || !errors.Is(err, loadTaskErr) || !strings.Contains(err.Error(), fmt.Sprintf("made %d times in ", n)) {
		t.Errorf("a runtime that never starts it: %d attempts, %v", n, err)
	}

	// Without a frame and with a stdin (a terminal), once only.
	f = &flakyExec{script: []func(io.Reader, io.Writer) error{failWith(loadTaskErr)}}
	if err := s.stream(context.Background(), f, remotecommand.StreamOptions{Stdin: strings.NewReader("keys")}, nil, nil, nil); f.count() != 1 || err == nil {
		t.Errorf("a terminal's exec: %d attempts, %v", f.count(), err)
	}
	// Without any stdin (a signal's exec), retried.
	f = &flakyExec{script: []func(io.Reader, io.Writer) error{failWith(loadTaskErr), failWith(nil)}}
	noStdin := func(_ context.Context, o remotecommand.StreamOptions) error {
		o.Stdin = strings.NewReader("")
		return f.StreamWithContext(context.Background(), o)
	}
	if err := s.stream(context.Background(), execFunc(noStdin), remotecommand.StreamOptions{}, nil, nil, nil); f.count() != 2 || err != nil {
		t.Errorf("an exec without stdin: %d attempts, %v", f.count(), err)
	}
}

type execFunc func(context.Context, remotecommand.StreamOptions) error

func (e execFunc) Stream(o remotecommand.StreamOptions) error { return e(context.Background(), o) }
func (e execFunc) StreamWithContext(ctx context.Context, o remotecommand.StreamOptions) error {
	return e(ctx, o)
}

// asyncExec copies stdin as client-go does: in a goroutine that starts
// with the stream and outlives it. The first attempt fails as the
// runtime did under load while its copy is still reading; the second
// returns what its copy read once stdin ends.
type asyncExec struct {
	frameLen int
	mu       sync.Mutex
	attempts int
	failed   chan struct{} // closed when the first attempt has failed
	got      chan string
}

func (e *asyncExec) Stream(o remotecommand.StreamOptions) error {
	return e.StreamWithContext(context.Background(), o)
}

func (e *asyncExec) StreamWithContext(_ context.Context, o remotecommand.StreamOptions) error {
	e.mu.Lock()
	e.attempts++
	first := e.attempts == 1
	e.mu.Unlock()
	read := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(o.Stdin) // errAttemptOver ends the first
		read <- string(b)
	}()
	if first {
		close(e.failed)
		return loadTaskErr
	}
	all := <-read
	e.got <- all[e.frameLen:]
	return nil
}

// What the caller writes before and after a failed attempt reaches the
// next attempt whole and once, although the failed attempt's stdin copy
// was still reading when it failed.
func TestStreamReplaysStdinAcrossAttempts(t *testing.T) {
	fastBackoff(t)
	frame := []byte("\x00\x00\x00\x05frame")
	pr, pw := io.Pipe()
	e := &asyncExec{frameLen: len(frame), failed: make(chan struct{}), got: make(chan string, 1)}
	s := &sandbox{gone: make(chan struct{})}
	done := make(chan error, 1)
	go func() {
		done <- s.stream(context.Background(), e, remotecommand.StreamOptions{}, frame, newStdinRelay(pr), nil)
	}()
	pw.Write([]byte("before, ")) // read by the first attempt's copy
	<-e.failed
	pw.Write([]byte("after"))
	pw.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := <-e.got; got != "before, after" {
		t.Errorf("the second attempt's stdin after the frame: %q", got)
	}
	if e.attempts != 2 {
		t.Errorf("%d attempts", e.attempts)
	}
}

// A backoff ends at once, with no further attempt, when the context
// ends, the Pod goes or the process is signalled (stop).
func TestStreamBackoffEnds(t *testing.T) {
	old := execBackoff
	execBackoff = time.Hour
	t.Cleanup(func() { execBackoff = old })
	for _, c := range []string{"context", "pod gone", "signal"} {
		t.Run(c, func(t *testing.T) {
			s := &sandbox{gone: make(chan struct{})}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			stop := make(chan struct{})
			attempts := 0
			failed := make(chan struct{})
			exe := execFunc(func(context.Context, remotecommand.StreamOptions) error {
				if attempts++; attempts == 1 {
					close(failed)
				}
				return loadTaskErr
			})
			done := make(chan error, 1)
			go func() { done <- s.stream(ctx, exe, remotecommand.StreamOptions{}, nil, nil, stop) }()
			<-failed
			switch c {
			case "context":
				cancel()
			case "pod gone":
				close(s.gone)
			case "signal":
				close(stop)
			}
			select {
			case err := <-done:
				if !errors.Is(err, loadTaskErr) || attempts != 1 {
					t.Errorf("%d attempts, %v", attempts, err)
				}
			case <-time.After(time.Minute):
				t.Fatal("the backoff did not end")
			}
		})
	}
}

// A process signalled while its exec waits for another attempt is
// never started: Wait says refused, and the exec is not made again.
func TestSignalDuringBackoffStopsTheStart(t *testing.T) {
	old := execBackoff
	execBackoff = time.Hour
	t.Cleanup(func() { execBackoff = old })
	var mu sync.Mutex
	attempts := 0
	failed := make(chan struct{})
	// No API client: the watch counts as stopped, so that the failed
	// stream asks no API whether the Pod ended (checkEnded).
	s := &sandbox{gone: make(chan struct{}), stopWatch: make(chan struct{})}
	close(s.stopWatch)
	s.newExecutor = func(o *corev1.PodExecOptions) (remotecommand.Executor, error) {
		if o.Command[1] == SignalHelper {
			// No pid file yet: the signal helper fails.
			return execFunc(func(context.Context, remotecommand.StreamOptions) error {
				return utilexec.CodeExitError{Err: errors.New("no such process"), Code: 1}
			}), nil
		}
		return execFunc(func(_ context.Context, o remotecommand.StreamOptions) error {
			io.Copy(io.Discard, o.Stdin)
			mu.Lock()
			defer mu.Unlock()
			if attempts++; attempts == 1 {
				close(failed)
				return loadTaskErr
			}
			return nil
		}), nil
	}
	p, err := s.Start(context.Background(), boundary.Process{Argv: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	<-failed
	p.Signal(syscall.SIGTERM)
	waited := make(chan struct{})
	var code int
	go func() {
		code, err = p.Wait()
		close(waited)
	}()
	select {
	case <-waited:
	case <-time.After(time.Minute):
		t.Fatal("the exec still waits for another attempt after the signal")
	}
	mu.Lock()
	defer mu.Unlock()
	if attempts != 1 || code != boundary.ExitRefused || !errors.Is(err, loadTaskErr) {
		t.Errorf("signalled in the backoff: %d attempts, code %d, %v", attempts, code, err)
	}
}

// A read that an abandoned attempt left pending on the caller's stdin
// takes nothing from the next attempt: what the caller writes after the
// first attempt failed reaches the second whole.
func TestStdinRelayLosesNothingToAnAbandonedAttempt(t *testing.T) {
	pr, pw := io.Pipe()
	r := newStdinRelay(pr)
	first := r.attempt()
	stale := make(chan error, 1)
	go func() {
		_, err := first.Read(make([]byte, 64)) // blocks: nothing written yet
		stale <- err
	}()
	// The first attempt's read is under way (the relay is reading the
	// pipe) before the attempt is ended.
	for {
		r.mu.Lock()
		filling := r.filling != nil
		r.mu.Unlock()
		if filling {
			break
		}
		time.Sleep(time.Millisecond)
	}
	first.end()
	if err := <-stale; !errors.Is(err, errAttemptOver) {
		t.Fatalf("the abandoned attempt's read: %v, want errAttemptOver", err)
	}
	go func() {
		pw.Write([]byte("every byte"))
		pw.Close()
	}()
	got, err := io.ReadAll(r.attempt())
	if err != nil || string(got) != "every byte" {
		t.Fatalf("second attempt read %q, %v", got, err)
	}
	if n, err := first.Read(make([]byte, 8)); n != 0 || !errors.Is(err, errAttemptOver) {
		t.Errorf("a read on the ended attempt: %d, %v", n, err)
	}
}

// A stdin that keeps giving nothing without an error ends in
// io.ErrNoProgress instead of a spin.
func TestStdinRelayNoProgress(t *testing.T) {
	_, err := io.ReadAll(newStdinRelay(emptyReader{}).attempt())
	if !errors.Is(err, io.ErrNoProgress) {
		t.Errorf("got %v, want io.ErrNoProgress", err)
	}
}

type emptyReader struct{}

func (emptyReader) Read([]byte) (int, error) { return 0, nil }

// A backoff whose timer is ready together with an end says no further
// attempt, every time (select alone would pick either).
func TestBackoffEndWinsOverTimer(t *testing.T) {
	ended := make(chan struct{})
	close(ended)
	s := &sandbox{gone: make(chan struct{})}
	for range 200 {
		if s.backoff(context.Background(), ended, 0) {
			t.Fatal("backoff allowed another attempt after stop closed")
		}
	}
	// Control: without an end, the same backoff allows one.
	if !s.backoff(context.Background(), nil, 0) {
		t.Fatal("backoff refused another attempt with nothing ended")
	}
}
