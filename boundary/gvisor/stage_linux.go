package gvisor

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/boundary/seccomp"
)

// filterOptions are the Options of the seccomp filter the stage installs.
// AF_UNIX stays allowed: the sentry does not connect to host sockets in
// bind mounts (runsc runs without --host-uds).
var filterOptions = seccomp.Options{AllowUnixSockets: true}

// SeccompOptions are the Options of the filter that every process of a
// sandbox runs behind (seccomp.Filtered).
func (backend) SeccompOptions() seccomp.Options { return filterOptions }

// StageMain runs inside the sentry in front of every process that
// `runsc exec` starts. runsc applies the spec's seccomp filter to the
// container's init only, not to exec'd processes (measured: `unshare -U`
// succeeded in an exec'd shell while the same filter stopped it in the
// init), so the stage installs moat's own filter, which the sentry
// enforces, and then executes the target on the same thread.
//
// Usage: `moat __moat-gvisor-stage -- ARGV…`. Exit 127 when the command
// is not found, 126 when it cannot be executed, 125 when the filter cannot
// be installed.
func StageMain(args []string) int {
	if len(args) < 2 || args[0] != "--" {
		fmt.Fprintln(os.Stderr, "moat: gvisor stage: usage: -- CMD [ARG…]")
		return boundary.ExitRefused
	}
	argv := args[1:]
	runtime.LockOSThread()
	prog, err := seccomp.Build(filterOptions)
	if err == nil {
		err = seccomp.Install(prog)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "moat: refused: cannot install the seccomp filter inside gVisor: %v\n", err)
		return boundary.ExitRefused
	}
	if slices.Equal(argv, pauseArgs) {
		// The container's init: the pause runs in this process, on this
		// thread (locked for good), which has the filter; it forks every
		// process from here, so each inherits it. One Go start-up inside
		// the sentry instead of two.
		return PauseMain(nil)
	}
	path := argv[0]
	if !strings.Contains(path, "/") {
		p, err := exec.LookPath(path)
		if err != nil {
			fmt.Fprintf(os.Stderr, "moat: %s: command not found\n", path)
			return boundary.ExitNotFound
		}
		path = p
	}
	err = unix.Exec(path, argv, os.Environ())
	fmt.Fprintf(os.Stderr, "moat: cannot execute %s: %v\n", argv[0], err)
	if errors.Is(err, unix.ENOENT) {
		return boundary.ExitNotFound
	}
	return boundary.ExitCannotExec
}
