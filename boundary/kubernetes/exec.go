package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/go-json-experiment/json"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"

	"github.com/moat-sandbox/moat/boundary"
)

// stageConfig is what the stage inside the Pod is given, as its one
// argument: the Kubernetes exec API carries a command and nothing else,
// so the environment and working directory travel here.
type stageConfig struct {
	ID   string   `json:"id"`
	Argv []string `json:"argv"`
	Env  []string `json:"env"`
	Dir  string   `json:"dir"`
}

// maxStageConfigBytes bounds the stage's argument (one argv element).
const maxStageConfigBytes = 96 << 10

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
	b, err := json.Marshal(stageConfig{ID: id, Argv: argv, Env: env, Dir: dir})
	if err != nil {
		return nil, err
	}
	if len(b) > maxStageConfigBytes {
		return nil, &boundary.StartError{Code: boundary.ExitRefused, Msg: fmt.Sprintf("command and environment take %d bytes, at most %d on the kubernetes backend", len(b), maxStageConfigBytes)}
	}
	opts := remotecommand.StreamOptions{Stdin: p.Stdin, Stdout: p.Stdout, Stderr: p.Stderr}
	var tty *os.File // a duplicate: the caller closes p.TTY once Start returns
	if p.TTY != nil {
		if err := makeRaw(p.TTY); err != nil {
			return nil, fmt.Errorf("terminal: %w", err)
		}
		if tty, err = dupFile(p.TTY, "tty"); err != nil {
			return nil, fmt.Errorf("terminal: %w", err)
		}
		opts = remotecommand.StreamOptions{Stdin: tty, Stdout: tty, Tty: true, TerminalSizeQueue: newSizeQueue(tty)}
	}
	exe, err := s.executor([]string{MoatInImage, StageHelper, string(b)}, opts.Stdin != nil, opts.Stdout != nil, opts.Stderr != nil, opts.Tty)
	if err != nil {
		if tty != nil {
			tty.Close()
		}
		return nil, err
	}
	sctx, cancel := context.WithCancel(context.Background())
	pr := &proc{s: s, id: id, done: make(chan struct{}), cancel: cancel}
	go func() {
		defer close(pr.done)
		defer cancel()
		err := exe.StreamWithContext(sctx, opts)
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

// executor makes the exec request for command in the Pod's container.
func (s *sandbox) executor(command []string, stdin, stdout, stderr, tty bool) (remotecommand.Executor, error) {
	if s.cfg == nil {
		return nil, errors.New("kubernetes: no client configuration for exec")
	}
	u := s.cs.ExecURL(s.ns, s.name, &corev1.PodExecOptions{Container: containerName, Command: command, Stdin: stdin, Stdout: stdout, Stderr: stderr && !tty, TTY: tty})
	return remotecommand.NewSPDYExecutor(s.cfg, "POST", u)
}

// proc is one exec in the Pod.
type proc struct {
	s      *sandbox
	id     string
	done   chan struct{}
	code   int
	err    error
	cancel context.CancelFunc
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
	select {
	case <-p.done:
		return nil
	default:
	}
	exe, err := p.s.executor([]string{MoatInImage, SignalHelper, p.id, strconv.Itoa(int(n))}, false, false, true, false)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), signalTimeout)
		err = exe.StreamWithContext(ctx, remotecommand.StreamOptions{Stderr: io.Discard})
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
