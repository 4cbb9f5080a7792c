package gvisor

import "github.com/moat-sandbox/moat/internal/reexec"

// Hidden helpers of the moat binary, listed in internal/cli/hidden.go.
const (
	InitHelper  = reexec.Prefix + "gvisor-init"  // InitMain: owns the namespaces, runs runsc
	PauseHelper = reexec.Prefix + "gvisor-pause" // PauseMain: the container's init in the sentry
	StageHelper = reexec.Prefix + "gvisor-stage" // StageMain: installs moat's filter, then execs
)
