// Package testenv decides, for tests, whether a missing capability is a
// skip (on someone else's machine) or a failure (in CI, where
// MOAT_REQUIRE_ALL=1 is set and every capability must be present).
package testenv

import (
	"os"
	"testing"
)

// RequireAll reports whether MOAT_REQUIRE_ALL=1 is set.
func RequireAll() bool { return os.Getenv("MOAT_REQUIRE_ALL") == "1" }

// Need skips t with the reason when ok is false, or fails it when
// MOAT_REQUIRE_ALL=1. Use it for host capabilities (Landlock, user
// namespaces, runsc, openssl, root), never to hide a failing assertion.
func Need(t testing.TB, ok bool, why string) {
	t.Helper()
	if ok {
		return
	}
	if RequireAll() {
		t.Fatalf("required capability missing (MOAT_REQUIRE_ALL=1): %s", why)
	}
	t.Skipf("skipping: %s (set MOAT_REQUIRE_ALL=1 to make this a failure)", why)
}

// NeedRoot is Need(os.Geteuid() == 0, …). Tests that need root by nature
// are excluded by name from the unprivileged CI run, so there they never run.
func NeedRoot(t testing.TB) {
	t.Helper()
	Need(t, os.Geteuid() == 0, "needs root (uid 0)")
}
