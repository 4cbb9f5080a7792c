//go:build amd64 || arm64

package seccomp

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"testing"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// seccompData is struct seccomp_data.
type seccompData struct {
	nr   uint32
	arch uint32
	ip   uint64
	args [6]uint64
}

// bytes lays d out as the kernel does (native byte order), then re-encodes
// every 32-bit word big-endian: the kernel's BPF_LD|BPF_W|BPF_ABS reads a
// native-endian word of seccomp_data, while x/net/bpf's VM reads network
// order. The result is that the VM sees, at every offset, the word the
// kernel would see, so the low/high halves of each argument are tested at
// their real places.
func (d seccompData) bytes() []byte {
	b := make([]byte, 64)
	ne := binary.NativeEndian
	ne.PutUint32(b[0:], d.nr)
	ne.PutUint32(b[4:], d.arch)
	ne.PutUint64(b[8:], d.ip)
	for i, a := range d.args {
		ne.PutUint64(b[16+8*i:], a)
	}
	for i := 0; i < len(b); i += 4 {
		binary.BigEndian.PutUint32(b[i:], ne.Uint32(b[i:]))
	}
	return b
}

func nativeArch() uint32 {
	switch runtime.GOARCH {
	case "amd64":
		return unix.AUDIT_ARCH_X86_64
	case "arm64":
		return unix.AUDIT_ARCH_AARCH64
	}
	panic("BUG: test built for " + runtime.GOARCH)
}

// foreignArch is an architecture whose syscalls can reach this kernel.
func foreignArch() uint32 {
	if runtime.GOARCH == "amd64" {
		return unix.AUDIT_ARCH_I386
	}
	return unix.AUDIT_ARCH_ARM
}

// deniedEPERM is what the brief and DESIGN.md demand, written out again
// here, independently of rules_linux.go.
var deniedEPERM = map[string]uint32{
	"io_uring_setup": unix.SYS_IO_URING_SETUP, "io_uring_enter": unix.SYS_IO_URING_ENTER,
	"io_uring_register": unix.SYS_IO_URING_REGISTER, "ptrace": unix.SYS_PTRACE,
	"process_vm_readv": unix.SYS_PROCESS_VM_READV, "process_vm_writev": unix.SYS_PROCESS_VM_WRITEV,
	"mount": unix.SYS_MOUNT, "umount2": unix.SYS_UMOUNT2, "pivot_root": unix.SYS_PIVOT_ROOT,
	"chroot": unix.SYS_CHROOT, "unshare": unix.SYS_UNSHARE, "setns": unix.SYS_SETNS,
	"open_tree": unix.SYS_OPEN_TREE, "open_tree_attr": unix.SYS_OPEN_TREE_ATTR,
	"move_mount": unix.SYS_MOVE_MOUNT, "fsopen": unix.SYS_FSOPEN, "fsconfig": unix.SYS_FSCONFIG,
	"fsmount": unix.SYS_FSMOUNT, "fspick": unix.SYS_FSPICK, "mount_setattr": unix.SYS_MOUNT_SETATTR,
	"keyctl": unix.SYS_KEYCTL, "add_key": unix.SYS_ADD_KEY, "request_key": unix.SYS_REQUEST_KEY,
	"bpf": unix.SYS_BPF, "perf_event_open": unix.SYS_PERF_EVENT_OPEN, "userfaultfd": unix.SYS_USERFAULTFD,
	"open_by_handle_at": unix.SYS_OPEN_BY_HANDLE_AT, "name_to_handle_at": unix.SYS_NAME_TO_HANDLE_AT,
	"kexec_load": unix.SYS_KEXEC_LOAD, "kexec_file_load": unix.SYS_KEXEC_FILE_LOAD,
	"init_module": unix.SYS_INIT_MODULE, "finit_module": unix.SYS_FINIT_MODULE,
	"delete_module": unix.SYS_DELETE_MODULE,
	// Decided in this package (see rules_linux.go for why).
	"acct": unix.SYS_ACCT, "swapon": unix.SYS_SWAPON, "swapoff": unix.SYS_SWAPOFF,
	"reboot": unix.SYS_REBOOT, "syslog": unix.SYS_SYSLOG, "settimeofday": unix.SYS_SETTIMEOFDAY,
	"clock_settime": unix.SYS_CLOCK_SETTIME, "clock_adjtime": unix.SYS_CLOCK_ADJTIME,
	"adjtimex": unix.SYS_ADJTIMEX, "quotactl": unix.SYS_QUOTACTL, "quotactl_fd": unix.SYS_QUOTACTL_FD,
	"lookup_dcookie": unix.SYS_LOOKUP_DCOOKIE, "vmsplice": unix.SYS_VMSPLICE,
	"pidfd_getfd": unix.SYS_PIDFD_GETFD, "kcmp": unix.SYS_KCMP, "process_madvise": unix.SYS_PROCESS_MADVISE,
	// Issue 11: kernel counters charged to the host, host-wide effects,
	// host paths.
	"fanotify_init": unix.SYS_FANOTIFY_INIT, "memfd_secret": unix.SYS_MEMFD_SECRET,
	"listmount": unix.SYS_LISTMOUNT, "statmount": unix.SYS_STATMOUNT,
}

// modeArg maps the syscalls whose mode argument may never carry S_ISUID
// or S_ISGID (issue 11) to that argument's index (mkdir is not one: the
// kernel drops those bits from its mode); mknodArg those whose
// mode also carries a file type, of which only regular files may be made.
// The arch test files add the syscalls only their architecture has.
var (
	modeArg = map[uint32]int{
		unix.SYS_OPENAT: 3, unix.SYS_FCHMOD: 1, unix.SYS_FCHMODAT: 2, unix.SYS_FCHMODAT2: 2,
		unix.SYS_MKNODAT: 2,
	}
	mknodArg = map[uint32]int{unix.SYS_MKNODAT: 2}
)

func init() {
	for k, v := range archDeniedEPERM {
		deniedEPERM[k] = v
	}
	for k, v := range archModeArg {
		modeArg[k] = v
	}
	for k, v := range archMknodArg {
		mknodArg[k] = v
	}
}

const (
	retAllow  = unix.SECCOMP_RET_ALLOW
	retKill   = unix.SECCOMP_RET_KILL_PROCESS
	retEPERM  = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	retENOSYS = unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)
)

func retName(r uint32) string {
	switch r {
	case retAllow:
		return "ALLOW"
	case retKill:
		return "KILL_PROCESS"
	case retEPERM:
		return "ERRNO(EPERM)"
	case retENOSYS:
		return "ERRNO(ENOSYS)"
	}
	return fmt.Sprintf("0x%08x", r)
}

// reference is the intended policy as plain Go, written from the brief
// rather than from the rule table, so that the compiled program is checked
// against an independent statement of what it must do.
func reference(d seccompData, opts Options) uint32 {
	if d.arch != nativeArch() {
		return retKill
	}
	if runtime.GOARCH == "amd64" && d.nr&0x40000000 != 0 {
		return retKill
	}
	lo := func(i int) uint32 { return uint32(d.args[i]) }
	if i, ok := modeArg[d.nr]; ok {
		mode := uint16(d.args[i]) // the kernel's umode_t
		if mode&0o6000 != 0 {
			return retEPERM
		}
		if _, ok := mknodArg[d.nr]; ok {
			if t := mode & 0o170000; t != 0 && t != unix.S_IFREG {
				return retEPERM
			}
		}
		return retAllow
	}
	switch d.nr {
	case unix.SYS_CLONE3, unix.SYS_OPENAT2:
		return retENOSYS
	case unix.SYS_RENAMEAT2:
		if lo(4)&unix.RENAME_WHITEOUT != 0 {
			return retEPERM
		}
		return retAllow
	case unix.SYS_CLONE:
		const newFlags = unix.CLONE_NEWUSER | unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWNET |
			unix.CLONE_NEWIPC | unix.CLONE_NEWUTS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWTIME
		if lo(0)&newFlags != 0 {
			return retEPERM
		}
		return retAllow
	case unix.SYS_SOCKET:
		if lo(1)&0xf == unix.SOCK_PACKET {
			return retEPERM
		}
		switch d.args[0] {
		case unix.AF_INET, unix.AF_INET6:
			if opts.IPv4Only && d.args[0] == unix.AF_INET6 {
				return retEPERM
			}
			if lo(2) == unix.IPPROTO_MPTCP {
				return retEPERM
			}
			return retAllow
		case unix.AF_NETLINK:
			if int32(lo(2)) == unix.NETLINK_ROUTE {
				return retAllow
			}
		case unix.AF_UNIX:
			if opts.AllowUnixSockets {
				return retAllow
			}
		}
		return retEPERM
	case unix.SYS_SOCKETPAIR:
		if d.args[0] != unix.AF_UNIX {
			return retEPERM
		}
		if opts.AllowUnixSockets {
			return retAllow
		}
		// The kernel's socket type is the low 4 bits (SOCK_TYPE_MASK); any
		// other bit but SOCK_NONBLOCK and SOCK_CLOEXEC is EINVAL anyway.
		switch lo(1) & 0xf {
		case unix.SOCK_STREAM, unix.SOCK_SEQPACKET:
			return retAllow
		}
		return retEPERM
	case unix.SYS_IOCTL:
		switch lo(1) {
		case unix.TIOCSTI, unix.TIOCLINUX, unix.TIOCSETD:
			return retEPERM
		}
		return retAllow
	case unix.SYS_PERSONALITY:
		if lo(0) == 0 || lo(0) == 0xffffffff {
			return retAllow
		}
		return retEPERM
	}
	for _, nr := range deniedEPERM {
		if d.nr == nr {
			return retEPERM
		}
	}
	return retAllow
}

func newVM(t testing.TB, opts Options) *bpf.VM {
	t.Helper()
	prog, err := Build(opts)
	if err != nil {
		t.Fatalf("Build(%+v): %v", opts, err)
	}
	raw := make([]bpf.RawInstruction, len(prog))
	for i, f := range prog {
		raw[i] = bpf.RawInstruction{Op: f.Code, Jt: f.Jt, Jf: f.Jf, K: f.K}
	}
	insns, ok := bpf.Disassemble(raw)
	if !ok {
		t.Fatalf("Build(%+v): program does not disassemble", opts)
	}
	vm, err := bpf.NewVM(insns)
	if err != nil {
		t.Fatalf("bpf.NewVM: %v", err)
	}
	return vm
}

func runVM(t testing.TB, vm *bpf.VM, d seccompData) uint32 {
	t.Helper()
	r, err := vm.Run(d.bytes())
	if err != nil {
		t.Fatalf("vm.Run(%+v): %v", d, err)
	}
	return uint32(r)
}

func call(nr uint32, args ...uint64) seccompData {
	d := seccompData{nr: nr, arch: nativeArch(), ip: 0x7f0000001000}
	copy(d.args[:], args)
	return d
}
