// Package e2e holds moat's end-to-end tests. They run the moat binary named
// by $MOAT_BIN (and the test builds $MOAT_LYING_BIN, tagged
// moat_lying_backend, and $MOAT_HOOKS_BIN, tagged moat_test_hooks), as
// scripts/test builds them, or build it themselves when unset; moat hands
// the kubernetes tests' commands to the moat-kubernetes beside it; the test
// binary doubles as the workload inside the sandboxes. They talk to a fake
// provider (internal/fakeprovider) on 127.0.0.1 only.
package e2e
