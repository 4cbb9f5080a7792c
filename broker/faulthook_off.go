//go:build !moat_test_hooks

package broker

import (
	"fmt"
	"strings"
)

// FaultHooksBuilt is false: this binary has no audit-stage fault hook.
const FaultHooksBuilt = false

// CheckFaultHooks refuses when any of the hook's variables is set: this
// build has no hook, and ignoring them would let a test believe it
// interrupted moat at a stage it never stopped at.
func CheckFaultHooks() error {
	if set := faultEnvSet(); len(set) > 0 {
		return fmt.Errorf("refused: %s set, but this moat binary was built without the moat_test_hooks tag and has no audit-stage fault hook (a test-only build: go build -tags moat_test_hooks ./cmd/moat); unset it", strings.Join(set, ", "))
	}
	return nil
}

// faultPoint does nothing in this build.
func faultPoint(string) {}
