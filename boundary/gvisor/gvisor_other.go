//go:build !linux

package gvisor

import (
	"context"
	"fmt"
	"runtime"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/internal/reexec"
)

// New returns the gvisor backend; internal/cli/hidden.go registers it.
func New() boundary.Backend { return backend{} }

type backend struct{}

func (backend) Name() string { return "gvisor" }

func (backend) Prepare(context.Context, boundary.Spec) (boundary.Sandbox, error) {
	return nil, fmt.Errorf("the %s backend needs Linux, not %s: %w", backend{}.Name(), runtime.GOOS, boundary.ErrUnsupported)
}

// InitMain is the sandbox init; it needs Linux.
func InitMain([]string) int { return reexec.Unsupported(InitHelper) }

// PauseMain is the container's init in the sentry; it needs Linux.
func PauseMain([]string) int { return reexec.Unsupported(PauseHelper) }

// StageMain is the in-sentry stage; it needs Linux.
func StageMain([]string) int { return reexec.Unsupported(StageHelper) }
