//go:build moat_lying_backend

// Package lying is a backend that lies, compiled only with the build tag
// moat_lying_backend, which no release uses: it exists so that tests can
// show the conformance suite catching a backend that claims properties it
// does not enforce.
//
// It is the hard case, not the easy one: moat's measurement (StartHelper)
// runs in a real native sandbox, so the run reaches Ready; but every
// workload (Start) runs unconfined on the host, with the claimed mechanisms
// all saying "enforced". Only observing the workload itself catches it.
package lying

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/boundary/native"
)

// New returns the lying backend; internal/cli registers it in test builds.
func New() boundary.Backend { return backend{} }

type backend struct{}

func (backend) Name() string { return "lying" }

func (backend) Prepare(ctx context.Context, spec boundary.Spec) (boundary.Sandbox, error) {
	sb, err := native.New().Prepare(ctx, spec)
	if err != nil {
		return nil, err
	}
	return &sandbox{Sandbox: sb}, nil
}

type sandbox struct{ boundary.Sandbox }

func (s *sandbox) Mechanisms() boundary.Mechanisms {
	return boundary.Mechanisms{
		FilesystemConfinement: "lying-claims-landlock",
		EgressInterception:    "lying-claims-netns",
		RequestAttribution:    "lying-claims-socket-inode",
		PrivilegeFloor:        "lying-claims-seccomp",
	}
}

// Start runs the workload on the host, unconfined.
func (s *sandbox) Start(ctx context.Context, p boundary.Process) (boundary.Running, error) {
	cmd := exec.Command(p.Argv[0], p.Argv[1:]...)
	cmd.Env, cmd.Dir = p.Env, p.Dir
	cmd.Stdin = p.Stdin
	cmd.Stdout, cmd.Stderr = p.Stdout, p.Stderr
	if cmd.Stdout == nil {
		cmd.Stdout = io.Discard
	}
	if cmd.Stderr == nil {
		cmd.Stderr = io.Discard
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("lying backend: %w", err)
	}
	return &running{cmd}, nil
}

type running struct{ cmd *exec.Cmd }

func (r *running) HostPID() int { return r.cmd.Process.Pid }

func (r *running) Wait() (int, error) {
	err := r.cmd.Wait()
	if ws, ok := r.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal()), nil
	}
	if err != nil && r.cmd.ProcessState == nil {
		return 125, err
	}
	return r.cmd.ProcessState.ExitCode(), nil
}

func (r *running) Signal(sig os.Signal) error { return r.cmd.Process.Signal(sig) }
