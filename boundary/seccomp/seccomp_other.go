//go:build !linux

package seccomp

// SockFilter mirrors the kernel's struct sock_filter, so that this package
// builds where golang.org/x/sys/unix has no such type. On Linux, Build
// returns []unix.SockFilter.
type SockFilter struct {
	Code uint16
	Jt   uint8
	Jf   uint8
	K    uint32
}

const unsupportedReason = "seccomp is a Linux facility"

// Build returns an *UnsupportedError: seccomp exists only on Linux.
func Build(opts Options) ([]SockFilter, error) { return nil, unsupported(unsupportedReason) }

// Install returns an *UnsupportedError: seccomp exists only on Linux.
func Install(prog []SockFilter) error { return unsupported(unsupportedReason) }

// Policy returns nil: there is no filter on this system.
func Policy(Options) []Rule { return nil }
