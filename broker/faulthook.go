package broker

import (
	"fmt"
	"os"
	"slices"
)

// The audit-stage fault hook (issue 14, the faults suite's interruption
// cases). A moat binary built with the moat_test_hooks tag stops its
// broker at one of three points of an inference request when
// FaultStageEnv names it: it writes FaultMarkerEnv's file (the stage and
// its pid), raises SIGSTOP on its own process and never goes on, so that
// the harness can SIGKILL it exactly there, without any timing. A binary
// built without the tag has no hook: CheckFaultHooks refuses to run when
// the variables are set (moat's Main exits 125), so that a test never
// believes it interrupted a binary that ignored it.
const (
	// FaultStageEnv names the stage: one of FaultStages.
	FaultStageEnv = "MOAT_FAULT_STAGE"
	// FaultMarkerEnv is the file written when the broker stops.
	FaultMarkerEnv = "MOAT_FAULT_MARKER"
	// FaultSkipEnv is how many requests pass the stage before the one
	// that stops (a decimal count, default 0): the earlier ones are the
	// case's control.
	FaultSkipEnv = "MOAT_FAULT_SKIP"
)

// The stages of one inference request where the hook can stop the broker.
const (
	// FaultPreDurable: the request is reserved in the budget, its
	// pre-effect record (inference.requested) not yet written.
	FaultPreDurable = "pre-durable"
	// FaultPreSend: the pre-effect record is durable, the request not yet
	// sent to the provider.
	FaultPreSend = "pre-send"
	// FaultPreComplete: the provider answered (a non-streamed response,
	// read and scanned), the budget is not settled and the completion
	// record not written.
	FaultPreComplete = "pre-complete"
)

// FaultStages lists the stages in the order a request passes them.
var FaultStages = []string{FaultPreDurable, FaultPreSend, FaultPreComplete}

// faultEnvSet reports which of the hook's variables are set.
func faultEnvSet() []string {
	var set []string
	for _, n := range []string{FaultStageEnv, FaultMarkerEnv, FaultSkipEnv} {
		if _, ok := os.LookupEnv(n); ok {
			set = append(set, n)
		}
	}
	return set
}

// checkFaultStage checks the hook's variables as a hooks build reads them.
func checkFaultStage() error {
	st := os.Getenv(FaultStageEnv)
	if st == "" {
		return nil
	}
	if !slices.Contains(FaultStages, st) {
		return fmt.Errorf("refused: %s=%q is not a stage (%v)", FaultStageEnv, st, FaultStages)
	}
	if os.Getenv(FaultMarkerEnv) == "" {
		return fmt.Errorf("refused: %s is set without %s (the file the harness waits for)", FaultStageEnv, FaultMarkerEnv)
	}
	if s := os.Getenv(FaultSkipEnv); s != "" {
		var n int
		if _, err := fmt.Sscanf(s, "%d", &n); err != nil || n < 0 || fmt.Sprint(n) != s {
			return fmt.Errorf("refused: %s=%q: want a count of requests", FaultSkipEnv, s)
		}
	}
	return nil
}
