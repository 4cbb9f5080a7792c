//go:build amd64 || arm64

package seccomp_test

import (
	"fmt"

	"github.com/moat-sandbox/moat/boundary/native/seccomp"
)

// The policy is data: this is what `moat run --explain` can print for the
// socket syscall, in the order the filter decides.
func ExamplePolicy() {
	for _, r := range seccomp.Policy() {
		if r.Syscall == "socket" || r.Syscall == "clone3" {
			fmt.Println(r)
		}
	}
	// Output:
	// socket: EPERM when type is SOCK_PACKET (the kernel turns (AF_INET, SOCK_PACKET) into a packet socket)
	// socket: EPERM when domain is AF_INET or AF_INET6 and protocol (low 32 bits) is IPPROTO_MPTCP (MPTCP is a large, young protocol stack reachable without privilege)
	// socket: allow when domain is AF_INET, AF_INET6 or AF_NETLINK (loopback TCP/UDP to the broker; netlink for getifaddrs)
	// socket: EPERM when domain is AF_UNIX (below Landlock ABI 9 nothing stops a connect to a pathname socket a host process put in a writable grant, and that crosses network namespaces (Options.AllowUnixSockets lifts this))
	// socket: EPERM when domain is anything else (AF_PACKET, AF_VSOCK, AF_ALG, AF_BLUETOOTH, …, or a high word set) (other families either leave the network namespace (AF_VSOCK) or are kernel attack surface the workload does not need)
	// clone3: ENOSYS (seccomp cannot read its flags (behind a pointer); glibc and others fall back to clone on ENOSYS)
}
