//go:build amd64 || arm64

package seccomp

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// sysRule says how one syscall is treated: its argument branches are tried
// in order, and when none holds (or there are none), the default applies.
type sysRule struct {
	name     string
	nr       uint32
	branches []branch
	def      outcome // when no branch holds
	defWhen  string  // the default's condition in words ("" when there are no branches)
	why      string  // reason for the default
}

// branch is a conjunction of argument tests with its outcome.
type branch struct {
	tests []argTest // all must hold
	out   outcome
	when  string
	why   string
}

type outcome struct {
	action Action
	errno  syscall.Errno
}

var (
	allow = outcome{action: ActionAllow}
	eperm = outcome{action: ActionErrno, errno: unix.EPERM}
)

// testKind is how an argTest reads a 64-bit argument.
type testKind uint8

const (
	testInvalid     testKind = iota
	testIn64                 // the whole 64-bit value is one of vals (high word 0)
	testLowIn                // the low 32 bits are one of vals; the high word is ignored
	testLowMaskedIn          // the low 32 bits AND mask are one of vals
	testLowAnyBit            // the low 32 bits AND mask are not zero
)

type argTest struct {
	arg  int // 0…5
	kind testKind
	mask uint32
	vals []uint32
}

// cloneNewFlags are the namespace flags of clone(2). CLONE_NEWTIME (0x80)
// overlaps the exit-signal byte of the legacy clone and cannot be used
// there, but no valid signal number has that bit, so testing it costs
// nothing and keeps the list complete.
const cloneNewFlags = unix.CLONE_NEWNS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWUTS |
	unix.CLONE_NEWIPC | unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET |
	unix.CLONE_NEWTIME

// sockTypeMask is the kernel's SOCK_TYPE_MASK: socket's type argument
// without SOCK_NONBLOCK and SOCK_CLOEXEC.
const sockTypeMask = 0xf

// syscallRules is the policy as data. The argument-checked syscalls come
// first: they are the only ones the kernel's action cache cannot skip.
func syscallRules(opts Options) []sysRule {
	unixOut, unixWhy := eperm, "below Landlock ABI 9 nothing stops a connect to a pathname socket a host process put in a writable grant, and that crosses network namespaces (Options.AllowUnixSockets lifts this)"
	if opts.AllowUnixSockets {
		unixOut, unixWhy = allow, "Landlock ABI 9+ Unix-socket rules confine pathname sockets (Options.AllowUnixSockets)"
	}
	rules := []sysRule{
		{
			name: "ioctl", nr: unix.SYS_IOCTL,
			branches: []branch{{
				tests: []argTest{{arg: 1, kind: testLowIn, vals: []uint32{unix.TIOCSTI, unix.TIOCLINUX, unix.TIOCSETD}}},
				out:   eperm,
				when:  "cmd (low 32 bits) is TIOCSTI, TIOCLINUX or TIOCSETD",
				why:   "TIOCSTI types into a terminal the host may read from; TIOCLINUX reaches the console; TIOCSETD loads line disciplines, a recurring source of kernel bugs",
			}},
			def: allow, defWhen: "otherwise", why: "terminal and device control that programs need",
		},
		{
			name: "socket", nr: unix.SYS_SOCKET,
			branches: []branch{
				{
					tests: []argTest{{arg: 1, kind: testLowMaskedIn, mask: sockTypeMask, vals: []uint32{unix.SOCK_PACKET}}},
					out:   eperm,
					when:  "type is SOCK_PACKET",
					why:   "the kernel turns (AF_INET, SOCK_PACKET) into a packet socket",
				},
				{
					tests: []argTest{
						{arg: 0, kind: testIn64, vals: []uint32{unix.AF_INET, unix.AF_INET6}},
						{arg: 2, kind: testLowIn, vals: []uint32{unix.IPPROTO_MPTCP}},
					},
					out:  eperm,
					when: "domain is AF_INET or AF_INET6 and protocol (low 32 bits) is IPPROTO_MPTCP",
					why:  "MPTCP is a large, young protocol stack reachable without privilege",
				},
				{
					tests: []argTest{{arg: 0, kind: testIn64, vals: []uint32{unix.AF_INET, unix.AF_INET6, unix.AF_NETLINK}}},
					out:   allow,
					when:  "domain is AF_INET, AF_INET6 or AF_NETLINK",
					why:   "loopback TCP/UDP to the broker; netlink for getifaddrs",
				},
				{
					tests: []argTest{{arg: 0, kind: testIn64, vals: []uint32{unix.AF_UNIX}}},
					out:   unixOut,
					when:  "domain is AF_UNIX",
					why:   unixWhy,
				},
			},
			def: eperm, defWhen: "domain is anything else (AF_PACKET, AF_VSOCK, AF_ALG, AF_BLUETOOTH, …, or a high word set)",
			why: "other families either leave the network namespace (AF_VSOCK) or are kernel attack surface the workload does not need",
		},
		{
			name: "clone", nr: unix.SYS_CLONE,
			branches: []branch{{
				tests: []argTest{{arg: 0, kind: testLowAnyBit, mask: cloneNewFlags}},
				out:   eperm,
				when:  "flags (low 32 bits) have any CLONE_NEW* bit",
				why:   "new namespaces, above all user namespaces, reopen the privilege the sandbox took away",
			}},
			def: allow, defWhen: "otherwise", why: "threads and fork",
		},
		{
			name: "socketpair", nr: unix.SYS_SOCKETPAIR,
			branches: []branch{{
				tests: []argTest{{arg: 0, kind: testIn64, vals: []uint32{unix.AF_UNIX}}},
				out:   allow,
				when:  "domain is AF_UNIX",
				why:   "an unnamed pair reaches nobody outside; shells, Go and Python use it",
			}},
			def: eperm, defWhen: "domain is anything else", why: "no other family is needed",
		},
		{
			name: "personality", nr: unix.SYS_PERSONALITY,
			branches: []branch{{
				tests: []argTest{{arg: 0, kind: testLowIn, vals: []uint32{0, 0xffffffff}}},
				out:   allow,
				when:  "persona (low 32 bits) is PER_LINUX or 0xffffffff (query)",
				why:   "reading or resetting the default persona is harmless",
			}},
			def: eperm, defWhen: "otherwise", why: "flags such as ADDR_NO_RANDOMIZE and READ_IMPLIES_EXEC weaken exploit mitigations",
		},
		{
			name: "clone3", nr: unix.SYS_CLONE3,
			def: outcome{action: ActionErrno, errno: unix.ENOSYS},
			why: "seccomp cannot read its flags (behind a pointer); glibc and others fall back to clone on ENOSYS",
		},
	}

	deny := func(why string, calls ...struct {
		name string
		nr   uint32
	}) {
		for _, c := range calls {
			rules = append(rules, sysRule{name: c.name, nr: c.nr, def: eperm, why: why})
		}
	}
	type sc = struct {
		name string
		nr   uint32
	}
	deny("namespaces and mounts would undo the sandbox's own",
		sc{"unshare", unix.SYS_UNSHARE}, sc{"setns", unix.SYS_SETNS},
		sc{"mount", unix.SYS_MOUNT}, sc{"umount2", unix.SYS_UMOUNT2},
		sc{"pivot_root", unix.SYS_PIVOT_ROOT}, sc{"chroot", unix.SYS_CHROOT},
		sc{"open_tree", unix.SYS_OPEN_TREE}, sc{"open_tree_attr", unix.SYS_OPEN_TREE_ATTR},
		sc{"move_mount", unix.SYS_MOVE_MOUNT}, sc{"fsopen", unix.SYS_FSOPEN},
		sc{"fsconfig", unix.SYS_FSCONFIG}, sc{"fsmount", unix.SYS_FSMOUNT},
		sc{"fspick", unix.SYS_FSPICK}, sc{"mount_setattr", unix.SYS_MOUNT_SETATTR})
	deny("reaching into other processes (ptrace and its relatives)",
		sc{"ptrace", unix.SYS_PTRACE},
		sc{"process_vm_readv", unix.SYS_PROCESS_VM_READV}, sc{"process_vm_writev", unix.SYS_PROCESS_VM_WRITEV},
		sc{"pidfd_getfd", unix.SYS_PIDFD_GETFD}, sc{"kcmp", unix.SYS_KCMP},
		sc{"process_madvise", unix.SYS_PROCESS_MADVISE})
	deny("large kernel attack surface that ordinary programs do not need",
		sc{"io_uring_setup", unix.SYS_IO_URING_SETUP}, sc{"io_uring_enter", unix.SYS_IO_URING_ENTER},
		sc{"io_uring_register", unix.SYS_IO_URING_REGISTER},
		sc{"bpf", unix.SYS_BPF}, sc{"perf_event_open", unix.SYS_PERF_EVENT_OPEN},
		sc{"userfaultfd", unix.SYS_USERFAULTFD}, sc{"vmsplice", unix.SYS_VMSPLICE})
	deny("kernel keyrings are not namespaced by the sandbox",
		sc{"keyctl", unix.SYS_KEYCTL}, sc{"add_key", unix.SYS_ADD_KEY}, sc{"request_key", unix.SYS_REQUEST_KEY})
	deny("file handles bypass path-based confinement",
		sc{"open_by_handle_at", unix.SYS_OPEN_BY_HANDLE_AT}, sc{"name_to_handle_at", unix.SYS_NAME_TO_HANDLE_AT})
	deny("host administration; needs capabilities the workload never has, so refuse before the kernel parses anything",
		sc{"kexec_load", unix.SYS_KEXEC_LOAD}, sc{"kexec_file_load", unix.SYS_KEXEC_FILE_LOAD},
		sc{"init_module", unix.SYS_INIT_MODULE}, sc{"finit_module", unix.SYS_FINIT_MODULE},
		sc{"delete_module", unix.SYS_DELETE_MODULE},
		sc{"acct", unix.SYS_ACCT}, sc{"swapon", unix.SYS_SWAPON}, sc{"swapoff", unix.SYS_SWAPOFF},
		sc{"reboot", unix.SYS_REBOOT}, sc{"syslog", unix.SYS_SYSLOG},
		sc{"settimeofday", unix.SYS_SETTIMEOFDAY}, sc{"clock_settime", unix.SYS_CLOCK_SETTIME},
		sc{"clock_adjtime", unix.SYS_CLOCK_ADJTIME}, sc{"adjtimex", unix.SYS_ADJTIMEX},
		sc{"quotactl", unix.SYS_QUOTACTL}, sc{"quotactl_fd", unix.SYS_QUOTACTL_FD},
		sc{"lookup_dcookie", unix.SYS_LOOKUP_DCOOKIE})
	for _, r := range archRules {
		rules = append(rules, sysRule{name: r.name, nr: r.nr, def: eperm, why: r.why})
	}
	return rules
}

// Policy returns the filter's policy with the zero Options (the strictest),
// one Rule per decision, in the order the filter applies them.
func Policy() []Rule {
	out := []Rule{{Syscall: "*", When: "arch is not " + archName, Action: ActionKillProcess,
		Why: "syscall numbers mean other things under other ABIs"}}
	if killX32 {
		out = append(out, Rule{Syscall: "*", When: "nr has __X32_SYSCALL_BIT", Action: ActionKillProcess,
			Why: "x32 syscalls share the x86_64 arch value but not its numbers"})
	}
	for _, r := range syscallRules(Options{}) {
		for _, b := range r.branches {
			out = append(out, Rule{Syscall: r.name, When: b.when, Action: b.out.action, Errno: b.out.errno, Why: b.why})
		}
		out = append(out, Rule{Syscall: r.name, When: r.defWhen, Action: r.def.action, Errno: r.def.errno, Why: r.why})
	}
	return append(out, Rule{Syscall: "*", When: "any other syscall", Action: ActionAllow,
		Why: "Go's runtime, shells, coreutils and Python need them"})
}
