//go:build moat_test_hooks

package sandbox

import (
	"net/netip"
	"os"
)

// TestGlobalAddrEnv names the one address the SSRF guard of a
// moat_test_hooks binary treats as global (the address of a test's own
// server); the policy and the CLI have no such setting.
const TestGlobalAddrEnv = "MOAT_TEST_GLOBAL_ADDR"

func init() {
	if a, err := netip.ParseAddr(os.Getenv(TestGlobalAddrEnv)); err == nil {
		testGlobalAddr = a
	}
}
