//go:build !amd64 && !arm64

package seccomp

import "golang.org/x/sys/unix"

const unsupportedReason = "the filter is written for amd64 and arm64 syscall tables only"

// Build returns an *UnsupportedError on this architecture.
func Build(opts Options) ([]unix.SockFilter, error) { return nil, unsupported(unsupportedReason) }

// Install returns an *UnsupportedError on this architecture.
func Install(prog []unix.SockFilter) error { return unsupported(unsupportedReason) }

// Policy returns nil on this architecture: there is no filter.
func Policy(Options) []Rule { return nil }
