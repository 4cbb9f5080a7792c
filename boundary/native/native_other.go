//go:build !linux

package native

import (
	"context"
	"fmt"
	"runtime"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/internal/reexec"
)

type backend struct{}

func (backend) Name() string { return Name }

// Prepare always fails: the native backend needs Linux.
func (backend) Prepare(context.Context, boundary.Spec) (boundary.Sandbox, error) {
	return nil, fmt.Errorf("the %s backend needs Linux, not %s: %w", backend{}.Name(), runtime.GOOS, boundary.ErrUnsupported)
}

// LandlockABI is 0 off Linux.
func LandlockABI() int { return 0 }

// New returns the native backend; internal/cli/hidden.go registers it.
func New() boundary.Backend { return backend{} }

// InitMain is the sandbox init; it needs Linux.
func InitMain([]string) int { return reexec.Unsupported(InitHelper) }

// StageMain is the in-sandbox stage; it needs Linux.
func StageMain([]string) int { return reexec.Unsupported(StageHelper) }
