// Package attrib attributes a broker connection to the process that made it.
//
// Given a TCP connection accepted on the broker's listener, it finds the
// peer's socket in the sandbox's network namespace by asking the kernel
// for that one 4-tuple (sock_diag, on a netlink socket made in that
// namespace; where moat may not enter it, as an unprivileged moat may not
// a user namespace's, and whenever the kernel has no such socket, by
// reading /proc/<pid>/net/tcp and tcp6 of a process that lives there),
// finds the
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
// The lookup is written against procfs and sock_diag directly (no
// library): the formats are small and fixed (proc_net_tcp.rst,
// linux/inet_diag.h), and the table parser is fuzzed. The kernel answers
// a sock_diag question about a 4-tuple nobody has with a listener on its
// local port; only a socket with exactly the 4-tuple asked for, not
// listening, is taken.
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
