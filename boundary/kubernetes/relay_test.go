package kubernetes

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"
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
// again, with the frame and the caller's whole stdin; one that may have
// run (any other error) is not, nor one that was given a byte of the
// caller's stdin.
func TestStreamRetriesOnlyWhatStartedNothing(t *testing.T) {
	fastBackoff(t)
	frame := []byte("\x00\x00\x00\x05frame")
	s := &sandbox{gone: make(chan struct{})}
	run := func(script ...func(io.Reader, io.Writer) error) (*flakyExec, string, error) {
		f := &flakyExec{frame: frame, script: script}
		var out bytes.Buffer
		err := s.stream(context.Background(), f, remotecommand.StreamOptions{Stdout: &out}, frame, newStdinRelay(strings.NewReader("the caller's input")))
		return f, out.String(), err
	}

	f, out, err := run(failWith(loadTaskErr), failWith(loadTaskErr), echo)
	if err != nil || out != "the caller's input" || f.count() != 3 {
		t.Errorf("two refusals that started nothing, then a start: %d attempts, %q, %v", f.count(), out, err)
	}

	// Control: the same script with an error after which the exec may
	// have run is made once.
	started := errors.New("Internal error occurred: error executing command in container: failed to exec in container: failed to start exec \"x\": context deadline exceeded")
	if f, _, err := run(failWith(started), echo); f.count() != 1 || err == nil || !strings.Contains(err.Error(), "failed to start exec") {
		t.Errorf("an exec that may have started: %d attempts, %v", f.count(), err)
	}

	// An attempt that took a byte of the caller's stdin is not remade:
	// the byte is gone.
	took := func(stdin io.Reader, _ io.Writer) error {
		if _, err := stdin.Read(make([]byte, 1)); err != nil {
			return err
		}
		return loadTaskErr
	}
	if f, _, err := run(took, echo); f.count() != 1 || !errors.Is(err, loadTaskErr) {
		t.Errorf("an attempt that read the caller's stdin: %d attempts, %v", f.count(), err)
	}

	// Attempts are bounded, and the error says how many were made.
	f, _, err = run(failWith(loadTaskErr))
	if f.count() != execAttempts || !errors.Is(err, loadTaskErr) || !strings.Contains(err.Error(), fmt.Sprintf("attempt %d", execAttempts)) {
		t.Errorf("a runtime that never starts it: %d attempts, %v", f.count(), err)
	}

	// Without a frame and with a stdin (a terminal), once only.
	f = &flakyExec{script: []func(io.Reader, io.Writer) error{failWith(loadTaskErr)}}
	if err := s.stream(context.Background(), f, remotecommand.StreamOptions{Stdin: strings.NewReader("keys")}, nil, nil); f.count() != 1 || err == nil {
		t.Errorf("a terminal's exec: %d attempts, %v", f.count(), err)
	}
	// Without any stdin (a signal's exec), retried.
	f = &flakyExec{script: []func(io.Reader, io.Writer) error{failWith(loadTaskErr), failWith(nil)}}
	noStdin := func(o remotecommand.StreamOptions) error {
		o.Stdin = strings.NewReader("")
		return f.StreamWithContext(context.Background(), o)
	}
	if err := s.stream(context.Background(), execFunc(noStdin), remotecommand.StreamOptions{}, nil, nil); f.count() != 2 || err != nil {
		t.Errorf("an exec without stdin: %d attempts, %v", f.count(), err)
	}
}

type execFunc func(remotecommand.StreamOptions) error

func (e execFunc) Stream(o remotecommand.StreamOptions) error { return e(o) }
func (e execFunc) StreamWithContext(_ context.Context, o remotecommand.StreamOptions) error {
	return e(o)
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
	if r.gaveAny() {
		t.Fatal("the relay says it gave a byte that nobody read")
	}
	go func() {
		pw.Write([]byte("every byte"))
		pw.Close()
	}()
	got, err := io.ReadAll(r.attempt())
	if err != nil || string(got) != "every byte" {
		t.Fatalf("second attempt read %q, %v", got, err)
	}
	if !r.gaveAny() {
		t.Error("the relay does not say it gave bytes")
	}
	if n, err := first.Read(make([]byte, 8)); n != 0 || !errors.Is(err, errAttemptOver) {
		t.Errorf("a read on the ended attempt: %d, %v", n, err)
	}
}
