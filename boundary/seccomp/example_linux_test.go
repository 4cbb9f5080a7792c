//go:build amd64 || arm64

package seccomp_test

import (
	"fmt"

	"github.com/moat-sandbox/moat/boundary/seccomp"
)

// The policy is data: this is what `moat run --explain` prints for the
// socket, socketpair, mknodat and openat2 syscalls with the strictest
// Options (the native backend below Landlock ABI 9), in the order the
// filter decides.
func ExamplePolicy() {
	for _, r := range seccomp.Policy(seccomp.Options{}) {
		switch r.Syscall {
		case "socket", "socketpair", "mknodat", "openat2":
			fmt.Println(r)
		}
	}
	// Output:
	// socket: EPERM when type is SOCK_PACKET (the kernel turns (AF_INET, SOCK_PACKET) into a packet socket)
	// socket: EPERM when domain is AF_INET or AF_INET6 and protocol (low 32 bits) is IPPROTO_MPTCP (MPTCP is a large, young protocol stack reachable without privilege)
	// socket: allow when domain is AF_INET or AF_INET6 (loopback TCP/UDP to the broker, inside the sandbox's own network namespace)
	// socket: allow when domain is AF_NETLINK and protocol (low 32 bits, all the kernel reads) is NETLINK_ROUTE (getifaddrs (glibc, Go's net.Interfaces) lists the sandbox's own interfaces over NETLINK_ROUTE)
	// socket: EPERM when domain is AF_UNIX (below Landlock ABI 9 nothing stops a connect to a pathname socket a host process put in a writable grant, and that crosses network namespaces (Options.AllowUnixSockets lifts this))
	// socket: EPERM when domain is anything else (AF_PACKET, AF_VSOCK, AF_ALG, AF_BLUETOOTH, …, or a high word set), or AF_NETLINK with any other protocol (other families either leave the network namespace (AF_VSOCK) or are kernel attack surface the workload does not need; the other netlink protocols (audit, netfilter, generic, uevent, sock_diag, …) administer or watch the host's kernel)
	// socketpair: allow when domain is AF_UNIX and type (SOCK_NONBLOCK and SOCK_CLOEXEC masked off) is SOCK_STREAM or SOCK_SEQPACKET (a connected pair reaches nobody outside: connect on it fails (EISCONN), a bound one cannot listen, and SOCK_SEQPACKET ignores a sendto address; shells, Python (socket.socketpair, multiprocessing, asyncio) and libuv use stream pairs)
	// socketpair: EPERM when domain is anything else, or type is SOCK_DGRAM (or anything else) (a SOCK_DGRAM socket from socketpair can bind, connect and sendto pathname sockets; below Landlock ABI 9 that reached a host datagram socket placed in a grant after start, both ways, and lets sandboxes sharing a directory talk)
	// mknodat: EPERM when mode (arg 2) has S_ISUID or S_ISGID (a set-id file written into a read_write grant is set-id on the host: with an idmapped root-owned grant a workload made a setuid-root shell that a host user ran as root; nothing a workload builds needs set-id bits)
	// mknodat: allow when the file type in mode (arg 2) is S_IFREG or 0 (which means regular) (creating an empty regular file is what open(O_CREAT) does anyway)
	// mknodat: EPERM when the file type is S_IFIFO, S_IFSOCK, S_IFCHR, S_IFBLK or anything else (FIFOs, sockets and device nodes in a grant are channels to the host or to another sandbox sharing the directory (a FIFO needs no Unix-socket rules to pass data), and the workload never needs a device node)
	// openat2: ENOSYS (its mode sits in a struct behind a pointer, so seccomp cannot refuse set-id bits there; callers (systemd, runc, libpathrs) fall back to openat on ENOSYS, and neither glibc nor Go's standard library calls it on its own)
}
