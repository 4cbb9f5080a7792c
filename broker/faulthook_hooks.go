//go:build moat_test_hooks

package broker

import (
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"syscall"
)

// FaultHooksBuilt is true: this test build obeys FaultStageEnv.
const FaultHooksBuilt = true

// CheckFaultHooks checks the hook's variables (an unknown stage, a stage
// without its marker file or a bad skip count is refused).
func CheckFaultHooks() error { return checkFaultStage() }

var (
	faultStage  = os.Getenv(FaultStageEnv)
	faultMarker = os.Getenv(FaultMarkerEnv)
	faultSkip   = func() int64 { n, _ := strconv.ParseInt(os.Getenv(FaultSkipEnv), 10, 64); return n }()
	faultPassed atomic.Int64
)

// faultPoint stops the broker's process at stage when FaultStageEnv names
// it, once FaultSkipEnv requests passed it: it writes the marker file
// ("STAGE PID"), stops its own process (SIGSTOP) and, should it be
// continued, never returns.
func faultPoint(stage string) {
	if faultStage == "" || stage != faultStage || checkFaultStage() != nil {
		return
	}
	if faultPassed.Add(1) <= faultSkip {
		return
	}
	pid := os.Getpid()
	tmp := faultMarker + ".tmp"
	if err := os.WriteFile(tmp, []byte(fmt.Sprintf("%s %d\n", stage, pid)), 0o644); err == nil {
		os.Rename(tmp, faultMarker)
	}
	syscall.Kill(pid, syscall.SIGSTOP)
	select {}
}
