// Package seccomp builds and installs moat's seccomp filter, the one filter
// every process of a sandbox runs behind on both backends: on native the
// third wall after the namespaces and Landlock, installed by the stage; on
// gVisor installed by the stage inside the sentry, which enforces it. Each
// backend says which [Options] it builds it with ([Filtered]).
//
// The filter is a classic-BPF program over struct seccomp_data. It decides:
//
//  1. A syscall made under any architecture but the native one (i386 or
//     x32 on amd64, AArch32 on arm64) kills the process: the syscall
//     numbers below would mean something else there. On amd64, a number
//     with __X32_SYSCALL_BIT set is killed too.
//  2. clone3 and openat2 return ENOSYS: their flags (clone3) and mode
//     (openat2) sit behind a pointer that seccomp cannot read, and callers
//     fall back to clone and openat only on ENOSYS.
//  3. clone with any CLONE_NEW* flag returns EPERM; clone for threads and
//     fork is allowed.
//  4. socket is allowed only for AF_INET, AF_INET6, AF_NETLINK with
//     NETLINK_ROUTE (what getifaddrs uses; the other netlink protocols
//     administer or watch the kernel) and AF_UNIX with
//     [Options.AllowUnixSockets]; never with IPPROTO_MPTCP or the obsolete
//     SOCK_PACKET type. socketpair only for AF_UNIX, and below Landlock ABI
//     9 (AllowUnixSockets false) only of type SOCK_STREAM or SOCK_SEQPACKET
//     (SOCK_NONBLOCK and SOCK_CLOEXEC masked off): a SOCK_DGRAM socket from
//     socketpair can bind, connect and sendto pathname sockets, and reached
//     a host socket placed in a grant, while a connected stream or
//     seqpacket pair cannot connect again (EISCONN) nor listen. ioctl is
//     allowed except TIOCSTI, TIOCLINUX and TIOCSETD; personality only as
//     a query or a reset to PER_LINUX.
//  5. No set-id file and no special file can be made. S_ISUID or S_ISGID
//     in the mode of chmod, fchmod, fchmodat, fchmodat2, open, openat,
//     creat and mknod(at) returns EPERM: with a root-owned read_write grant
//     mounted idmapped, a workload made a setuid-root file on the host.
//     open's mode is tested whatever the flags (the kernel reads it only
//     with O_CREAT or O_TMPFILE, and libc passes 0 otherwise), which is
//     simpler than testing the flags too. mkdir needs no rule: the kernel
//     drops set-id bits from its mode itself (a kernel test shows it).
//     mknod(at) makes only regular files: FIFOs, sockets and device nodes
//     are EPERM on every Landlock ABI, because a FIFO or socket in a shared
//     directory is a channel and a device is never needed; renameat2 with
//     RENAME_WHITEOUT (which leaves a 0:0 character device) is EPERM too.
//     The legacy calls (open, creat, chmod, mknod) exist on amd64 only;
//     arm64 has just the *at forms.
//  6. A fixed list of syscalls (namespaces, mounts, ptrace, io_uring,
//     keys, bpf, perf, module and kexec loading, fanotify_init,
//     memfd_secret, listmount, statmount, …) returns EPERM. fanotify
//     groups are charged to the owner's uid up to the host's user
//     namespace; secret memory blocks hibernation host-wide; listmount and
//     statmount report the host paths behind the grants.
//  7. Everything else is allowed. execveat and memfd_create have explicit
//     rules that say why: Landlock does not check the execution of a memfd
//     (TestKernelLandlockMemfdExec), but execve("/proc/self/fd/N") runs the
//     same memfd, so refusing execveat would close nothing; what closes it
//     is vm.memfd_noexec=2 in the sandbox's pid namespace. Until then an
//     anonymous program is no more than a file written to /tmp or a
//     read_write grant, where Landlock grants execute anyway.
//
// Denials return an errno, not a kill, so that programs can report what
// failed; only a foreign architecture kills. [Policy] returns the whole
// list, each line with its reason; it is the source the program is compiled
// from, so documentation and filter cannot drift apart.
//
// # Arguments are 64 bits
//
// seccomp_data carries each argument as a u64, but the BPF machine loads 32
// bits at a time, so every argument test says which half it reads. The
// kernel truncates int and unsigned int arguments (socket's domain and
// protocol, ioctl's cmd, personality, renameat2's flags) to their low 32
// bits, and umode_t mode arguments to 16, so deny tests on those compare
// only the low word: a high word cannot smuggle a denied value past them. Allow tests on socket domains require the whole 64-bit
// value to be the allowed one (high word zero), so anything unusual falls
// to the deny side. clone's flags are tested on the low word, which is all
// the kernel reads from them.
//
// # Why a small assembler of our own
//
// The instruction types, the encoder and (in tests) the interpreter come
// from golang.org/x/net/bpf, which the Go project maintains. Its assembler
// takes jump distances as raw skip counts, so this package adds forward
// labels (about 100 lines) rather than pull in libseccomp (cgo) or a
// larger seccomp library for a filter of this size. The program is a
// linear list of syscall checks; the kernel's per-syscall action cache
// (Linux 5.11+) skips the filter entirely for syscalls whose action does
// not depend on arguments, so a tree of comparisons would buy nothing for
// them, and the argument-checked syscalls come first, openat (the most
// frequent, and argument-checked for its mode) at the very front.
//
// # Installing
//
// [Install] sets no_new_privs and installs the filter on the calling
// thread only (no SECCOMP_FILTER_FLAG_TSYNC). The caller must have called
// runtime.LockOSThread, must not unlock it, and must execve (or fork and
// execve) from that same thread: the new program inherits the thread's
// filter. Other threads of the calling Go process stay unfiltered.
//
// Only linux/amd64 and linux/arm64 are supported; elsewhere Build and
// Install return an [*UnsupportedError].
package seccomp
