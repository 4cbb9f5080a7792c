//go:build moat_test_hooks

package grants

import (
	"os"
	"time"
)

// With the moat_test_hooks tag, AfterPlan waits at
// $MOAT_TEST_AFTER_PLAN: it creates PATH.ready and returns once PATH.go
// exists (at most a minute).
func init() {
	AfterPlan = func() {
		p := os.Getenv("MOAT_TEST_AFTER_PLAN")
		if p == "" {
			return
		}
		os.WriteFile(p+".ready", nil, 0o644)
		for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if _, err := os.Stat(p + ".go"); err == nil {
				return
			}
		}
	}
}
