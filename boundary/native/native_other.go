//go:build !linux

package native

import (
	"context"

	"github.com/moat-sandbox/moat/boundary"
)

type backend struct{}

func (backend) Name() string { return Name }

// Prepare always fails: the native backend needs Linux.
func (backend) Prepare(context.Context, boundary.Spec) (boundary.Sandbox, error) {
	return nil, boundary.ErrUnsupported
}

// LandlockABI is 0 off Linux.
func LandlockABI() int { return 0 }

func init() { boundary.Register(backend{}) }
