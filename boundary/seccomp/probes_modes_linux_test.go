//go:build amd64 || arm64

package seccomp

import (
	"errors"
	"fmt"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Kernel probes for issue 11: set-id modes, FIFOs, sockets and device
// nodes, datagram socketpairs, openat2, and the syscalls denied for kernel
// counters and host paths. Each refusal runs first without the filter,
// where it must work (or, for what the kernel itself refuses in a user
// namespace, is only logged), next to an allowed control that must keep
// working with it.

const (
	modeFile   = "f"          // a 0644 file the chmod probes change
	hostDgram  = "dgram.sock" // a bound datagram socket, standing in for a host's
	hostStream = "stream.sock"
	hostSeq    = "seqpacket.sock"
)

// atFDCWD is AT_FDCWD as a syscall argument.
var atFDCWD = func() uintptr { v := unix.AT_FDCWD; return uintptr(v) }()

// pathCall makes syscall nr with AT_FDCWD, path p and the remaining
// arguments, and returns its errno or nil.
func pathCall(nr uintptr, p string, a2, a3, a4 uintptr) (uintptr, error) {
	b, err := unix.BytePtrFromString(p)
	if err != nil {
		return 0, err
	}
	r, _, e := unix.Syscall6(nr, atFDCWD, uintptr(unsafe.Pointer(b)), a2, a3, a4, 0)
	return r, errnoErr(e)
}

// touch creates an empty file at p.
func touch(p string, mode uint32) error {
	fd, err := unix.Open(p, unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, mode)
	if err != nil {
		return err
	}
	return unix.Close(fd)
}

// chmodProbe sets mode on st.dir/f through set and checks that the bits
// took (so that "ok" before the filter shows the kernel would have made
// the set-id file), then puts 0644 back.
func chmodProbe(mode uint32, set func(path string, mode uint32) error) func(*childState) error {
	return func(st *childState) error {
		p := filepath.Join(st.dir, modeFile)
		if err := set(p, mode); err != nil {
			return err
		}
		var s unix.Stat_t
		if err := unix.Stat(p, &s); err != nil {
			return fmt.Errorf("stat: %v", err)
		}
		if got := s.Mode & 0o7777; got != mode {
			return fmt.Errorf("mode %#o after the call, want %#o", got, mode)
		}
		return unix.Chmod(p, 0o644)
	}
}

// createProbe creates st.dir/name through create and checks its st_mode
// (type and permission bits; the child's umask is 0) is want, then removes
// it again.
func createProbe(name string, want uint32, create func(path string) error) func(*childState) error {
	return func(st *childState) error {
		p := filepath.Join(st.dir, name)
		if err := create(p); err != nil {
			return err
		}
		var s unix.Stat_t
		err := unix.Lstat(p, &s)
		if s.Mode&unix.S_IFMT == unix.S_IFDIR {
			unix.Rmdir(p)
		} else {
			unix.Unlink(p)
		}
		if err != nil {
			return fmt.Errorf("lstat: %v", err)
		}
		if s.Mode != want {
			return fmt.Errorf("st_mode %#o after the call, want %#o", s.Mode, want)
		}
		return nil
	}
}

func fchmodatCall(nr uintptr) func(string, uint32) error {
	return func(p string, mode uint32) error {
		_, err := pathCall(nr, p, uintptr(mode), 0, 0)
		return err
	}
}

func fchmodCall(p string, mode uint32) error {
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open: %v", err)
	}
	defer unix.Close(fd)
	_, _, e := unix.Syscall(unix.SYS_FCHMOD, uintptr(fd), uintptr(mode), 0)
	return errnoErr(e)
}

func openatCreate(mode uint32) func(string) error {
	return func(p string) error {
		fd, err := pathCall(unix.SYS_OPENAT, p, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, uintptr(mode), 0)
		if err != nil {
			return err
		}
		return unix.Close(int(fd))
	}
}

// tmpfileLink makes an unnamed file with O_TMPFILE and mode, then links
// it in at p: the other way to create a file with a mode.
func tmpfileLink(mode uint32) func(string) error {
	return func(p string) error {
		fd, err := pathCall(unix.SYS_OPENAT, filepath.Dir(p), unix.O_TMPFILE|unix.O_WRONLY|unix.O_CLOEXEC, uintptr(mode), 0)
		if err != nil {
			return err
		}
		defer unix.Close(int(fd))
		if err := unix.Linkat(unix.AT_FDCWD, fmt.Sprintf("/proc/self/fd/%d", fd), unix.AT_FDCWD, p, unix.AT_SYMLINK_FOLLOW); err != nil {
			return fmt.Errorf("linkat: %v", err)
		}
		return nil
	}
}

func mkdiratCall(mode uint32) func(string) error {
	return func(p string) error {
		_, err := pathCall(unix.SYS_MKDIRAT, p, uintptr(mode), 0, 0)
		return err
	}
}

func mknodatCall(mode uint32, dev uint64) func(string) error {
	return func(p string) error {
		_, err := pathCall(unix.SYS_MKNODAT, p, uintptr(mode), uintptr(dev), 0)
		return err
	}
}

func openat2Create(mode uint64) func(string) error {
	return func(p string) error {
		fd, err := unix.Openat2(unix.AT_FDCWD, p, &unix.OpenHow{Flags: unix.O_CREAT | unix.O_EXCL | unix.O_WRONLY | unix.O_CLOEXEC, Mode: mode})
		if err != nil {
			return err
		}
		return unix.Close(fd)
	}
}

// socketpairType calls socketpair(AF_UNIX, typ) and hands the pair to use.
func socketpairType(typ int, use func(a, b int) error) func(*childState) error {
	return func(*childState) error {
		var fds [2]int32
		_, _, e := unix.Syscall6(unix.SYS_SOCKETPAIR, unix.AF_UNIX, uintptr(typ), 0, uintptr(unsafe.Pointer(&fds)), 0, 0)
		if e != 0 {
			return e
		}
		defer unix.Close(int(fds[0]))
		defer unix.Close(int(fds[1]))
		if use == nil {
			return nil
		}
		return use(int(fds[0]), int(fds[1]))
	}
}

// dgramReceiver opens and binds the datagram socket a socketpair socket
// tries to reach; it is made before the filter, like a host's socket.
func dgramReceiver(st *childState) (int, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return -1, err
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: filepath.Join(st.dir, hostDgram)}); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// receiverFD is the bound datagram socket of the "unix-datagram" case.
var receiverFD = -1

func setupUnixSockets(st *childState) error {
	fd, err := dgramReceiver(st)
	if err != nil {
		return fmt.Errorf("datagram receiver: %w", err)
	}
	receiverFD = fd
	for name, typ := range map[string]int{hostStream: unix.SOCK_STREAM, hostSeq: unix.SOCK_SEQPACKET} {
		l, err := unix.Socket(unix.AF_UNIX, typ|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		if err := unix.Bind(l, &unix.SockaddrUnix{Name: filepath.Join(st.dir, name)}); err != nil {
			return err
		}
		if err := unix.Listen(l, 1); err != nil {
			return err
		}
	}
	return nil
}

// received reports whether the receiver got a datagram (and drains it).
func received() bool {
	var b [16]byte
	_, _, err := unix.Recvfrom(receiverFD, b[:], unix.MSG_DONTWAIT)
	return err == nil
}

// sendToHost sends a datagram from a to the receiver's path and checks
// it arrived: the channel the attack used.
func sendToHost(st *childState) func(a, b int) error {
	return func(a, _ int) error {
		if err := unix.Sendto(a, []byte("x"), 0, &unix.SockaddrUnix{Name: filepath.Join(st.dir, hostDgram)}); err != nil {
			return fmt.Errorf("sendto: %w", err)
		}
		if !received() {
			return errors.New("sendto succeeded but nothing arrived")
		}
		return nil
	}
}

var modeCases = []childCase{
	{
		name: "unix-datagram", userns: true,
		setup: setupUnixSockets,
		probes: []probe{
			{"socketpair(AF_UNIX, SOCK_DGRAM)", resOK, "EPERM", socketpairType(unix.SOCK_DGRAM, nil)},
			{"socketpair(AF_UNIX, SOCK_DGRAM|SOCK_CLOEXEC|SOCK_NONBLOCK)", resOK, "EPERM", socketpairType(unix.SOCK_DGRAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, nil)},
			{"datagram socketpair: sendto a pathname socket", resOK, "EPERM", func(st *childState) error {
				return socketpairType(unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, sendToHost(st))(st)
			}},
			{"datagram socketpair: connect to a pathname socket", resOK, "EPERM", func(st *childState) error {
				return socketpairType(unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, func(a, _ int) error {
					return unix.Connect(a, &unix.SockaddrUnix{Name: filepath.Join(st.dir, hostDgram)})
				})(st)
			}},
			{"socketpair(AF_UNIX, SOCK_STREAM|SOCK_CLOEXEC)", resOK, resOK, socketpairType(unix.SOCK_STREAM|unix.SOCK_CLOEXEC, nil)},
			{"socketpair(AF_UNIX, SOCK_SEQPACKET|SOCK_NONBLOCK)", resOK, resOK, socketpairType(unix.SOCK_SEQPACKET|unix.SOCK_NONBLOCK, nil)},
			{"stream pair carries data", resOK, resOK, socketpairType(unix.SOCK_STREAM|unix.SOCK_CLOEXEC, func(a, b int) error {
				if _, err := unix.Write(a, []byte("x")); err != nil {
					return err
				}
				var buf [1]byte
				if n, err := unix.Read(b, buf[:]); err != nil || n != 1 {
					return fmt.Errorf("read: %d, %v", n, err)
				}
				return nil
			})},
			// What keeps the allowed types from the pathname sockets: a
			// connected pair cannot connect again, cannot listen after a
			// bind, and a SEQPACKET sendto goes to the peer, not the address.
			{"stream pair, peer closed: connect to a pathname listener", "EISCONN", "EISCONN", func(st *childState) error {
				return socketpairType(unix.SOCK_STREAM|unix.SOCK_CLOEXEC, func(a, b int) error {
					unix.Close(b)
					return unix.Connect(a, &unix.SockaddrUnix{Name: filepath.Join(st.dir, hostStream)})
				})(st)
			}},
			{"seqpacket pair: connect to a pathname listener", "EISCONN", "EISCONN", func(st *childState) error {
				return socketpairType(unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, func(a, _ int) error {
					return unix.Connect(a, &unix.SockaddrUnix{Name: filepath.Join(st.dir, hostSeq)})
				})(st)
			}},
			{"stream pair: bind to a path, then listen", "EINVAL", "EINVAL", func(st *childState) error {
				return socketpairType(unix.SOCK_STREAM|unix.SOCK_CLOEXEC, func(a, _ int) error {
					p := filepath.Join(st.dir, "pair.sock")
					defer unix.Unlink(p)
					if err := unix.Bind(a, &unix.SockaddrUnix{Name: p}); err != nil {
						return fmt.Errorf("bind: %w", err)
					}
					return unix.Listen(a, 1)
				})(st)
			}},
			{"seqpacket pair: sendto a pathname datagram socket reaches only the peer", resOK, resOK, func(st *childState) error {
				return socketpairType(unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, func(a, b int) error {
					if err := unix.Sendto(a, []byte("x"), 0, &unix.SockaddrUnix{Name: filepath.Join(st.dir, hostDgram)}); err != nil {
						return fmt.Errorf("sendto: %w", err)
					}
					if received() {
						return errors.New("the pathname socket got the datagram")
					}
					var buf [1]byte
					if n, err := unix.Read(b, buf[:]); err != nil || n != 1 {
						return fmt.Errorf("peer read: %d, %v", n, err)
					}
					return nil
				})(st)
			}},
		},
	},
	{
		name: "unix-datagram-allowed-from-abi-9", userns: true, opts: Options{AllowUnixSockets: true},
		setup: setupUnixSockets,
		probes: []probe{
			{"socketpair(AF_UNIX, SOCK_DGRAM)", resOK, resOK, socketpairType(unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, nil)},
			{"socketpair(AF_UNIX, SOCK_STREAM)", resOK, resOK, socketpairType(unix.SOCK_STREAM, nil)},
		},
	},
	{
		name: "file-modes", userns: true,
		setup: func(st *childState) error {
			unix.Umask(0)
			return touch(filepath.Join(st.dir, modeFile), 0o644)
		},
		probes: append([]probe{
			{"fchmod 0755", resOK, resOK, chmodProbe(0o755, fchmodCall)},
			{"fchmod 04755", resOK, "EPERM", chmodProbe(0o4755, fchmodCall)},
			{"fchmod 02755", resOK, "EPERM", chmodProbe(0o2755, fchmodCall)},
			{"fchmodat 0755", resOK, resOK, chmodProbe(0o755, fchmodatCall(unix.SYS_FCHMODAT))},
			{"fchmodat 04755", resOK, "EPERM", chmodProbe(0o4755, fchmodatCall(unix.SYS_FCHMODAT))},
			{"fchmodat 06755", resOK, "EPERM", chmodProbe(0o6755, fchmodatCall(unix.SYS_FCHMODAT))},
			{"fchmodat2 0644", resOK, resOK, chmodProbe(0o644, fchmodatCall(unix.SYS_FCHMODAT2))},
			{"fchmodat2 01755 (sticky)", resOK, resOK, chmodProbe(0o1755, fchmodatCall(unix.SYS_FCHMODAT2))},
			{"fchmodat2 04755", resOK, "EPERM", chmodProbe(0o4755, fchmodatCall(unix.SYS_FCHMODAT2))},
			{"fchmodat2 02755", resOK, "EPERM", chmodProbe(0o2755, fchmodatCall(unix.SYS_FCHMODAT2))},
			{"openat O_CREAT 0644", resOK, resOK, createProbe("o", unix.S_IFREG|0o644, openatCreate(0o644))},
			{"openat O_CREAT 04755", resOK, "EPERM", createProbe("o", unix.S_IFREG|0o4755, openatCreate(0o4755))},
			{"openat O_CREAT 02755", resOK, "EPERM", createProbe("o", unix.S_IFREG|0o2755, openatCreate(0o2755))},
			{"openat O_TMPFILE 0755 + linkat", resOK, resOK, createProbe("t", unix.S_IFREG|0o755, tmpfileLink(0o755))},
			{"openat O_TMPFILE 04755 + linkat", resOK, "EPERM", createProbe("t", unix.S_IFREG|0o4755, tmpfileLink(0o4755))},
			{"openat2 O_CREAT 0644", resOK, "ENOSYS", createProbe("o2", unix.S_IFREG|0o644, openat2Create(0o644))},
			{"openat2 O_CREAT 04755", resOK, "ENOSYS", createProbe("o2", unix.S_IFREG|0o4755, openat2Create(0o4755))},
			{"mkdirat 0755", resOK, resOK, createProbe("d", unix.S_IFDIR|0o755, mkdiratCall(0o755))},
			// mkdir drops set-id bits itself (vfs_mkdir keeps 0777 and
			// S_ISVTX), so the filter has nothing to refuse there.
			{"mkdirat 06755 makes a 0755 directory", resOK, resOK, createProbe("d", unix.S_IFDIR|0o755, mkdiratCall(0o6755))},
			{"mknodat S_IFREG 0644", resOK, resOK, createProbe("n", unix.S_IFREG|0o644, mknodatCall(unix.S_IFREG|0o644, 0))},
			{"mknodat type 0 (regular) 0600", resOK, resOK, createProbe("n", unix.S_IFREG|0o600, mknodatCall(0o600, 0))},
			{"mknodat S_IFREG 04755", resOK, "EPERM", createProbe("n", unix.S_IFREG|0o4755, mknodatCall(unix.S_IFREG|0o4755, 0))},
			{"mknodat S_IFIFO (mkfifo)", resOK, "EPERM", createProbe("n", unix.S_IFIFO|0o644, mknodatCall(unix.S_IFIFO|0o644, 0))},
			{"mknodat S_IFSOCK", resOK, "EPERM", createProbe("n", unix.S_IFSOCK|0o755, mknodatCall(unix.S_IFSOCK|0o755, 0))},
			// In a user namespace the kernel refuses devices itself (no
			// CAP_MKNOD over the host); TestRootKernelFilter shows the
			// filter's own refusal as root.
			{"mknodat S_IFCHR 1:3", anyRes, "EPERM", createProbe("n", unix.S_IFCHR|0o600, mknodatCall(unix.S_IFCHR|0o600, unix.Mkdev(1, 3)))},
			{"renameat2 RENAME_NOREPLACE", resOK, resOK, renameProbe(unix.RENAME_NOREPLACE)},
			{"renameat2 RENAME_WHITEOUT", anyRes, "EPERM", renameProbe(unix.RENAME_WHITEOUT)},
		}, archModeProbes...),
	},
	{
		name: "counters-and-mounts", userns: true,
		probes: []probe{
			{"fanotify_init(FAN_REPORT_FID)", resOK, "EPERM", func(*childState) error {
				fd, err := unix.FanotifyInit(unix.FAN_CLASS_NOTIF|unix.FAN_REPORT_FID|unix.FAN_CLOEXEC, unix.O_RDONLY)
				if err == nil {
					unix.Close(fd)
				}
				return err
			}},
			{"inotify_init1 (control)", resOK, resOK, func(*childState) error {
				fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
				if err == nil {
					unix.Close(fd)
				}
				return err
			}},
			{"memfd_secret", anyRes, "EPERM", func(*childState) error {
				fd, _, e := unix.Syscall(unix.SYS_MEMFD_SECRET, unix.O_CLOEXEC, 0, 0)
				if e != 0 {
					return e
				}
				return unix.Close(int(fd))
			}},
			{"memfd_create (control)", resOK, resOK, func(*childState) error {
				fd, err := unix.MemfdCreate("moat", unix.MFD_CLOEXEC)
				if err == nil {
					unix.Close(fd)
				}
				return err
			}},
			{"listmount(root)", resOK, "EPERM", func(*childState) error { return listmountRoot() }},
			{"statmount(root)", resOK, "EPERM", func(*childState) error { return statmountRoot() }},
			{"socket(AF_NETLINK, NETLINK_ROUTE) (control)", resOK, resOK, socketProbe(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)},
			{"socket(AF_NETLINK, NETLINK_GENERIC)", resOK, "EPERM", socketProbe(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_GENERIC)},
			{"socket(AF_NETLINK, NETLINK_AUDIT)", resOK, "EPERM", socketProbe(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_AUDIT)},
			{"socket(AF_NETLINK, NETLINK_SOCK_DIAG)", resOK, "EPERM", socketProbe(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)},
			{"socket(AF_NETLINK, NETLINK_KOBJECT_UEVENT)", resOK, "EPERM", socketProbe(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_KOBJECT_UEVENT)},
		},
	},
}

// rootCases need CAP_MKNOD in the initial user namespace, which only real
// root has: in a user namespace the kernel refuses devices before the
// filter matters.
var rootCases = []childCase{
	{
		name: "devices-as-root", root: true,
		probes: append([]probe{
			{"mknodat S_IFREG (control)", resOK, resOK, createProbe("n", unix.S_IFREG|0o600, mknodatCall(unix.S_IFREG|0o600, 0))},
			{"mknodat S_IFCHR 1:3 (/dev/null)", resOK, "EPERM", createProbe("n", unix.S_IFCHR|0o600, mknodatCall(unix.S_IFCHR|0o600, unix.Mkdev(1, 3)))},
			{"mknodat S_IFBLK 7:0 (loop0)", resOK, "EPERM", createProbe("n", unix.S_IFBLK|0o600, mknodatCall(unix.S_IFBLK|0o600, unix.Mkdev(7, 0)))},
			{"mknodat S_IFCHR 0:0 (a whiteout)", resOK, "EPERM", createProbe("n", unix.S_IFCHR|0o600, mknodatCall(unix.S_IFCHR|0o600, 0))},
			{"renameat2 RENAME_WHITEOUT", resOK, "EPERM", renameProbe(unix.RENAME_WHITEOUT)},
		}, archDeviceProbes...),
	},
}

func init() { childCases = append(append(childCases, modeCases...), rootCases...) }

// renameProbe renames st.dir/r to st.dir/r2 with flags and back.
func renameProbe(flags uint) func(*childState) error {
	return func(st *childState) error {
		src, dst := filepath.Join(st.dir, "r"), filepath.Join(st.dir, "r2")
		if err := touch(src, 0o644); err != nil {
			return fmt.Errorf("create: %v", err)
		}
		defer unix.Unlink(src)
		defer unix.Unlink(dst)
		return unix.Renameat2(unix.AT_FDCWD, src, unix.AT_FDCWD, dst, flags)
	}
}

// mntIDReq is struct mnt_id_req (version 0, 24 bytes).
type mntIDReq struct {
	size  uint32
	spare uint32
	mntID uint64
	param uint64
}

const lsmtRoot = 0xffffffffffffffff // LSMT_ROOT: the namespace's root mount

func listmountRoot() error {
	req := mntIDReq{size: 24, mntID: lsmtRoot}
	var ids [64]uint64
	_, _, e := unix.Syscall6(unix.SYS_LISTMOUNT, uintptr(unsafe.Pointer(&req)), uintptr(unsafe.Pointer(&ids[0])), uintptr(len(ids)), 0, 0, 0)
	return errnoErr(e)
}

func statmountRoot() error {
	var self unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, "/", 0, unix.STATX_MNT_ID_UNIQUE, &self); err != nil {
		return fmt.Errorf("statx: %v", err)
	}
	const statmountSBBasic = 0x1 // STATMOUNT_SB_BASIC
	req := mntIDReq{size: 24, mntID: self.Mnt_id, param: statmountSBBasic}
	var buf [512]byte
	_, _, e := unix.Syscall6(unix.SYS_STATMOUNT, uintptr(unsafe.Pointer(&req)), uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), 0, 0, 0)
	return errnoErr(e)
}
