// Package reexec lets moat re-run its own binary as a hidden helper (the
// sandbox init, the in-sandbox stage that applies Landlock and seccomp, the
// measurement). Each helper has a name that starts with "__moat-" and an
// entry function exported by the package that owns it; the one list of them
// is internal/cli/hidden.go, and main dispatches to it before any CLI
// parsing happens. There is no registry filled from init functions: a test
// binary that re-runs itself lists the helpers it needs in its own TestMain
// (see reexectest).
package reexec

import (
	"fmt"
	"os"
	"strings"
)

// Prefix starts every helper name, so that no user command can collide.
const Prefix = "__moat-"

// ExitUsage is what Dispatch returns for a helper name it does not know, and
// what Unsupported returns.
const ExitUsage = 125

// Helper is one hidden entry point of the moat binary.
type Helper struct {
	Name string                  // starts with Prefix
	Main func(args []string) int // args without the name; returns the exit code
}

// Check reports a helper list that Dispatch cannot serve unambiguously: a
// name without Prefix, a nil Main, or a name listed twice.
func Check(helpers []Helper) error {
	seen := make(map[string]bool, len(helpers))
	for _, h := range helpers {
		switch {
		case !strings.HasPrefix(h.Name, Prefix) || len(h.Name) == len(Prefix):
			return fmt.Errorf("reexec helper name %q does not start with %q and a name", h.Name, Prefix)
		case h.Main == nil:
			return fmt.Errorf("reexec helper %q has no entry function", h.Name)
		case seen[h.Name]:
			return fmt.Errorf("reexec helper %q listed twice", h.Name)
		}
		seen[h.Name] = true
	}
	return nil
}

// Dispatch runs the helper named by args[0], if args[0] starts with Prefix.
// handled is false when args do not name a helper. A name with the prefix
// that is not in helpers exits ExitUsage, so that a hidden name never falls
// through to the CLI.
func Dispatch(args []string, helpers []Helper) (code int, handled bool) {
	if len(args) == 0 || !strings.HasPrefix(args[0], Prefix) {
		return 0, false
	}
	for _, h := range helpers {
		if h.Name == args[0] {
			return h.Main(args[1:]), true
		}
	}
	fmt.Fprintf(os.Stderr, "moat: unknown hidden helper %q\n", args[0])
	return ExitUsage, true
}

// Unsupported is the entry function of a Linux-only helper elsewhere: it
// says so on stderr and returns ExitUsage.
func Unsupported(name string) int {
	fmt.Fprintf(os.Stderr, "moat: %s: this helper needs Linux\n", name)
	return ExitUsage
}
