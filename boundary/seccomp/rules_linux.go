//go:build amd64 || arm64

package seccomp

import (
	"fmt"
	"slices"
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

// Mode bits (include/uapi/linux/stat.h). Every mode argument below is a
// umode_t in the kernel (16 bits): it truncates the register, so testing
// the low 32 bits sees exactly what the kernel will use.
const (
	setidBits = unix.S_ISUID | unix.S_ISGID // 0o6000
	fileTypes = unix.S_IFMT                 // 0o170000
)

// The reasons shared by several rules.
const (
	setidWhy = "a set-id file written into a read_write grant is set-id on the host: with an idmapped root-owned grant a workload made a setuid-root shell that a host user ran as root; nothing a workload builds needs set-id bits"
	nodeWhy  = "FIFOs, sockets and device nodes in a grant are channels to the host or to another sandbox sharing the directory (a FIFO needs no Unix-socket rules to pass data), and the workload never needs a device node"
)

// modeCall is a syscall with a mode argument that only one architecture
// has (amd64's open, creat, chmod, mkdir and mknod; arm64 has only the *at
// forms): the arch files list them, and syscallRules checks them like the
// generic ones.
type modeCall struct {
	name    string
	nr      uint32
	modeArg int
	kind    modeKind
}

type modeKind uint8

const (
	modeChmod modeKind = iota // chmod: set-id bits refused
	modeMkdir                 // mkdir: allowed, the kernel drops set-id bits itself
	modeOpen                  // open, creat: set-id bits refused, whatever the flags
	modeMknod                 // mknod: set-id bits and every type but regular refused
)

const (
	chmodAllowed = "changing permission bits of the workload's own files"
	mkdirWhy     = "the kernel drops S_ISUID and S_ISGID from mkdir's mode itself (vfs_mkdir keeps 0777 and S_ISVTX; a kernel test shows it), so there is nothing to refuse; a directory is set-gid only below a set-gid parent the host made"
)

// setidRule refuses a mode with S_ISUID or S_ISGID in argument arg.
func setidRule(name string, nr uint32, arg int, allowed string) sysRule {
	return sysRule{
		name: name, nr: nr,
		branches: []branch{{
			tests: []argTest{{arg: arg, kind: testLowAnyBit, mask: setidBits}},
			out:   eperm,
			when:  fmt.Sprintf("mode (arg %d) has S_ISUID or S_ISGID", arg),
			why:   setidWhy,
		}},
		def: allow, defWhen: "otherwise", why: allowed,
	}
}

// openRule is setidRule for open, openat and creat. The kernel reads the
// mode only with O_CREAT or O_TMPFILE; the set-id bits are refused
// whatever the flags, which is simpler than a second test and costs
// nothing: libc passes 0 as the mode when neither flag is given.
func openRule(name string, nr uint32, arg int) sysRule {
	r := setidRule(name, nr, arg, "opening and creating files; Landlock decides which")
	r.branches[0].when += " (whatever the flags: the kernel reads it only with O_CREAT or O_TMPFILE, and libc passes 0 otherwise)"
	return r
}

// mknodRule allows mknod only for regular files, without set-id bits.
func mknodRule(name string, nr uint32, arg int) sysRule {
	r := setidRule(name, nr, arg, "")
	r.branches = append(r.branches, branch{
		tests: []argTest{{arg: arg, kind: testLowMaskedIn, mask: fileTypes, vals: []uint32{0, unix.S_IFREG}}},
		out:   allow,
		when:  fmt.Sprintf("the file type in mode (arg %d) is S_IFREG or 0 (which means regular)", arg),
		why:   "creating an empty regular file is what open(O_CREAT) does anyway",
	})
	r.def, r.defWhen, r.why = eperm, "the file type is S_IFIFO, S_IFSOCK, S_IFCHR, S_IFBLK or anything else", nodeWhy
	return r
}

func (m modeCall) rule() sysRule {
	switch m.kind {
	case modeOpen:
		return openRule(m.name, m.nr, m.modeArg)
	case modeMknod:
		return mknodRule(m.name, m.nr, m.modeArg)
	case modeMkdir:
		return sysRule{name: m.name, nr: m.nr, def: allow, why: mkdirWhy}
	}
	return setidRule(m.name, m.nr, m.modeArg, chmodAllowed)
}

// syscallRules is the policy as data. The argument-checked syscalls come
// first, the most frequent (openat, ioctl) at the very front: they are the
// only ones the kernel's action cache cannot skip, and the program tests
// syscall numbers one after the other.
func syscallRules(opts Options) []sysRule {
	unixOut, unixWhy := eperm, "below Landlock ABI 9 nothing stops a connect to a pathname socket a host process put in a writable grant, and that crosses network namespaces (Options.AllowUnixSockets lifts this)"
	pair := branch{
		tests: []argTest{
			{arg: 0, kind: testIn64, vals: []uint32{unix.AF_UNIX}},
			{arg: 1, kind: testLowMaskedIn, mask: sockTypeMask, vals: []uint32{unix.SOCK_STREAM, unix.SOCK_SEQPACKET}},
		},
		out:  allow,
		when: "domain is AF_UNIX and type (SOCK_NONBLOCK and SOCK_CLOEXEC masked off) is SOCK_STREAM or SOCK_SEQPACKET",
		why:  "a connected pair reaches nobody outside: connect on it fails (EISCONN), a bound one cannot listen, and SOCK_SEQPACKET ignores a sendto address; shells, Python (socket.socketpair, multiprocessing, asyncio) and libuv use stream pairs",
	}
	pairDefWhen, pairWhy := "domain is anything else, or type is SOCK_DGRAM (or anything else)", "a SOCK_DGRAM socket from socketpair can bind, connect and sendto pathname sockets; below Landlock ABI 9 that reached a host datagram socket placed in a grant after start, both ways, and lets sandboxes sharing a directory talk"
	if opts.AllowUnixSockets {
		unixOut, unixWhy = allow, "Landlock ABI 9+ Unix-socket rules confine pathname sockets (Options.AllowUnixSockets)"
		pair.tests = pair.tests[:1]
		pair.when = "domain is AF_UNIX"
		pair.why = "Landlock ABI 9+ Unix-socket rules confine pathname sockets, whatever the type (Options.AllowUnixSockets)"
		pairDefWhen, pairWhy = "domain is anything else", "no other family is needed"
	}
	inet := branch{
		tests: []argTest{{arg: 0, kind: testIn64, vals: []uint32{unix.AF_INET, unix.AF_INET6}}},
		out:   allow,
		when:  "domain is AF_INET or AF_INET6",
		why:   "loopback TCP/UDP to the broker, inside the sandbox's own network namespace",
	}
	var inet6 []branch
	if opts.IPv4Only {
		inet.tests = []argTest{{arg: 0, kind: testIn64, vals: []uint32{unix.AF_INET}}}
		inet.when = "domain is AF_INET"
		inet.why = "TCP/UDP to the broker, which the sandbox reaches over IPv4"
		inet6 = []branch{{
			tests: []argTest{{arg: 0, kind: testIn64, vals: []uint32{unix.AF_INET6}}},
			out:   eperm,
			when:  "domain is AF_INET6",
			why:   "a Pod's IPv6 link-local address reaches the node and the Pods on its bridge past a NetworkPolicy enforced for IPv4 (Options.IPv4Only)",
		}}
	}
	rules := []sysRule{
		openRule("openat", unix.SYS_OPENAT, 3),
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
			branches: slices.Concat(inet6, []branch{
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
				inet,
				{
					tests: []argTest{
						{arg: 0, kind: testIn64, vals: []uint32{unix.AF_NETLINK}},
						{arg: 2, kind: testLowIn, vals: []uint32{unix.NETLINK_ROUTE}},
					},
					out:  allow,
					when: "domain is AF_NETLINK and protocol (low 32 bits, all the kernel reads) is NETLINK_ROUTE",
					why:  "getifaddrs (glibc, Go's net.Interfaces) lists the sandbox's own interfaces over NETLINK_ROUTE",
				},
				{
					tests: []argTest{{arg: 0, kind: testIn64, vals: []uint32{unix.AF_UNIX}}},
					out:   unixOut,
					when:  "domain is AF_UNIX",
					why:   unixWhy,
				},
			}),
			def: eperm, defWhen: "domain is anything else (AF_PACKET, AF_VSOCK, AF_ALG, AF_BLUETOOTH, …, or a high word set), or AF_NETLINK with any other protocol",
			why: "other families either leave the network namespace (AF_VSOCK) or are kernel attack surface the workload does not need; the other netlink protocols (audit, netfilter, generic, uevent, sock_diag, …) administer or watch the host's kernel",
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
			branches: []branch{pair},
			def:      eperm, defWhen: pairDefWhen, why: pairWhy,
		},
		setidRule("fchmod", unix.SYS_FCHMOD, 1, chmodAllowed),
		setidRule("fchmodat", unix.SYS_FCHMODAT, 2, chmodAllowed),
		setidRule("fchmodat2", unix.SYS_FCHMODAT2, 2, chmodAllowed+" (glibc 2.39+ uses it for AT_SYMLINK_NOFOLLOW)"),
		modeCall{name: "mkdirat", nr: unix.SYS_MKDIRAT, modeArg: 2, kind: modeMkdir}.rule(),
		mknodRule("mknodat", unix.SYS_MKNODAT, 2),
		{
			name: "renameat2", nr: unix.SYS_RENAMEAT2,
			branches: []branch{{
				tests: []argTest{{arg: 4, kind: testLowAnyBit, mask: unix.RENAME_WHITEOUT}},
				out:   eperm,
				when:  "flags (arg 4) have RENAME_WHITEOUT",
				why:   "a whiteout is a character device node (0:0) left in the grant; only overlay filesystem tools make them",
			}},
			def: allow, defWhen: "otherwise", why: "renames, RENAME_NOREPLACE and RENAME_EXCHANGE",
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
	}
	for _, m := range archModeCalls {
		rules = append(rules, m.rule())
	}
	rules = append(rules,
		sysRule{
			name: "clone3", nr: unix.SYS_CLONE3,
			def: outcome{action: ActionErrno, errno: unix.ENOSYS},
			why: "seccomp cannot read its flags (behind a pointer); glibc and others fall back to clone on ENOSYS",
		},
		sysRule{
			name: "openat2", nr: unix.SYS_OPENAT2,
			def: outcome{action: ActionErrno, errno: unix.ENOSYS},
			why: "its mode sits in a struct behind a pointer, so seccomp cannot refuse set-id bits there; callers (systemd, runc, libpathrs) fall back to openat on ENOSYS, and neither glibc nor Go's standard library calls it on its own",
		},
		sysRule{
			name: "execveat", nr: unix.SYS_EXECVEAT, def: allow,
			why: "fexecve(3) uses it. It runs a memfd that Landlock's execute right never checks (memfd lives on the kernel's internal mount, which Landlock exempts; TestKernelLandlockMemfdExec shows it), but refusing it would not close that: execve(\"/proc/self/fd/N\") runs the same memfd, even with /proc mounted noexec. Closing it is vm.memfd_noexec=2 in the sandbox's pid namespace, which makes every memfd non-executable; without it, an anonymous program is still no more than a file written to /tmp or a read_write grant, where Landlock grants execute",
		},
		sysRule{
			name: "memfd_create", nr: unix.SYS_MEMFD_CREATE, def: allow,
			why: "shared and anonymous file memory (Wayland, Chromium, V8, systemd tools); see execveat for what executing one means",
		},
	)

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
	deny("fanotify groups and marks are charged to the owner's uid in every ancestor user namespace, up to the host's (a sandbox used up host uid 0's 128 groups), and marks on read-only grants watch the host's own use of those files",
		sc{"fanotify_init", unix.SYS_FANOTIFY_INIT})
	deny("secret memory is unmovable and locked, and while any exists the host cannot hibernate; ordinary programs do not use it",
		sc{"memfd_secret", unix.SYS_MEMFD_SECRET})
	deny("mount enumeration by id (Linux 6.8+) reports every mount's source root, i.e. the host paths behind the grants, and bypasses any masking of /proc/self/mountinfo; programs read mountinfo instead",
		sc{"listmount", unix.SYS_LISTMOUNT}, sc{"statmount", unix.SYS_STATMOUNT})
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

// Policy returns the policy of the filter that Build(opts) compiles, one
// Rule per decision, in the order the filter applies them. It is what
// `moat run --explain` and `moat policy check --explain` print.
func Policy(opts Options) []Rule {
	out := []Rule{{Syscall: "*", When: "arch is not " + archName, Action: ActionKillProcess,
		Why: "syscall numbers mean other things under other ABIs"}}
	if killX32 {
		out = append(out, Rule{Syscall: "*", When: "nr has __X32_SYSCALL_BIT", Action: ActionKillProcess,
			Why: "x32 syscalls share the x86_64 arch value but not its numbers"})
	}
	for _, r := range syscallRules(opts) {
		for _, b := range r.branches {
			out = append(out, Rule{Syscall: r.name, When: b.when, Action: b.out.action, Errno: b.out.errno, Why: b.why})
		}
		out = append(out, Rule{Syscall: r.name, When: r.defWhen, Action: r.def.action, Errno: r.def.errno, Why: r.why})
	}
	return append(out, Rule{Syscall: "*", When: "any other syscall", Action: ActionAllow,
		Why: "Go's runtime, shells, coreutils and Python need them"})
}
