package native

import "github.com/moat-sandbox/moat/internal/reexec"

// Hidden helpers of the moat binary, listed in internal/cli/hidden.go.
const (
	InitHelper  = reexec.Prefix + "native-init"  // InitMain: pid 1 of the sandbox
	StageHelper = reexec.Prefix + "native-stage" // StageMain: applies the policy, then execs the workload
)
