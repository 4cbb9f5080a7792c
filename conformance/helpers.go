package conformance

import "github.com/moat-sandbox/moat/internal/reexec"

// Hidden helpers of the moat binary that the suite runs, listed in
// internal/cli/hidden.go.
const (
	ProbeHelper    = reexec.Prefix + "conf-probe"    // ProbeMain: in the sandbox, attempt actions, print one line each
	ReceiverHelper = reexec.Prefix + "conf-receiver" // ReceiverMain: in the test host's netns, log what arrives
)
