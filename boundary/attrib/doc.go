// Package attrib attributes a broker connection to the process that made it.
//
// Given a TCP connection accepted on the broker's listener, it finds the
// peer's socket in the sandbox's network namespace (/proc/<pid>/net/tcp and
// tcp6, viewed through a process that lives in that namespace), finds the
// one process in that namespace whose file table holds that socket
// (/proc/*/fd), and identifies its executable by path and by the sha256 of
// the file it runs (read through /proc/<pid>/exe, so the hash is of the
// bytes the kernel executes, whichever mount namespace the path belongs
// to).
//
// Attribution never guesses: a socket held by more than one process, a peer
// that has already closed, or a process that cannot be inspected yields
// Status "unavailable" with the precise reason, never a best match.
//
// The lookup is written against procfs directly (no library): the formats
// are small and fixed (proc_net_tcp.rst in the kernel documentation), and
// the parser is fuzzed.
package attrib

import (
	"fmt"

	"github.com/moat-sandbox/moat/boundary"
)

// Limits.
const (
	// MaxExecutableBytes caps how much of an executable is hashed; a larger
	// executable is reported unavailable rather than hashed in part.
	MaxExecutableBytes = 1 << 30
	// maxProcNetLines caps the rows read from one /proc/<pid>/net/tcp file.
	maxProcNetLines = 1 << 20
)

func unavailable(format string, a ...any) boundary.Attribution {
	return boundary.Attribution{Status: boundary.AttributionUnavailable, Reason: fmt.Sprintf(format, a...)}
}
