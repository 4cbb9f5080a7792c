//go:build !linux

package conformance

import (
	"context"
	"errors"

	"github.com/moat-sandbox/moat/internal/reexec"
)

// The scenarios drive Linux backends; elsewhere there are none, and Run
// says so.
var scenarios []scenario

type harness struct{}

func newHarness(bin, backend string, _ *Kubernetes) (*harness, error) {
	return nil, errors.New("conformance: the scenarios need Linux")
}

func (h *harness) close() {}

var _ = context.Background

// ProbeMain is the in-sandbox probe; it needs Linux.
func ProbeMain([]string) int { return reexec.Unsupported(ProbeHelper) }

// ReceiverMain is the test host's receiver; it needs Linux.
func ReceiverMain([]string) int { return reexec.Unsupported(ReceiverHelper) }
