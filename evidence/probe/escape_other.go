//go:build !linux

package probe

import "errors"

// Holding inotify instances is Linux's; elsewhere the step reports that
// it could not run (the sandbox is Linux-only, and probekit's set-id and
// datagram attempts say the same).
var errLinuxOnly = errors.New("this step needs Linux")

func holdInotify(held func(n int, why error)) (int, error) {
	held(0, errLinuxOnly)
	return 0, errLinuxOnly
}
