// Package reexec lets moat re-run its own binary as a hidden helper (the
// sandbox init, the in-sandbox stage that applies Landlock and seccomp, the
// measurement). Helpers register under a name that starts with "__moat-";
// main dispatches to them before any CLI parsing happens.
package reexec

import (
	"strings"
	"sync"
)

var (
	mu       sync.Mutex
	handlers = map[string]func(args []string) int{}
)

// Prefix starts every helper name, so that no user command can collide.
const Prefix = "__moat-"

// Register adds a helper. name must start with Prefix.
func Register(name string, fn func(args []string) int) {
	if !strings.HasPrefix(name, Prefix) {
		panic("BUG: reexec helper name without prefix: " + name)
	}
	mu.Lock()
	defer mu.Unlock()
	if _, dup := handlers[name]; dup {
		panic("BUG: reexec helper registered twice: " + name)
	}
	handlers[name] = fn
}

// Dispatch runs the helper named by args[0], if any. handled is false when
// args do not name a helper.
func Dispatch(args []string) (code int, handled bool) {
	if len(args) == 0 || !strings.HasPrefix(args[0], Prefix) {
		return 0, false
	}
	mu.Lock()
	fn, ok := handlers[args[0]]
	mu.Unlock()
	if !ok {
		return 125, true
	}
	return fn(args[1:]), true
}
