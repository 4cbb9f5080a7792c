package kubernetes

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"

	"github.com/moat-sandbox/moat/boundary"
)

// stageConfig is what the stage inside the Pod is given. The Kubernetes
// exec API carries a command and the streams and nothing else, and the
// command is written into the API server's request log, the kubelet's
// and the runtime's at high verbosity; so the environment (the
// per-sandbox broker key among it), working directory and the command
// itself travel as a frame at the head of the exec's stdin
// (writeStageFrame), never in its command: the command is moat's binary,
// the stage's name and, for a terminal, a stage id and a digest.
type stageConfig struct {
	ID   string   `json:"id"`
	Argv []string `json:"argv"`
	Env  []string `json:"env"`
	Dir  string   `json:"dir"`
	// Stdin is whether the workload has the stream after the frame as
	// its stdin; when false the stage gives it /dev/null.
	Stdin bool `json:"stdin"`
	// Nonce is random for a configuration saved for a terminal exec
	// (saveStageConfig), so that the digest in that exec's command tells
	// nothing about the environment.
	Nonce string `json:"nonce,omitempty"`
}

// maxStageConfigBytes bounds the stage's configuration (the frame's
// JSON).
const maxStageConfigBytes = 96 << 10

// configTimeout bounds the exec that saves a terminal exec's
// configuration in the Pod.
const configTimeout = 30 * time.Second

// signalTimeout bounds the exec that delivers a signal.
const signalTimeout = 15 * time.Second

func (s *sandbox) Start(ctx context.Context, p boundary.Process) (boundary.Running, error) {
	if len(p.Argv) == 0 {
		return nil, errors.New("empty command")
	}
	return s.start(ctx, p.Argv, p)
}

// StartHelper runs moat's own binary in the image behind the same stage
// (and so the same seccomp filter) as every workload process.
func (s *sandbox) StartHelper(ctx context.Context, args []string, p boundary.Process) (boundary.Running, error) {
	p.Dir = "/"
	return s.start(ctx, append([]string{MoatInImage}, args...), p)
}

func (s *sandbox) start(ctx context.Context, argv []string, p boundary.Process) (boundary.Running, error) {
	select {
	case <-s.gone:
		return nil, fmt.Errorf("the sandbox's Pod is gone: %s", s.EndReason())
	default:
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.nextID++
	id := "p" + strconv.Itoa(s.nextID)
	s.mu.Unlock()
	dir := p.Dir
	if dir == "" {
		dir = "/"
	}
	env := p.Env
	if env == nil {
		env = []string{}
	}
	cfg := stageConfig{ID: id, Argv: argv, Env: env, Dir: dir}
	opts := remotecommand.StreamOptions{Stdout: p.Stdout, Stderr: p.Stderr}
	var command []string
	var tty *os.File // a duplicate: the caller closes p.TTY once Start returns
	var frame []byte // the stage's frame, at the head of stdin (no terminal)
	var relay *stdinRelay
	if p.TTY == nil {
		// The frame, then the caller's stdin: the stage reads the frame
		// and no further, and the workload has the rest. Without the
		// caller's stdin the stream ends after the frame and the stage
		// gives the workload /dev/null.
		cfg.Stdin = p.Stdin != nil
		var err error
		if frame, err = encodeStageFrame(cfg); err != nil {
			return nil, err
		}
		if p.Stdin != nil {
			relay = newStdinRelay(p.Stdin)
		}
		command = []string{MoatInImage, StageHelper}
	} else {
		// A terminal's input passes the line discipline of the Pod's
		// terminal (echo, line editing, a bounded line) before any
		// process reads it, so the frame cannot go ahead of the user's
		// keys there: an exec of its own, without a terminal, saves it
		// in the Pod, and the terminal's exec names it by id and its
		// SHA-256 (random Nonce: the digest tells nothing of the
		// environment).
		var nonce [16]byte
		if _, err := rand.Read(nonce[:]); err != nil {
			return nil, err
		}
		cfg.Stdin, cfg.Nonce = true, hex.EncodeToString(nonce[:])
		saved, err := encodeStageFrame(cfg)
		if err != nil {
			return nil, err
		}
		if err := s.saveStageConfig(ctx, saved); err != nil {
			return nil, err
		}
		sum := sha256.Sum256(saved)
		command = []string{MoatInImage, StageHelper, stageLoad, id, hex.EncodeToString(sum[:])}
		if err := makeRaw(p.TTY); err != nil {
			return nil, fmt.Errorf("terminal: %w", err)
		}
		if tty, err = dupFile(p.TTY, "tty"); err != nil {
			return nil, fmt.Errorf("terminal: %w", err)
		}
		opts = remotecommand.StreamOptions{Stdin: tty, Stdout: tty, Tty: true, TerminalSizeQueue: newSizeQueue(tty)}
	}
	exe, err := s.executor(command, true, opts.Stdout != nil, opts.Stderr != nil, opts.Tty)
	if err != nil {
		if tty != nil {
			tty.Close()
		}
		return nil, err
	}
	sctx, cancel := context.WithCancel(context.Background())
	pr := &proc{s: s, id: id, done: make(chan struct{}), stop: make(chan struct{}), cancel: cancel}
	go func() {
		defer close(pr.done)
		defer cancel()
		err := s.stream(sctx, exe, opts, frame, relay, pr.stop)
		if code := exitCode(err); code < 0 || code >= 128 {
			// Killed, or the stream broke: if it is because the Pod
			// ended from outside, say so before Wait returns.
			s.checkEnded()
		}
		switch code := exitCode(err); {
		case code >= 0:
			pr.code = code
		default:
			pr.code, pr.err = boundary.ExitRefused, fmt.Errorf("kubernetes exec: %w", err)
			select {
			case <-s.gone:
				pr.err = fmt.Errorf("the sandbox's Pod is gone (%s): %w", s.EndReason(), err)
			default:
			}
		}
		if opts.Tty {
			if sq, ok := opts.TerminalSizeQueue.(*sizeQueue); ok {
				sq.stop()
			}
			tty.Close()
		}
	}()
	return pr, nil
}

// saveStageConfig has the stage in the Pod save frame (read from its
// stdin) for a terminal exec to load: that exec's stdin is the terminal.
func (s *sandbox) saveStageConfig(ctx context.Context, frame []byte) error {
	exe, err := s.executor([]string{MoatInImage, StageHelper, stageSave}, true, false, true, false)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, configTimeout)
	defer cancel()
	var stderr bytes.Buffer
	if err := s.stream(ctx, exe, remotecommand.StreamOptions{Stderr: &stderr}, frame, nil, nil); err != nil {
		if exitCode(err) < 0 {
			s.checkEnded()
		}
		msg := strings.TrimSpace(stderr.String())
		if len(msg) > 512 {
			msg = msg[:512] + "..."
		}
		return fmt.Errorf("kubernetes: saving the terminal exec's configuration in the Pod: %w (%s)", err, msg)
	}
	return nil
}

// stream runs exe's exec with opts, its stdin being frame followed by
// what relay hands on (when frame is not nil). An exec that the runtime
// refused before it started anything (notStarted) is made again, after
// a backoff, for up to execRetryFor, while relay can replay
// what it gave the failed one, ctx is live, the Pod is there and stop
// (closed by a signal to the process) is open: a loaded node's runtime
// misses its own timeouts on the way to starting an exec (CI's
// TestKubernetesScale, 20 sandboxes measured at once on two cores), and
// that is no refusal of the exec. A terminal's exec (stdin, no frame)
// is made once: its keys go from the terminal to the stream unrelayed.
func (s *sandbox) stream(ctx context.Context, exe remotecommand.Executor, opts remotecommand.StreamOptions, frame []byte, relay *stdinRelay, stop <-chan struct{}) error {
	retry := opts.Stdin == nil || frame != nil
	wait := execBackoff
	first := time.Now()
	var err error
	n := 0
	for {
		n++
		o := opts
		var a *relayAttempt
		if frame != nil {
			o.Stdin = bytes.NewReader(frame)
			if relay != nil {
				a = relay.attempt()
				o.Stdin = io.MultiReader(o.Stdin, a)
			}
		}
		err = exe.StreamWithContext(ctx, o)
		if a != nil {
			a.end()
		}
		if !retry || !notStarted(err) || time.Since(first)+wait > execRetryFor || (relay != nil && !relay.replayable()) || !s.backoff(ctx, stop, wait) {
			break
		}
		wait = min(2*wait, maxExecBackoff)
	}
	if n > 1 && notStarted(err) {
		err = fmt.Errorf("%w (the exec was made %d times in %s; the runtime started none of them)", err, n, time.Since(first).Round(time.Millisecond))
	}
	return err
}

// backoff waits d, and reports whether another attempt may follow: not
// if ctx ends, the Pod goes or stop closes first.
func (s *sandbox) backoff(ctx context.Context, stop <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-s.gone:
	case <-stop:
	case <-t.C:
		// The timer and an end may be ready together: the end wins.
		return ctx.Err() == nil && !closed(s.gone) && !closed(stop)
	}
	return false
}

// closed reports whether ch is closed (a nil ch never is).
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// executor makes the exec request for command in the Pod's container.
// Nothing secret may be in command: the API server's request log and
// the kubelet's and runtime's logs record it (the stage's configuration
// goes over stdin, see stageConfig).
func (s *sandbox) executor(command []string, stdin, stdout, stderr, tty bool) (remotecommand.Executor, error) {
	o := &corev1.PodExecOptions{Container: containerName, Command: command, Stdin: stdin, Stdout: stdout, Stderr: stderr && !tty, TTY: tty}
	if s.newExecutor != nil {
		return s.newExecutor(o)
	}
	if s.cfg == nil {
		return nil, errors.New("kubernetes: no client configuration for exec")
	}
	return remotecommand.NewSPDYExecutor(s.cfg, "POST", s.cs.ExecURL(s.ns, s.name, o))
}

// proc is one exec in the Pod.
type proc struct {
	s      *sandbox
	id     string
	done   chan struct{}
	code   int
	err    error
	cancel context.CancelFunc
	// stop closes at the first signal: an exec the runtime has not
	// started yet is then not made again (stream), so that a process
	// signalled while its exec waited for another attempt never starts.
	stop     chan struct{}
	stopOnce sync.Once
}

// HostPID is 0: the process runs in the Pod, not as a process of this
// host that moat can name.
func (p *proc) HostPID() int { return 0 }

func (p *proc) Wait() (int, error) {
	<-p.done
	return p.code, p.err
}

// Signal delivers sig to the process through a second exec (the API has
// no signal of its own); SIGKILL also drops the stream.
func (p *proc) Signal(sig os.Signal) error {
	n, ok := sig.(syscall.Signal)
	if !ok {
		return fmt.Errorf("unsupported signal %v", sig)
	}
	p.stopOnce.Do(func() { close(p.stop) })
	select {
	case <-p.done:
		return nil
	default:
	}
	exe, err := p.s.executor([]string{MoatInImage, SignalHelper, p.id, strconv.Itoa(int(n))}, false, false, true, false)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), signalTimeout)
		err = p.s.stream(ctx, exe, remotecommand.StreamOptions{Stderr: io.Discard}, nil, nil, nil)
		cancel()
	}
	if n == syscall.SIGKILL {
		// Whatever became of the signal, moat stops waiting for the
		// stream: Terminate's Pod deletion ends the process for sure.
		select {
		case <-p.done:
		case <-time.After(signalTimeout):
			p.cancel()
		}
	}
	return err
}

// exitCode is the remote command's exit code from a stream's error: 0
// for nil, the code of an exit error, -1 when the stream itself failed.
func exitCode(err error) int {
	var ce utilexec.CodeExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ce):
		return ce.ExitStatus()
	}
	return -1
}
