// Package seccomp builds and installs the native backend's seccomp filter:
// the third wall after the namespaces and Landlock.
//
// The filter is a classic-BPF program over struct seccomp_data. It decides:
//
//  1. A syscall made under any architecture but the native one (i386 or
//     x32 on amd64, AArch32 on arm64) kills the process: the syscall
//     numbers below would mean something else there. On amd64, a number
//     with __X32_SYSCALL_BIT set is killed too.
//  2. clone3 returns ENOSYS: its flags sit behind a pointer that seccomp
//     cannot read, and glibc falls back to clone only on ENOSYS.
//  3. clone with any CLONE_NEW* flag returns EPERM; clone for threads and
//     fork is allowed.
//  4. socket is allowed only for AF_INET, AF_INET6, AF_NETLINK (and
//     AF_UNIX with [Options.AllowUnixSockets]), never with IPPROTO_MPTCP
//     or the obsolete SOCK_PACKET type; socketpair only for AF_UNIX;
//     ioctl is allowed except TIOCSTI, TIOCLINUX and TIOCSETD;
//     personality only as a query or a reset to PER_LINUX.
//  5. A fixed list of syscalls (namespaces, mounts, ptrace, io_uring,
//     keys, bpf, perf, module and kexec loading, …) returns EPERM.
//  6. Everything else is allowed.
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
// protocol, ioctl's cmd, personality) to their low 32 bits, so deny tests
// on those compare only the low word: a high word cannot smuggle a denied
// value past them. Allow tests on socket domains require the whole 64-bit
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
// them, and the argument-checked syscalls come first.
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
