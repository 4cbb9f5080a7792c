//go:build !linux

package evidence

import "context"

// FaultsResult is what RunFaults wrote.
type FaultsResult struct {
	Report         *FaultsReport
	ManifestSHA256 string
	SuitePublicKey []byte
}

// RunFaults refuses: the faults suite observes processes through /proc
// (Linux only). Its bundles verify on any system.
func RunFaults(ctx context.Context, o Options) (*FaultsResult, error) {
	return nil, harnessf("the faults suite runs on Linux only (it observes the sandbox's processes through /proc); moat evidence verify checks its bundles anywhere")
}
