//go:build !linux

package gvisor

import (
	"context"

	"github.com/moat-sandbox/moat/boundary"
)

func init() { boundary.Register(backend{}) }

type backend struct{}

func (backend) Name() string { return "gvisor" }

func (backend) Prepare(context.Context, boundary.Spec) (boundary.Sandbox, error) {
	return nil, boundary.ErrUnsupported
}
