package probekit

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// addOSActions adds the actions that are Linux system calls.
func addOSActions(m map[string]Action) {
	m["unshare-user"] = func(string) (string, error) {
		// A new process in a new user namespace (clone with
		// CLONE_NEWUSER, as `unshare -U` does). unshare(2) itself cannot
		// serve here: a multi-threaded Go process always gets EINVAL.
		exe, err := os.Executable()
		if err != nil {
			return "", err
		}
		cmd := exec.Command(exe, EUIDHelper)
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER}
		return euid(cmd)
	}
	m["ids"] = func(string) (string, error) {
		return fmt.Sprintf("uid=%d euid=%d gid=%d egid=%d", os.Getuid(), os.Geteuid(), os.Getgid(), os.Getegid()), nil
	}
	m["caps"] = caps
	m["plant"] = func(arg string) (string, error) {
		// plant=DIR>TARGET: rename DIR aside and put a symlink to TARGET
		// in its place (the attack on a nested grant's parent).
		dir, target, ok := strings.Cut(arg, ">")
		if !ok || dir == "" || target == "" {
			return "", fmt.Errorf("plant wants DIR>TARGET, got %q", arg)
		}
		if err := os.Rename(dir, dir+".old"); err != nil {
			return "", err
		}
		return "", os.Symlink(target, dir)
	}
	m["chmod"] = func(arg string) (string, error) {
		// chmod=PATH:MODE (octal), on a file the probe creates.
		path, ms, _ := strings.Cut(arg, ":")
		mode, err := strconv.ParseUint(ms, 8, 32)
		if err != nil || mode > 0o7777 {
			return "", fmt.Errorf("chmod wants PATH:MODE in octal, got %q", arg)
		}
		return ChmodNew(path, uint32(mode))
	}
	m["setid"] = SetID
	m["dgram"] = func(path string) (string, error) {
		// Every way in turn until one delivers; the detail names it.
		var errs []error
		for _, how := range DatagramWays {
			err := SendDatagram(how, path, []byte(Payload))
			if err == nil {
				return "sent by " + how, nil
			}
			errs = append(errs, fmt.Errorf("%s: %w", how, err))
		}
		return "", errors.Join(errs...)
	}
	m["fifo"] = func(path string) (string, error) { return "", unix.Mknod(path, unix.S_IFIFO|0o666, 0) }
	m["io_uring"] = func(string) (string, error) {
		var params [120]byte
		fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, 4, uintptr(unsafe.Pointer(&params[0])), 0)
		if errno != 0 {
			return "", errno
		}
		unix.Close(int(fd))
		return "", nil
	}
	m["keyctl"] = func(string) (string, error) {
		_, err := unix.KeyctlJoinSessionKeyring("moat-probe")
		return "", err
	}
	m["ptrace"] = func(arg string) (string, error) {
		pid, err := strconv.Atoi(arg)
		if err != nil {
			return "", fmt.Errorf("ptrace wants a pid, got %q", arg)
		}
		return "", ptrace(pid)
	}
	m["ptrace-child"] = func(string) (string, error) {
		// A sibling process at the same uid: only the seccomp filter
		// stands between the workload and ptrace here.
		p, err := os.StartProcess("/bin/sleep", []string{"sleep", "5"}, &os.ProcAttr{Files: []*os.File{nil, nil, nil}})
		if err != nil {
			return "", fmt.Errorf("control: cannot start a child: %v", err)
		}
		defer func() { p.Kill(); p.Wait() }()
		return "", ptrace(p.Pid)
	}
	m["socket"] = func(arg string) (string, error) {
		// socket=FAMILY,TYPE,PROTO, each a name or a number.
		f := strings.Split(arg, ",")
		if len(f) != 3 {
			return "", fmt.Errorf("socket wants FAMILY,TYPE,PROTO, got %q", arg)
		}
		var n [3]int
		for i, s := range f {
			v, err := sockConst(s)
			if err != nil {
				return "", err
			}
			n[i] = v
		}
		fd, err := unix.Socket(n[0], n[1], n[2])
		if err == nil {
			unix.Close(fd)
		}
		return "", err
	}
	m["kill0"] = func(arg string) (string, error) {
		pid, err := strconv.Atoi(arg)
		if err != nil {
			return "", fmt.Errorf("kill0 wants a pid, got %q", arg)
		}
		return "", unix.Kill(pid, 0)
	}
	m["fds"] = func(string) (string, error) { return listDir("/proc/self/fd", false) }
	m["pids"] = func(string) (string, error) { return listDir("/proc", true) }
}

func ptrace(pid int) error {
	err := unix.PtraceAttach(pid)
	if err == nil {
		unix.PtraceDetach(pid)
	}
	return err
}

// caps reports the capability sets: effective, permitted and inheritable
// as hexadecimal masks, and how many ambient capabilities are raised.
func caps(string) (string, error) {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return "", err
	}
	eff := uint64(data[1].Effective)<<32 | uint64(data[0].Effective)
	prm := uint64(data[1].Permitted)<<32 | uint64(data[0].Permitted)
	inh := uint64(data[1].Inheritable)<<32 | uint64(data[0].Inheritable)
	amb := 0
	for c := 0; c <= unix.CAP_LAST_CAP; c++ {
		if v, _ := unix.PrctlRetInt(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_IS_SET, uintptr(c), 0, 0); v == 1 {
			amb++
		}
	}
	return fmt.Sprintf("eff=%x prm=%x inh=%x amb=%d", eff, prm, inh, amb), nil
}

// listDir lists dir's entries (only the numeric ones with numeric),
// separated by spaces.
func listDir(dir string, numeric bool) (string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return "", err
	}
	var names []string
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err == nil || !numeric {
			names = append(names, e.Name())
		}
	}
	return strings.Join(names, " "), nil
}

var sockConsts = map[string]int{
	"inet": unix.AF_INET, "inet6": unix.AF_INET6, "unix": unix.AF_UNIX, "packet": unix.AF_PACKET,
	"vsock": unix.AF_VSOCK, "netlink": unix.AF_NETLINK,
	"stream": unix.SOCK_STREAM, "dgram": unix.SOCK_DGRAM, "raw": unix.SOCK_RAW,
	"mptcp": unix.IPPROTO_MPTCP,
}

func sockConst(s string) (int, error) {
	if v, ok := sockConsts[s]; ok {
		return v, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("socket: %q is neither a known name nor a number", s)
	}
	return n, nil
}

// DatagramWays are the ways SendDatagram delivers a datagram to a
// pathname socket: from a datagram socketpair (which needs no socket(2)),
// with and without flags, by sendto, connect+write, sendmsg and after
// bind; and from socket(2).
var DatagramWays = []string{
	"socketpair-sendto", "socketpair-nonblock-sendto", "socketpair-connect-write",
	"socketpair-sendmsg", "socketpair-bind-sendto", "socket-sendto", "socket-connect-write",
}

// SendDatagram sends msg to the datagram socket at addr the way how (one
// of DatagramWays) says.
func SendDatagram(how, addr string, msg []byte) error {
	if addr == "" {
		return errors.New("no address given")
	}
	to := &unix.SockaddrUnix{Name: addr}
	var fd int
	if src, ok := strings.CutPrefix(how, "socketpair-"); ok {
		typ := unix.SOCK_DGRAM | unix.SOCK_CLOEXEC
		if strings.HasPrefix(src, "nonblock-") {
			typ |= unix.SOCK_NONBLOCK
		}
		fds, err := unix.Socketpair(unix.AF_UNIX, typ, 0)
		if err != nil {
			return fmt.Errorf("socketpair: %w", err)
		}
		defer unix.Close(fds[1])
		fd = fds[0]
	} else if strings.HasPrefix(how, "socket-") {
		var err error
		fd, err = unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("socket: %w", err)
		}
	} else {
		return fmt.Errorf("unknown datagram way %q", how)
	}
	defer unix.Close(fd)
	switch {
	case strings.HasSuffix(how, "-connect-write"):
		err := unix.Connect(fd, to)
		if err == nil {
			_, err = unix.Write(fd, msg)
		}
		return err
	case strings.HasSuffix(how, "-sendmsg"):
		return unix.Sendmsg(fd, msg, nil, to, 0)
	case strings.HasSuffix(how, "-bind-sendto"):
		dir, err := os.MkdirTemp("", "moat-probe-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		if err := unix.Bind(fd, &unix.SockaddrUnix{Name: filepath.Join(dir, "s")}); err != nil {
			return err
		}
		return unix.Sendto(fd, msg, 0, to)
	default:
		return unix.Sendto(fd, msg, 0, to)
	}
}

// SetID tries to make path set-id the way its base name says
// ("setid-WAY-MODE", WAY one of chmod, fchmod, fchmodat, fchmodat2, open,
// openat2, mknod, mkdir, dir-chmod; MODE octal) and returns the mode the
// probe then sees.
func SetID(path string) (string, error) {
	name := filepath.Base(path)
	mode, err := modeOf(name)
	if err != nil {
		return "", err
	}
	switch {
	case strings.HasPrefix(name, "setid-chmod-"):
		return ChmodNew(path, mode)
	case strings.HasPrefix(name, "setid-fchmod-"), strings.HasPrefix(name, "setid-fchmodat-"), strings.HasPrefix(name, "setid-fchmodat2-"):
		if err := os.WriteFile(path, []byte("#!/bin/sh\nid\n"), 0o644); err != nil {
			return "", err
		}
		switch {
		case strings.HasPrefix(name, "setid-fchmod-"):
			var fd int
			if fd, err = unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0); err == nil {
				err = unix.Fchmod(fd, mode)
				unix.Close(fd)
			}
		case strings.HasPrefix(name, "setid-fchmodat-"):
			err = unix.Fchmodat(unix.AT_FDCWD, path, mode, 0)
		default:
			err = fchmodat2(path, mode)
		}
	case strings.HasPrefix(name, "setid-open-"):
		var fd int
		if fd, err = unix.Open(path, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, mode); err == nil {
			unix.Close(fd)
		}
	case strings.HasPrefix(name, "setid-openat2-"):
		var fd int
		how := &unix.OpenHow{Flags: unix.O_CREAT | unix.O_EXCL | unix.O_WRONLY | unix.O_CLOEXEC, Mode: uint64(mode)}
		if fd, err = unix.Openat2(unix.AT_FDCWD, path, how); err == nil {
			unix.Close(fd)
		}
	case strings.HasPrefix(name, "setid-mknod-"):
		err = unix.Mknod(path, unix.S_IFREG|mode, 0)
	case strings.HasPrefix(name, "setid-mkdir-"):
		err = unix.Mkdir(path, mode)
	case strings.HasPrefix(name, "setid-dir-chmod-"):
		if err = os.Mkdir(path, 0o755); err == nil {
			err = unix.Chmod(path, mode)
		}
	default:
		return "", fmt.Errorf("unknown set-id attack %q", name)
	}
	return modeSeen(path), err
}

// ChmodNew creates path 0644 and chmods it to mode, and returns the mode
// the probe then sees.
func ChmodNew(path string, mode uint32) (string, error) {
	if err := os.WriteFile(path, []byte("#!/bin/sh\nid\n"), 0o644); err != nil {
		return "", err
	}
	err := unix.Chmod(path, mode)
	return modeSeen(path), err
}

// fchmodat2 is fchmodat2(AT_FDCWD, path, mode, 0).
func fchmodat2(path string, mode uint32) error {
	b, err := unix.BytePtrFromString(path)
	if err != nil {
		return err
	}
	atFDCWD := unix.AT_FDCWD
	_, _, errno := unix.Syscall6(unix.SYS_FCHMODAT2, uintptr(atFDCWD), uintptr(unsafe.Pointer(b)), uintptr(mode), 0, 0, 0)
	if errno != 0 {
		return errno
	}
	return nil
}

// modeOf is the octal mode at the end of a set-id attack's name.
func modeOf(name string) (uint32, error) {
	m, err := strconv.ParseUint(name[strings.LastIndexByte(name, '-')+1:], 8, 32)
	if err != nil || m > 0o7777 {
		return 0, fmt.Errorf("set-id attack %q does not end in an octal mode", name)
	}
	return uint32(m), nil
}

func modeSeen(path string) string {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return "stat: " + err.Error()
	}
	return fmt.Sprintf("mode %#o", st.Mode&0o7777)
}
