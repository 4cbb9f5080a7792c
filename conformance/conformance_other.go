//go:build !linux

package conformance

import (
	"context"
	"errors"
)

// The scenarios drive Linux backends; elsewhere there are none, and Run
// says so.
var scenarios []scenario

type harness struct{}

func newHarness(bin, backend string) (*harness, error) {
	return nil, errors.New("conformance: the scenarios need Linux")
}

func (h *harness) close() {}

var _ = context.Background
