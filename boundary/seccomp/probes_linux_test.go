//go:build amd64 || arm64

package seccomp

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// socketProbe calls socket(2) with full 64-bit arguments and closes the
// result.
func socketProbe(domain, typ, proto uint64) func(*childState) error {
	return func(*childState) error {
		fd, _, e := unix.Syscall(unix.SYS_SOCKET, uintptr(domain), uintptr(typ), uintptr(proto))
		if e != 0 {
			return e
		}
		return unix.Close(int(fd))
	}
}

func socketpairProbe(domain uint64) func(*childState) error {
	return func(*childState) error {
		var fds [2]int32
		_, _, e := unix.Syscall6(unix.SYS_SOCKETPAIR, uintptr(domain), unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0, uintptr(unsafe.Pointer(&fds)), 0, 0)
		if e != 0 {
			return e
		}
		unix.Close(int(fds[0]))
		return unix.Close(int(fds[1]))
	}
}

func run(cloneflags uintptr, name string, args ...string) func(*childState) error {
	return func(*childState) error {
		cmd := exec.Command(name, args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: cloneflags}
		return cmd.Run()
	}
}

func output(want string, name string, args ...string) func(*childState) error {
	return func(*childState) error {
		out, err := exec.Command(name, args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%w (output %q)", err, out)
		}
		if string(out) != want {
			return fmt.Errorf("output %q, want %q", out, want)
		}
		return nil
	}
}

func ioctlProbe(cmd uint64, arg func() uintptr) func(*childState) error {
	return func(st *childState) error {
		_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(st.tty), uintptr(cmd), arg())
		return errnoErr(e)
	}
}

var (
	stiByte  = byte('\n')
	ldiscTTY = int32(0) // N_TTY
)

const inheritScript = "echo hi | tr h H"

var childCases = []childCase{
	{
		name: "sockets", userns: true,
		probes: []probe{
			{"socket(AF_INET, SOCK_STREAM)", resOK, resOK, socketProbe(unix.AF_INET, unix.SOCK_STREAM, 0)},
			{"socket(AF_INET, SOCK_DGRAM)", resOK, resOK, socketProbe(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)},
			{"socket(AF_INET6, SOCK_STREAM)", anyRes, samePre, socketProbe(unix.AF_INET6, unix.SOCK_STREAM, 0)},
			{"socket(AF_NETLINK, NETLINK_ROUTE)", resOK, resOK, socketProbe(unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_ROUTE)},
			{"net.Interfaces (getifaddrs over netlink)", resOK, resOK, func(*childState) error { _, err := net.Interfaces(); return err }},
			{"socketpair(AF_UNIX)", resOK, resOK, socketpairProbe(unix.AF_UNIX)},
			{"socket(AF_UNIX)", resOK, "EPERM", socketProbe(unix.AF_UNIX, unix.SOCK_STREAM, 0)},
			{"socket(AF_UNIX, SOCK_DGRAM)", resOK, "EPERM", socketProbe(unix.AF_UNIX, unix.SOCK_DGRAM, 0)},
			{"socket(AF_INET with a high word)", resOK, "EPERM", socketProbe(unix.AF_INET|1<<32, unix.SOCK_STREAM, 0)},
			{"socket(AF_PACKET)", resOK, "EPERM", socketProbe(unix.AF_PACKET, unix.SOCK_RAW, 0x0300)},
			{"socket(AF_INET, SOCK_PACKET)", resOK, "EPERM", socketProbe(unix.AF_INET, unix.SOCK_PACKET, 0x0300)},
			{"socket(AF_VSOCK)", resOK, "EPERM", socketProbe(unix.AF_VSOCK, unix.SOCK_STREAM, 0)},
			{"socket(AF_INET, IPPROTO_MPTCP)", resOK, "EPERM", socketProbe(unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_MPTCP)},
			{"socket(AF_INET6, IPPROTO_MPTCP)", anyRes, "EPERM", socketProbe(unix.AF_INET6, unix.SOCK_STREAM, unix.IPPROTO_MPTCP)},
			{"socket(AF_ALG)", anyRes, "EPERM", socketProbe(unix.AF_ALG, unix.SOCK_SEQPACKET, 0)},
			{"socketpair(AF_INET)", anyRes, "EPERM", socketpairProbe(unix.AF_INET)},
		},
	},
	{
		name: "sockets-unix-allowed", userns: true, opts: Options{AllowUnixSockets: true},
		probes: []probe{
			{"socket(AF_UNIX)", resOK, resOK, socketProbe(unix.AF_UNIX, unix.SOCK_STREAM, 0)},
			{"socketpair(AF_UNIX)", resOK, resOK, socketpairProbe(unix.AF_UNIX)},
			{"socket(AF_INET)", resOK, resOK, socketProbe(unix.AF_INET, unix.SOCK_STREAM, 0)},
			{"socket(AF_PACKET)", resOK, "EPERM", socketProbe(unix.AF_PACKET, unix.SOCK_RAW, 0x0300)},
			{"socket(AF_INET, IPPROTO_MPTCP)", resOK, "EPERM", socketProbe(unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_MPTCP)},
		},
	},
	{
		name: "namespaces", userns: true,
		setup: func(st *childState) error {
			for _, d := range []string{"a", "b"} {
				if err := os.Mkdir(filepath.Join(st.dir, d), 0o700); err != nil {
					return err
				}
			}
			// b stays mounted, so that umount2 can be tried with the filter.
			return unix.Mount("moat", filepath.Join(st.dir, "b"), "tmpfs", 0, "size=64k")
		},
		probes: []probe{
			{"fork+exec true", resOK, resOK, run(0, "true")},
			{"clone(CLONE_NEWUSER)+exec true (unshare -U)", resOK, "EPERM", run(syscall.CLONE_NEWUSER, "true")},
			{"clone(CLONE_NEWNET)+exec true", resOK, "EPERM", run(syscall.CLONE_NEWNET, "true")},
			// A multi-threaded process cannot unshare a user namespace
			// (EINVAL), so only the result with the filter is asserted.
			{"unshare(CLONE_NEWUSER)", anyRes, "EPERM", func(*childState) error { return unix.Unshare(unix.CLONE_NEWUSER) }},
			{"unshare(CLONE_NEWNET)", resOK, "EPERM", func(*childState) error { return unix.Unshare(unix.CLONE_NEWNET) }},
			{"setns(net)", resOK, "EPERM", func(*childState) error {
				fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
				if err != nil {
					return fmt.Errorf("open: %v", err)
				}
				defer unix.Close(fd)
				return unix.Setns(fd, unix.CLONE_NEWNET)
			}},
			{"mount(tmpfs)", resOK, "EPERM", func(st *childState) error {
				dir := filepath.Join(st.dir, "a")
				if err := unix.Mount("moat", dir, "tmpfs", 0, "size=64k"); err != nil {
					return err
				}
				return unix.Unmount(dir, 0)
			}},
			{"umount2", notRun, "EPERM", func(st *childState) error { return unix.Unmount(filepath.Join(st.dir, "b"), unix.MNT_DETACH) }},
			{"fsopen(tmpfs)", resOK, "EPERM", func(*childState) error {
				fd, err := unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC)
				if err == nil {
					unix.Close(fd)
				}
				return err
			}},
			{"open_tree(OPEN_TREE_CLONE)", resOK, "EPERM", func(st *childState) error {
				fd, err := unix.OpenTree(unix.AT_FDCWD, st.dir, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
				if err == nil {
					unix.Close(fd)
				}
				return err
			}},
			{"chroot(/)", resOK, "EPERM", func(*childState) error { return unix.Chroot("/") }},
			// clone3 with a zero size is refused by the kernel before it
			// looks at anything (EINVAL); with the filter it is ENOSYS.
			{"clone3(NULL, 0)", "EINVAL", "ENOSYS", func(*childState) error {
				_, _, e := unix.Syscall(unix.SYS_CLONE3, 0, 0, 0)
				return errnoErr(e)
			}},
		},
	},
	{
		name: "kernel-interfaces", userns: true,
		probes: []probe{
			{"io_uring_setup", resOK, "EPERM", func(*childState) error {
				var params [120]byte // struct io_uring_params
				fd, _, e := unix.Syscall(unix.SYS_IO_URING_SETUP, 1, uintptr(unsafe.Pointer(&params)), 0)
				if e != 0 {
					return e
				}
				return unix.Close(int(fd))
			}},
			{"keyctl(KEYCTL_GET_KEYRING_ID)", resOK, "EPERM", func(*childState) error {
				_, err := unix.KeyctlInt(unix.KEYCTL_GET_KEYRING_ID, unix.KEY_SPEC_PROCESS_KEYRING, 1, 0, 0)
				return err
			}},
			{"add_key(user)", resOK, "EPERM", func(*childState) error {
				_, err := unix.AddKey("user", "moat-seccomp-test", []byte("x"), unix.KEY_SPEC_PROCESS_KEYRING)
				return err
			}},
			{"userfaultfd(UFFD_USER_MODE_ONLY)", resOK, "EPERM", func(*childState) error {
				const uffdUserModeOnly = 1
				fd, _, e := unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|uffdUserModeOnly, 0, 0)
				if e != 0 {
					return e
				}
				return unix.Close(int(fd))
			}},
			{"perf_event_open(task clock, user only)", anyRes, "EPERM", func(*childState) error {
				attr := unix.PerfEventAttr{Type: unix.PERF_TYPE_SOFTWARE, Config: unix.PERF_COUNT_SW_TASK_CLOCK,
					Bits: unix.PerfBitExcludeKernel | unix.PerfBitExcludeHv | unix.PerfBitDisabled}
				attr.Size = uint32(unsafe.Sizeof(attr))
				fd, err := unix.PerfEventOpen(&attr, 0, -1, -1, unix.PERF_FLAG_FD_CLOEXEC)
				if err == nil {
					unix.Close(fd)
				}
				return err
			}},
			{"bpf", anyRes, "EPERM", func(*childState) error {
				_, _, e := unix.Syscall(unix.SYS_BPF, unix.BPF_PROG_LOAD, 0, 0)
				return errnoErr(e)
			}},
			{"process_vm_readv(self)", resOK, "EPERM", func(*childState) error {
				src, dst := []byte("moat"), make([]byte, 4)
				_, err := unix.ProcessVMReadv(os.Getpid(),
					[]unix.Iovec{{Base: &dst[0], Len: 4}},
					[]unix.RemoteIovec{{Base: uintptr(unsafe.Pointer(&src[0])), Len: 4}}, 0)
				return err
			}},
			{"vmsplice", resOK, "EPERM", func(*childState) error {
				var p [2]int
				if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
					return fmt.Errorf("pipe: %v", err)
				}
				defer unix.Close(p[0])
				defer unix.Close(p[1])
				b := []byte("x")
				_, err := unix.Vmsplice(p[1], []unix.Iovec{{Base: &b[0], Len: 1}}, 0)
				return err
			}},
			{"personality(ADDR_NO_RANDOMIZE)", resOK, "EPERM", func(*childState) error {
				const addrNoRandomize = 0x0040000
				if _, _, e := unix.Syscall(unix.SYS_PERSONALITY, addrNoRandomize, 0, 0); e != 0 {
					return e
				}
				_, _, e := unix.Syscall(unix.SYS_PERSONALITY, 0, 0, 0)
				return errnoErr(e)
			}},
			{"personality(query)", resOK, resOK, func(*childState) error {
				_, _, e := unix.Syscall(unix.SYS_PERSONALITY, 0xffffffff, 0, 0)
				return errnoErr(e)
			}},
			{"name_to_handle_at", anyRes, "EPERM", func(st *childState) error {
				_, _, err := unix.NameToHandleAt(unix.AT_FDCWD, st.dir, 0)
				return err
			}},
		},
	},
	{
		// No user namespace here: ptrace from a child user namespace into
		// its parent's is refused by the kernel anyway.
		name: "ptrace", sibling: true,
		probes: []probe{
			{"kill(sibling, 0)", resOK, resOK, func(st *childState) error { return unix.Kill(st.sibling, 0) }},
			{"ptrace(PTRACE_ATTACH, sibling)", resOK, "EPERM", func(st *childState) error {
				if err := unix.PtraceAttach(st.sibling); err != nil {
					return err
				}
				var ws unix.WaitStatus
				if _, err := unix.Wait4(st.sibling, &ws, unix.WALL, nil); err != nil {
					return fmt.Errorf("wait4: %v", err)
				}
				return unix.PtraceDetach(st.sibling)
			}},
		},
	},
	{
		name: "tty", setsid: true,
		setup: func(st *childState) error {
			ptmx, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("open /dev/ptmx: %w", err)
			}
			if err := unix.IoctlSetPointerInt(ptmx, unix.TIOCSPTLCK, 0); err != nil {
				return fmt.Errorf("unlockpt: %w", err)
			}
			fd, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(ptmx), unix.TIOCGPTPEER, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC)
			if e != 0 {
				return fmt.Errorf("TIOCGPTPEER: %w", e)
			}
			st.tty = int(fd)
			// TIOCSTI works only on one's controlling terminal.
			if _, _, e := unix.Syscall(unix.SYS_IOCTL, fd, unix.TIOCSCTTY, 0); e != 0 {
				return fmt.Errorf("TIOCSCTTY: %w", e)
			}
			return nil
		},
		probes: []probe{
			{"ioctl(TCGETS)", resOK, resOK, func(st *childState) error { _, err := unix.IoctlGetTermios(st.tty, unix.TCGETS); return err }},
			{"ioctl(TIOCGWINSZ)", resOK, resOK, func(st *childState) error { _, err := unix.IoctlGetWinsize(st.tty, unix.TIOCGWINSZ); return err }},
			{"ioctl(TIOCSTI)", resOK, "EPERM", ioctlProbe(unix.TIOCSTI, func() uintptr { return uintptr(unsafe.Pointer(&stiByte)) })},
			{"ioctl(TIOCSTI with a high word)", resOK, "EPERM", ioctlProbe(unix.TIOCSTI|1<<32, func() uintptr { return uintptr(unsafe.Pointer(&stiByte)) })},
			{"ioctl(TIOCSETD, N_TTY)", resOK, "EPERM", ioctlProbe(unix.TIOCSETD, func() uintptr { return uintptr(unsafe.Pointer(&ldiscTTY)) })},
			{"ioctl(TIOCLINUX)", anyRes, "EPERM", ioctlProbe(unix.TIOCLINUX, func() uintptr { return uintptr(unsafe.Pointer(&stiByte)) })},
		},
	},
	{
		name: "programs-still-work", userns: true,
		probes: []probe{
			{"fork+exec true", notRun, resOK, run(0, "true")},
			{"sh pipeline", notRun, resOK, output("Hi\n", "sh", "-c", inheritScript)},
			{"Go program under the inherited filter", notRun, resOK, func(st *childState) error {
				exe, err := os.Executable()
				if err != nil {
					return err
				}
				cmd := exec.Command(exe, caseHelper, caseInherit)
				out, err := cmd.CombinedOutput()
				if err != nil || string(out) != "ok\n" {
					return fmt.Errorf("child: %v: %s", err, out)
				}
				return nil
			}},
		},
	},
	{
		name: "python", userns: true,
		need: func() (bool, string) {
			_, err := os.Stat("/usr/bin/python3")
			return err == nil, "/usr/bin/python3 for the Python compatibility check"
		},
		probes: []probe{
			{"python3 sockets, threads, subprocess", notRun, resOK, output("ok\n", "/usr/bin/python3", "-c", `
import socket, subprocess, threading
socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()
a, b = socket.socketpair(); a.close(); b.close()
try:
    socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    print("AF_UNIX allowed")
except PermissionError:
    pass
t = threading.Thread(target=lambda: None); t.start(); t.join()
assert subprocess.run(["true"]).returncode == 0
print("ok")
`)},
		},
	},
}

// inheritMain runs in a program that a filtered child started: it checks
// that the filter and no_new_privs were inherited across fork and execve,
// and that Go's runtime (threads, signals, netpoll) works under them.
func inheritMain() int {
	var problems []string
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		problems = append(problems, err.Error())
	}
	for _, want := range []string{"Seccomp:\t2\n", "NoNewPrivs:\t1\n"} {
		if !bytes.Contains(status, []byte(want)) {
			problems = append(problems, fmt.Sprintf("/proc/self/status lacks %q", want))
		}
	}
	// Park goroutines on their own threads so that the runtime has to
	// clone new ones.
	release := make(chan struct{})
	started := make(chan struct{})
	const parked = 4
	for range parked {
		go func() {
			runtime.LockOSThread()
			started <- struct{}{}
			<-release
		}()
	}
	for range parked {
		<-started
	}
	time.Sleep(10 * time.Millisecond)
	close(release)
	if err := socketProbe(unix.AF_UNIX, unix.SOCK_STREAM, 0)(nil); !errors.Is(err, unix.EPERM) {
		problems = append(problems, fmt.Sprintf("socket(AF_UNIX): got %v, want EPERM", err))
	}
	if err := socketProbe(unix.AF_INET, unix.SOCK_STREAM, 0)(nil); err != nil {
		problems = append(problems, fmt.Sprintf("socket(AF_INET): %v", err))
	}
	if err := run(0, "true")(nil); err != nil {
		problems = append(problems, fmt.Sprintf("exec true: %v", err))
	}
	if len(problems) > 0 {
		fmt.Println(strings.Join(problems, "; "))
		return 1
	}
	fmt.Println("ok")
	return 0
}
