//go:build amd64 || arm64

package seccomp

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

const hi = 1 << 32 // a bit in an argument's high word

// Constants golang.org/x/sys/unix does not name.
const (
	fionread        = 0x541b    // FIONREAD
	addrNoRandomize = 0x0040000 // ADDR_NO_RANDOMIZE
	mmapPageZero    = 0x0100000 // MMAP_PAGE_ZERO
	readImpliesExec = 0x0400000 // READ_IMPLIES_EXEC
)

type vmCase struct {
	name string
	d    seccompData
	want uint32
}

func tableCases(opts Options) []vmCase {
	unixWant := uint32(retEPERM)
	if opts.AllowUnixSockets {
		unixWant = retAllow
	}
	inet6Want := uint32(retAllow)
	if opts.IPv4Only {
		inet6Want = retEPERM
	}
	const goThread = unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND |
		unix.CLONE_SYSVSEM | unix.CLONE_THREAD
	cases := []vmCase{
		{"read", call(unix.SYS_READ, 0, 0x1000, 10), retAllow},
		{"write", call(unix.SYS_WRITE, 1, 0x1000, 10), retAllow},
		{"futex", call(unix.SYS_FUTEX, 0x1000, 128, 0), retAllow},
		{"rt_sigreturn", call(unix.SYS_RT_SIGRETURN), retAllow},
		{"execve", call(unix.SYS_EXECVE, 0x1000, 0x2000, 0x3000), retAllow},
		{"openat", call(unix.SYS_OPENAT, uint64(0xffffff9c), 0x1000, 0), retAllow},
		{"connect", call(unix.SYS_CONNECT, 3, 0x1000, 16), retAllow},
		{"pidfd_open", call(unix.SYS_PIDFD_OPEN, 100, 0), retAllow},
		{"landlock_restrict_self", call(unix.SYS_LANDLOCK_RESTRICT_SELF, 3, 0), retAllow},
		{"unknown syscall number", call(1000), retAllow},

		{"clone Go thread", call(unix.SYS_CLONE, goThread), retAllow},
		{"clone fork", call(unix.SYS_CLONE, uint64(unix.SIGCHLD)), retAllow},
		{"clone vfork+pidfd", call(unix.SYS_CLONE, unix.CLONE_VM|unix.CLONE_VFORK|unix.CLONE_PIDFD|uint64(unix.SIGCHLD)), retAllow},
		{"clone flag in high word (kernel ignores it)", call(unix.SYS_CLONE, unix.CLONE_NEWUSER<<32|uint64(unix.SIGCHLD)), retAllow},
		{"clone3", call(unix.SYS_CLONE3, 0x1000, 88), retENOSYS},
		{"clone3 no args", call(unix.SYS_CLONE3), retENOSYS},

		{"socket AF_INET stream", call(unix.SYS_SOCKET, unix.AF_INET, unix.SOCK_STREAM, 0), retAllow},
		{"socket AF_INET stream cloexec nonblock", call(unix.SYS_SOCKET, unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0), retAllow},
		{"socket AF_INET tcp", call(unix.SYS_SOCKET, unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_TCP), retAllow},
		{"socket AF_INET6 dgram", call(unix.SYS_SOCKET, unix.AF_INET6, unix.SOCK_DGRAM, 0), inet6Want},
		{"socket AF_INET6 stream cloexec", call(unix.SYS_SOCKET, unix.AF_INET6, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0), inet6Want},
		{"socket AF_NETLINK route", call(unix.SYS_SOCKET, unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE), retAllow},
		{"socket AF_NETLINK route dgram", call(unix.SYS_SOCKET, unix.AF_NETLINK, unix.SOCK_DGRAM, unix.NETLINK_ROUTE), retAllow},
		{"socket AF_NETLINK route, protocol high word (kernel reads route)", call(unix.SYS_SOCKET, unix.AF_NETLINK, unix.SOCK_RAW, hi), retAllow},
		{"socket AF_NETLINK protocol 262 (not MPTCP there)", call(unix.SYS_SOCKET, unix.AF_NETLINK, unix.SOCK_RAW, 262), retEPERM},
		{"socket AF_NETLINK audit", call(unix.SYS_SOCKET, unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_AUDIT), retEPERM},
		{"socket AF_NETLINK netfilter", call(unix.SYS_SOCKET, unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_NETFILTER), retEPERM},
		{"socket AF_NETLINK generic", call(unix.SYS_SOCKET, unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_GENERIC), retEPERM},
		{"socket AF_NETLINK uevent", call(unix.SYS_SOCKET, unix.AF_NETLINK, unix.SOCK_DGRAM, unix.NETLINK_KOBJECT_UEVENT), retEPERM},
		{"socket AF_NETLINK sock_diag", call(unix.SYS_SOCKET, unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_SOCK_DIAG), retEPERM},
		{"socket AF_UNIX stream", call(unix.SYS_SOCKET, unix.AF_UNIX, unix.SOCK_STREAM, 0), unixWant},
		{"socket AF_UNIX dgram cloexec", call(unix.SYS_SOCKET, unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0), unixWant},
		{"socket AF_UNIX with high word", call(unix.SYS_SOCKET, unix.AF_UNIX|hi, unix.SOCK_STREAM, 0), retEPERM},
		{"socket AF_INET with high word", call(unix.SYS_SOCKET, unix.AF_INET|hi, unix.SOCK_STREAM, 0), retEPERM},
		{"socket AF_PACKET", call(unix.SYS_SOCKET, unix.AF_PACKET, unix.SOCK_RAW, 0x0300), retEPERM},
		{"socket AF_PACKET with high word", call(unix.SYS_SOCKET, unix.AF_PACKET|hi, unix.SOCK_RAW, 0), retEPERM},
		{"socket AF_VSOCK", call(unix.SYS_SOCKET, unix.AF_VSOCK, unix.SOCK_STREAM, 0), retEPERM},
		{"socket AF_ALG", call(unix.SYS_SOCKET, unix.AF_ALG, unix.SOCK_SEQPACKET, 0), retEPERM},
		{"socket AF_BLUETOOTH", call(unix.SYS_SOCKET, unix.AF_BLUETOOTH, unix.SOCK_RAW, 0), retEPERM},
		{"socket AF_KEY", call(unix.SYS_SOCKET, unix.AF_KEY, unix.SOCK_RAW, 2), retEPERM},
		{"socket AF_XDP", call(unix.SYS_SOCKET, unix.AF_XDP, unix.SOCK_RAW, 0), retEPERM},
		{"socket AF_INET SOCK_PACKET", call(unix.SYS_SOCKET, unix.AF_INET, unix.SOCK_PACKET, 0x0300), retEPERM},
		{"socket AF_INET SOCK_PACKET cloexec", call(unix.SYS_SOCKET, unix.AF_INET, unix.SOCK_PACKET|unix.SOCK_CLOEXEC, 0x0300), retEPERM},
		{"socket AF_INET MPTCP", call(unix.SYS_SOCKET, unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_MPTCP), retEPERM},
		{"socket AF_INET6 MPTCP", call(unix.SYS_SOCKET, unix.AF_INET6, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_MPTCP), retEPERM},
		{"socket AF_INET MPTCP with high word", call(unix.SYS_SOCKET, unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_MPTCP|hi), retEPERM},
		{"socketpair AF_UNIX", call(unix.SYS_SOCKETPAIR, unix.AF_UNIX, unix.SOCK_STREAM, 0, 0x1000), retAllow},
		{"socketpair AF_UNIX stream cloexec nonblock", call(unix.SYS_SOCKETPAIR, unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0, 0x1000), retAllow},
		{"socketpair AF_UNIX seqpacket cloexec", call(unix.SYS_SOCKETPAIR, unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0, 0x1000), retAllow},
		{"socketpair AF_UNIX dgram", call(unix.SYS_SOCKETPAIR, unix.AF_UNIX, unix.SOCK_DGRAM, 0, 0x1000), unixWant},
		{"socketpair AF_UNIX dgram cloexec", call(unix.SYS_SOCKETPAIR, unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0, 0x1000), unixWant},
		{"socketpair AF_UNIX raw", call(unix.SYS_SOCKETPAIR, unix.AF_UNIX, unix.SOCK_RAW, 0, 0x1000), unixWant},
		{"socketpair AF_UNIX stream with type high word (kernel reads stream)", call(unix.SYS_SOCKETPAIR, unix.AF_UNIX, unix.SOCK_STREAM|hi, 0, 0x1000), retAllow},
		{"socketpair AF_UNIX with high word", call(unix.SYS_SOCKETPAIR, unix.AF_UNIX|hi, unix.SOCK_STREAM, 0), retEPERM},
		{"socketpair AF_TIPC", call(unix.SYS_SOCKETPAIR, unix.AF_TIPC, unix.SOCK_STREAM, 0), retEPERM},

		{"ioctl TCGETS", call(unix.SYS_IOCTL, 0, unix.TCGETS, 0x1000), retAllow},
		{"ioctl TIOCGWINSZ", call(unix.SYS_IOCTL, 1, unix.TIOCGWINSZ, 0x1000), retAllow},
		{"ioctl FIONREAD", call(unix.SYS_IOCTL, 3, fionread, 0x1000), retAllow},
		{"ioctl TIOCSTI", call(unix.SYS_IOCTL, 0, unix.TIOCSTI, 0x1000), retEPERM},
		{"ioctl TIOCSTI with high word", call(unix.SYS_IOCTL, 0, unix.TIOCSTI|hi, 0x1000), retEPERM},
		{"ioctl TIOCSTI with all high bits", call(unix.SYS_IOCTL, 0, unix.TIOCSTI|0xffffffff00000000, 0x1000), retEPERM},
		{"ioctl TIOCLINUX", call(unix.SYS_IOCTL, 0, unix.TIOCLINUX, 0x1000), retEPERM},
		{"ioctl TIOCLINUX with high word", call(unix.SYS_IOCTL, 0, unix.TIOCLINUX|hi, 0x1000), retEPERM},
		{"ioctl TIOCSETD", call(unix.SYS_IOCTL, 0, unix.TIOCSETD, 0x1000), retEPERM},
		{"ioctl TIOCSTI in arg 2 only", call(unix.SYS_IOCTL, 0, unix.TCGETS, unix.TIOCSTI), retAllow},

		{"openat O_RDONLY", call(unix.SYS_OPENAT, uint64(0xffffff9c), 0x1000, unix.O_RDONLY|unix.O_CLOEXEC, 0), retAllow},
		{"openat O_CREAT 0644", call(unix.SYS_OPENAT, uint64(0xffffff9c), 0x1000, unix.O_CREAT|unix.O_WRONLY|unix.O_TRUNC, 0o644), retAllow},
		{"openat O_CREAT 0777 sticky", call(unix.SYS_OPENAT, uint64(0xffffff9c), 0x1000, unix.O_CREAT|unix.O_WRONLY, 0o1777), retAllow},
		{"openat O_CREAT 04755", call(unix.SYS_OPENAT, uint64(0xffffff9c), 0x1000, unix.O_CREAT|unix.O_WRONLY, 0o4755), retEPERM},
		{"openat O_CREAT 02755", call(unix.SYS_OPENAT, uint64(0xffffff9c), 0x1000, unix.O_CREAT|unix.O_WRONLY, 0o2755), retEPERM},
		{"openat O_TMPFILE 06700", call(unix.SYS_OPENAT, 3, 0x1000, unix.O_TMPFILE|unix.O_RDWR, 0o6700), retEPERM},
		{"openat O_RDONLY 04000 (refused whatever the flags)", call(unix.SYS_OPENAT, 3, 0x1000, unix.O_RDONLY, 0o4000), retEPERM},
		{"openat O_CREAT 04755 with high word", call(unix.SYS_OPENAT, 3, 0x1000, unix.O_CREAT, 0o4755|hi), retEPERM},
		{"openat set-id bits in flags only", call(unix.SYS_OPENAT, 3, 0x1000, unix.O_CREAT|0o6000, 0o644), retAllow},
		{"openat2", call(unix.SYS_OPENAT2, 3, 0x1000, 0x2000, 24), retENOSYS},
		{"openat2 no args", call(unix.SYS_OPENAT2), retENOSYS},
		{"fchmod 0644", call(unix.SYS_FCHMOD, 3, 0o644), retAllow},
		{"fchmod 04755", call(unix.SYS_FCHMOD, 3, 0o4755), retEPERM},
		{"fchmod 02755", call(unix.SYS_FCHMOD, 3, 0o2755), retEPERM},
		{"fchmod 04755 above umode_t's 16 bits only", call(unix.SYS_FCHMOD, 3, 0o755|0x40000), retAllow},
		{"fchmodat 0755", call(unix.SYS_FCHMODAT, uint64(0xffffff9c), 0x1000, 0o755), retAllow},
		{"fchmodat 04755", call(unix.SYS_FCHMODAT, uint64(0xffffff9c), 0x1000, 0o4755), retEPERM},
		{"fchmodat 02711", call(unix.SYS_FCHMODAT, uint64(0xffffff9c), 0x1000, 0o2711), retEPERM},
		{"fchmodat2 0644", call(unix.SYS_FCHMODAT2, uint64(0xffffff9c), 0x1000, 0o644, unix.AT_SYMLINK_NOFOLLOW), retAllow},
		{"fchmodat2 04755", call(unix.SYS_FCHMODAT2, uint64(0xffffff9c), 0x1000, 0o4755, 0), retEPERM},
		{"fchmodat2 06755 nofollow", call(unix.SYS_FCHMODAT2, 3, 0x1000, 0o6755, unix.AT_SYMLINK_NOFOLLOW), retEPERM},
		{"mkdirat 0755", call(unix.SYS_MKDIRAT, 3, 0x1000, 0o755), retAllow},
		{"mkdirat 02775 (the kernel drops the bit)", call(unix.SYS_MKDIRAT, 3, 0x1000, 0o2775), retAllow},
		{"mkdirat 04755 (the kernel drops the bit)", call(unix.SYS_MKDIRAT, 3, 0x1000, 0o4755), retAllow},
		{"mknodat S_IFREG", call(unix.SYS_MKNODAT, 3, 0x1000, unix.S_IFREG|0o644, 0), retAllow},
		{"mknodat type 0", call(unix.SYS_MKNODAT, 3, 0x1000, 0o600, 0), retAllow},
		{"mknodat S_IFIFO", call(unix.SYS_MKNODAT, 3, 0x1000, unix.S_IFIFO|0o644, 0), retEPERM},
		{"mknodat S_IFSOCK", call(unix.SYS_MKNODAT, 3, 0x1000, unix.S_IFSOCK|0o755, 0), retEPERM},
		{"mknodat S_IFCHR", call(unix.SYS_MKNODAT, 3, 0x1000, unix.S_IFCHR|0o666, 0x0103), retEPERM},
		{"mknodat S_IFBLK", call(unix.SYS_MKNODAT, 3, 0x1000, unix.S_IFBLK|0o660, 0x0800), retEPERM},
		{"mknodat S_IFDIR", call(unix.SYS_MKNODAT, 3, 0x1000, unix.S_IFDIR|0o755, 0), retEPERM},
		{"mknodat S_IFREG 02644", call(unix.SYS_MKNODAT, 3, 0x1000, unix.S_IFREG|0o2644, 0), retEPERM},
		{"mknodat S_IFIFO with high word", call(unix.SYS_MKNODAT, 3, 0x1000, unix.S_IFIFO|hi, 0), retEPERM},
		{"renameat2 plain", call(unix.SYS_RENAMEAT2, 3, 0x1000, 3, 0x2000, 0), retAllow},
		{"renameat2 RENAME_NOREPLACE|RENAME_EXCHANGE", call(unix.SYS_RENAMEAT2, 3, 0x1000, 3, 0x2000, unix.RENAME_NOREPLACE), retAllow},
		{"renameat2 RENAME_EXCHANGE", call(unix.SYS_RENAMEAT2, 3, 0x1000, 3, 0x2000, unix.RENAME_EXCHANGE), retAllow},
		{"renameat2 RENAME_WHITEOUT", call(unix.SYS_RENAMEAT2, 3, 0x1000, 3, 0x2000, unix.RENAME_WHITEOUT), retEPERM},
		{"renameat2 RENAME_WHITEOUT|RENAME_NOREPLACE", call(unix.SYS_RENAMEAT2, 3, 0x1000, 3, 0x2000, unix.RENAME_WHITEOUT|unix.RENAME_NOREPLACE), retEPERM},
		{"execveat memfd AT_EMPTY_PATH", call(unix.SYS_EXECVEAT, 3, 0x1000, 0x2000, 0x3000, unix.AT_EMPTY_PATH), retAllow},
		{"memfd_create", call(unix.SYS_MEMFD_CREATE, 0x1000, unix.MFD_CLOEXEC), retAllow},
		{"inotify_init1", call(unix.SYS_INOTIFY_INIT1, unix.IN_CLOEXEC), retAllow},

		{"personality query", call(unix.SYS_PERSONALITY, 0xffffffff), retAllow},
		{"personality PER_LINUX", call(unix.SYS_PERSONALITY, 0), retAllow},
		{"personality high word only (kernel reads PER_LINUX)", call(unix.SYS_PERSONALITY, hi), retAllow},
		{"personality ADDR_NO_RANDOMIZE", call(unix.SYS_PERSONALITY, addrNoRandomize), retEPERM},
		{"personality READ_IMPLIES_EXEC", call(unix.SYS_PERSONALITY, readImpliesExec), retEPERM},
		{"personality MMAP_PAGE_ZERO", call(unix.SYS_PERSONALITY, mmapPageZero), retEPERM},

		{"foreign arch read", seccompData{nr: unix.SYS_READ, arch: foreignArch()}, retKill},
		{"foreign arch socket AF_INET", seccompData{nr: unix.SYS_SOCKET, arch: foreignArch(), args: [6]uint64{unix.AF_INET, unix.SOCK_STREAM}}, retKill},
		{"arch zero", seccompData{nr: unix.SYS_READ}, retKill},
		{"arch with high bit flipped", seccompData{nr: unix.SYS_READ, arch: nativeArch() ^ 0x80000000}, retKill},
	}
	for name, bit := range map[string]uint64{
		"CLONE_NEWUSER": unix.CLONE_NEWUSER, "CLONE_NEWNS": unix.CLONE_NEWNS, "CLONE_NEWPID": unix.CLONE_NEWPID,
		"CLONE_NEWNET": unix.CLONE_NEWNET, "CLONE_NEWIPC": unix.CLONE_NEWIPC, "CLONE_NEWUTS": unix.CLONE_NEWUTS,
		"CLONE_NEWCGROUP": unix.CLONE_NEWCGROUP, "CLONE_NEWTIME": unix.CLONE_NEWTIME,
	} {
		cases = append(cases,
			vmCase{"clone " + name, call(unix.SYS_CLONE, bit|uint64(unix.SIGCHLD)), retEPERM},
			vmCase{"clone thread+" + name, call(unix.SYS_CLONE, bit|goThread), retEPERM},
			vmCase{"clone " + name + " with high word", call(unix.SYS_CLONE, bit|0xffffffff00000000), retEPERM},
		)
	}
	for name, nr := range deniedEPERM {
		cases = append(cases,
			vmCase{name, call(nr), retEPERM},
			vmCase{name + " with args", call(nr, ^uint64(0), 1, 2, 3, 4, 5), retEPERM},
		)
	}
	cases = append(cases, archTableCases()...)
	if runtime.GOARCH == "amd64" {
		cases = append(cases,
			vmCase{"x32 read", call(0x40000000 | unix.SYS_READ), retKill},
			vmCase{"x32 socket", call(0x40000000|unix.SYS_SOCKET, unix.AF_INET, unix.SOCK_STREAM), retKill},
			vmCase{"nr -1", call(0xffffffff), retKill},
		)
	}
	slices.SortFunc(cases, func(a, b vmCase) int { return strings.Compare(a.name, b.name) })
	return cases
}

func TestProgramInVM(t *testing.T) {
	for _, opts := range []Options{{}, {AllowUnixSockets: true}, {AllowUnixSockets: true, IPv4Only: true}} {
		t.Run(fmt.Sprintf("AllowUnixSockets=%v,IPv4Only=%v", opts.AllowUnixSockets, opts.IPv4Only), func(t *testing.T) {
			vm := newVM(t, opts)
			for _, c := range tableCases(opts) {
				t.Run(c.name, func(t *testing.T) {
					if got := runVM(t, vm, c.d); got != c.want {
						t.Errorf("got %s, want %s", retName(got), retName(c.want))
					}
					// The table and the reference model must agree too.
					if ref := reference(c.d, opts); ref != c.want {
						t.Errorf("reference model says %s, table says %s", retName(ref), retName(c.want))
					}
				})
			}
		})
	}
}

// TestProgramShape checks what the kernel's seccomp verifier checks, so
// that a bad program fails here and not only in a kernel test: only
// 32-bit absolute loads inside seccomp_data on 4-byte boundaries, forward
// jumps inside the program, and a return at the end.
func TestProgramShape(t *testing.T) {
	prog, err := Build(Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(prog) == 0 || len(prog) > MaxInstructions {
		t.Fatalf("got %d instructions, want 1…%d", len(prog), MaxInstructions)
	}
	t.Logf("program: %d instructions", len(prog))
	for i, f := range prog {
		switch cls := f.Code & 0x07; cls {
		case unix.BPF_LD:
			if f.Code != unix.BPF_LD|unix.BPF_W|unix.BPF_ABS {
				t.Errorf("insn %d: load 0x%04x, want BPF_LD|BPF_W|BPF_ABS", i, f.Code)
			}
			if f.K%4 != 0 || f.K >= 64 {
				t.Errorf("insn %d: load offset %d outside seccomp_data or unaligned", i, f.K)
			}
		case unix.BPF_JMP:
			jt, jf := int(f.Jt), int(f.Jf)
			if f.Code == unix.BPF_JMP|unix.BPF_JA {
				jt, jf = int(f.K), int(f.K)
			}
			if i+1+max(jt, jf) >= len(prog) {
				t.Errorf("insn %d: jump past the end", i)
			}
		case unix.BPF_RET:
			if f.Code != unix.BPF_RET|unix.BPF_K {
				t.Errorf("insn %d: return 0x%04x, want BPF_RET|BPF_K", i, f.Code)
			}
		case unix.BPF_ALU:
			if f.Code != unix.BPF_ALU|unix.BPF_AND|unix.BPF_K {
				t.Errorf("insn %d: ALU 0x%04x, want only AND K", i, f.Code)
			}
		default:
			t.Errorf("insn %d: unexpected class 0x%02x", i, cls)
		}
	}
	if last := prog[len(prog)-1]; last.Code != unix.BPF_RET|unix.BPF_K || last.K != retAllow {
		t.Errorf("last insn: got %+v, want RET ALLOW", last)
	}
	again, err := Build(Options{})
	if err != nil || !slices.Equal(prog, again) {
		t.Errorf("Build is not deterministic (err %v)", err)
	}
}

// TestPolicyMatchesDenials keeps Policy (the documentation) and the
// independent list in this test in step.
func TestPolicyMatchesDenials(t *testing.T) {
	pol := Policy(Options{})
	eperm := map[string]bool{}
	seen := map[string]bool{}
	for _, r := range pol {
		if r.Why == "" || r.Syscall == "" {
			t.Errorf("rule without syscall or reason: %+v", r)
		}
		if r.Action == ActionErrno && r.Errno == 0 {
			t.Errorf("errno rule without errno: %v", r)
		}
		seen[r.Syscall] = true
		if r.Action == ActionErrno && r.Errno == unix.EPERM && r.When == "" {
			eperm[r.Syscall] = true
		}
	}
	for name := range deniedEPERM {
		if !eperm[name] {
			t.Errorf("Policy has no unconditional EPERM rule for %s", name)
		}
	}
	for name := range eperm {
		if _, ok := deniedEPERM[name]; !ok {
			t.Errorf("Policy denies %s, which the test's list does not know", name)
		}
	}
	for _, name := range []string{"*", "clone", "clone3", "socket", "socketpair", "ioctl", "personality",
		"openat", "openat2", "fchmod", "fchmodat", "fchmodat2", "mkdirat", "mknodat", "renameat2", "execveat", "memfd_create"} {
		if !seen[name] {
			t.Errorf("Policy has no rule for %s", name)
		}
	}
	if first := pol[0]; first.Action != ActionKillProcess {
		t.Errorf("first rule: got %v, want the arch check (kill)", first)
	}
	if last := pol[len(pol)-1]; last.Syscall != "*" || last.Action != ActionAllow {
		t.Errorf("last rule: got %v, want the default allow", last)
	}
}

// TestRulesUnique: each syscall number has one rule; a second would never
// be reached.
func TestRulesUnique(t *testing.T) {
	for _, opts := range []Options{{}, {AllowUnixSockets: true}} {
		seen := map[uint32]string{}
		for _, r := range syscallRules(opts) {
			if prev, dup := seen[r.nr]; dup {
				t.Errorf("syscall %d has two rules: %s and %s", r.nr, prev, r.name)
			}
			seen[r.nr] = r.name
		}
	}
}

func TestActionZeroValueIsStrictest(t *testing.T) {
	var a Action
	if a != ActionKillProcess {
		t.Fatalf("zero Action: got %v, want %v", a, ActionKillProcess)
	}
}

// interestingNrs are the syscall numbers the filter treats specially, plus
// a few it allows.
func interestingNrs() []uint32 {
	nrs := []uint32{unix.SYS_CLONE, unix.SYS_CLONE3, unix.SYS_SOCKET, unix.SYS_SOCKETPAIR, unix.SYS_IOCTL,
		unix.SYS_PERSONALITY, unix.SYS_READ, unix.SYS_WRITE, unix.SYS_CONNECT,
		unix.SYS_OPENAT2, unix.SYS_RENAMEAT2, unix.SYS_EXECVEAT, unix.SYS_MEMFD_CREATE, unix.SYS_MKDIRAT}
	for nr := range modeArg {
		nrs = append(nrs, nr)
	}
	for _, nr := range deniedEPERM {
		nrs = append(nrs, nr)
	}
	slices.Sort(nrs)
	return nrs
}

// FuzzFilter runs the compiled program and the reference model over
// arbitrary seccomp_data and requires them to agree; in particular a
// denied syscall number is never allowed, whatever its arguments.
func FuzzFilter(f *testing.F) {
	f.Add(uint8(0), uint32(0), uint64(unix.AF_INET), uint64(unix.SOCK_STREAM), uint64(0), uint64(0), uint64(0), uint64(0), false, false)
	f.Add(uint8(3), uint32(0), uint64(unix.AF_UNIX), uint64(0), uint64(0), uint64(0), uint64(0), uint64(0), true, false)
	f.Add(uint8(1), uint32(0), uint64(unix.CLONE_NEWUSER), uint64(0), uint64(0), uint64(0), uint64(0), uint64(0), false, false)
	f.Add(uint8(200), uint32(unix.SYS_IOCTL), uint64(0), uint64(unix.TIOCSTI|hi), uint64(0), uint64(0), uint64(0), uint64(0), false, true)
	f.Add(uint8(200), uint32(unix.SYS_SOCKETPAIR), uint64(unix.AF_UNIX), uint64(unix.SOCK_DGRAM|unix.SOCK_CLOEXEC), uint64(0), uint64(0), uint64(0), uint64(0), false, false)
	f.Add(uint8(200), uint32(unix.SYS_MKNODAT), uint64(3), uint64(0x1000), uint64(unix.S_IFIFO|0o644), uint64(0), uint64(0), uint64(0), false, false)
	f.Add(uint8(200), uint32(unix.SYS_FCHMODAT2), uint64(3), uint64(0x1000), uint64(0o4755|hi), uint64(0), uint64(0), uint64(0), true, false)
	f.Add(uint8(200), uint32(unix.SYS_OPENAT), uint64(3), uint64(0x1000), uint64(unix.O_CREAT), uint64(0o2755), uint64(0), uint64(0), false, false)
	nrs := interestingNrs()
	if si := slices.Index(nrs, unix.SYS_SOCKET); si >= 0 && si < 256 {
		f.Add(uint8(si), uint32(0x80000000), uint64(unix.AF_INET6), uint64(unix.SOCK_STREAM), uint64(0), uint64(0), uint64(0), uint64(0), true, false)
		f.Add(uint8(si), uint32(0x80000000), uint64(unix.AF_INET), uint64(unix.SOCK_DGRAM), uint64(0), uint64(0), uint64(0), uint64(0), false, false)
	}
	vms := [4]*bpf.VM{newVM(f, Options{}), newVM(f, Options{AllowUnixSockets: true}), newVM(f, Options{IPv4Only: true}), newVM(f, Options{AllowUnixSockets: true, IPv4Only: true})}
	f.Fuzz(func(t *testing.T, pick uint8, raw uint32, a0, a1, a2, a3, a4, a5 uint64, allowUnix, foreign bool) {
		d := seccompData{nr: raw, arch: nativeArch(), ip: a5 ^ a0, args: [6]uint64{a0, a1, a2, a3, a4, a5}}
		if int(pick) < len(nrs) {
			d.nr = nrs[pick]
		}
		if foreign {
			d.arch = raw ^ uint32(a1>>17) // rarely the native arch; the reference handles that
		}
		// IPv4Only from a bit of the syscall number's word, so that the
		// corpus keeps its shape.
		opts := Options{AllowUnixSockets: allowUnix, IPv4Only: raw&0x80000000 != 0}
		vi := 0
		if allowUnix {
			vi = 1
		}
		if opts.IPv4Only {
			vi += 2
		}
		vm := vms[vi]
		got := runVM(t, vm, d)
		if want := reference(d, opts); got != want {
			t.Fatalf("nr %d arch 0x%x args %#x: got %s, want %s", d.nr, d.arch, d.args, retName(got), retName(want))
		}
		if d.arch == nativeArch() {
			for _, nr := range deniedEPERM {
				if d.nr == nr && got == retAllow {
					t.Fatalf("denied syscall %d allowed with args %#x", nr, d.args)
				}
			}
		}
	})
}

func BenchmarkBuild(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Build(Options{}); err != nil {
			b.Fatal(err)
		}
	}
}
