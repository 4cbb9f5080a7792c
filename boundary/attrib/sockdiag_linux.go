package attrib

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"strconv"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// The kernel's sock_diag wire format (linux/inet_diag.h, linux/sock_diag.h).
const (
	sizeofNlMsghdr     = 16
	sizeofSockID       = 48 // sport, dport (be16), src[4], dst[4] (be32), if, cookie[2]
	sizeofInetDiagReq  = 8 + sizeofSockID
	sizeofInetDiagMsg  = 4 + sizeofSockID + 20 // …, expires, rqueue, wqueue, uid, inode
	inetDiagNoCookie   = ^uint32(0)
	tcpTimeWait        = 6
	diagRecvBufferSize = 8 << 10
)

// errDiagNoSocket is the kernel's answer when no socket has the 4-tuple.
var errDiagNoSocket = errors.New("no such socket")

// errNoDiagSocket means no sock_diag socket could be made in the
// sandbox's network namespace (entering it needs CAP_SYS_ADMIN in the
// caller's user namespace); the lookup falls back to its socket table.
var errNoDiagSocket = errors.New("no sock_diag socket in that network namespace")

var diagSeq atomic.Uint32

// diagSocketIn returns a NETLINK_SOCK_DIAG socket in the network namespace
// that nsFD (an open /proc/<pid>/ns/net) names. A netlink socket belongs
// to the namespace it was made in for good, so when that is not ours the
// socket is made on a locked thread that enters the namespace and leaves
// it again (the thread is never reused if leaving fails).
func diagSocketIn(nsFD int) (int, error) {
	var want, self unix.Stat_t
	if err := unix.Fstat(nsFD, &want); err != nil {
		return -1, fmt.Errorf("stat of the sandbox's network namespace: %w", err)
	}
	if err := unix.Stat("/proc/thread-self/ns/net", &self); err == nil && self.Dev == want.Dev && self.Ino == want.Ino {
		return newDiagSocket()
	}
	type res struct {
		fd  int
		err error
	}
	ch := make(chan res, 1)
	go func() {
		runtime.LockOSThread()
		back, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- res{-1, fmt.Errorf("%w: opening this thread's network namespace: %v", errNoDiagSocket, err)}
			return
		}
		defer unix.Close(back)
		if err := unix.Setns(nsFD, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- res{-1, fmt.Errorf("%w: setns: %v", errNoDiagSocket, err)}
			return
		}
		fd, err := newDiagSocket()
		if err := unix.Setns(back, unix.CLONE_NEWNET); err != nil {
			// Stay locked: the thread ends with this goroutine.
			if fd >= 0 {
				unix.Close(fd)
			}
			ch <- res{-1, fmt.Errorf("leaving the sandbox's network namespace: %v", err)}
			return
		}
		runtime.UnlockOSThread()
		ch <- res{fd, err}
	}()
	r := <-ch
	return r.fd, r.err
}

func newDiagSocket() (int, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return -1, fmt.Errorf("%w: socket(NETLINK_SOCK_DIAG): %v", errNoDiagSocket, err)
	}
	return fd, nil
}

// diagRequest encodes a SOCK_DIAG_BY_FAMILY request for the one TCP
// socket whose local end is local and remote end is remote (both of one
// family; IPv4 ones are asked for as AF_INET, which the kernel also finds
// when an AF_INET6 socket holds them mapped).
func diagRequest(seq uint32, local, remote netip.AddrPort) []byte {
	b := make([]byte, sizeofNlMsghdr+sizeofInetDiagReq)
	ne := binary.NativeEndian
	ne.PutUint32(b[0:], uint32(len(b)))
	ne.PutUint16(b[4:], unix.SOCK_DIAG_BY_FAMILY)
	ne.PutUint16(b[6:], unix.NLM_F_REQUEST)
	ne.PutUint32(b[8:], seq)
	r := b[sizeofNlMsghdr:]
	if local.Addr().Is4() {
		r[0] = unix.AF_INET
	} else {
		r[0] = unix.AF_INET6
	}
	r[1] = unix.IPPROTO_TCP
	ne.PutUint32(r[4:], ^uint32(0)) // every state
	id := r[8:]
	binary.BigEndian.PutUint16(id[0:], local.Port())
	binary.BigEndian.PutUint16(id[2:], remote.Port())
	putAddr(id[4:20], local.Addr())
	putAddr(id[20:36], remote.Addr())
	ne.PutUint32(id[40:], inetDiagNoCookie)
	ne.PutUint32(id[44:], inetDiagNoCookie)
	return b
}

func putAddr(dst []byte, a netip.Addr) {
	if a.Is4() {
		v := a.As4()
		copy(dst, v[:])
		return
	}
	v := a.As16()
	copy(dst, v[:])
}

// diagReply decodes the kernel's answer to request seq: the socket it
// found, errDiagNoSocket, or another error.
func diagReply(b []byte, seq uint32) (tcpRow, error) {
	ne := binary.NativeEndian
	for len(b) >= sizeofNlMsghdr {
		n := int(ne.Uint32(b[0:]))
		if n < sizeofNlMsghdr || n > len(b) {
			return tcpRow{}, fmt.Errorf("sock_diag: malformed reply (message length %d of %d bytes)", n, len(b))
		}
		typ, mseq := ne.Uint16(b[4:]), ne.Uint32(b[8:])
		body := b[sizeofNlMsghdr:n]
		b = b[min(nlmAlign(n), len(b)):]
		if mseq != seq {
			continue // not the answer to this request
		}
		switch typ {
		case unix.NLMSG_ERROR:
			if len(body) < 4 {
				return tcpRow{}, errors.New("sock_diag: short error reply")
			}
			errno := -int32(ne.Uint32(body))
			if errno == int32(unix.ENOENT) {
				return tcpRow{}, errDiagNoSocket
			}
			return tcpRow{}, fmt.Errorf("sock_diag: %w", unix.Errno(errno))
		case unix.SOCK_DIAG_BY_FAMILY:
			return parseDiagMsg(body)
		default:
			return tcpRow{}, fmt.Errorf("sock_diag: unexpected reply type %d", typ)
		}
	}
	return tcpRow{}, errDiagNoReply
}

// errDiagNoReply: a datagram held no answer to the request.
var errDiagNoReply = errors.New("sock_diag: no reply to the request")

func nlmAlign(n int) int { return (n + unix.NLMSG_ALIGNTO - 1) &^ (unix.NLMSG_ALIGNTO - 1) }

// parseDiagMsg decodes an inet_diag_msg.
func parseDiagMsg(b []byte) (tcpRow, error) {
	if len(b) < sizeofInetDiagMsg {
		return tcpRow{}, fmt.Errorf("sock_diag: short inet_diag_msg (%d bytes)", len(b))
	}
	id := b[4:]
	var r tcpRow
	switch b[0] {
	case unix.AF_INET:
		r.Local = netip.AddrPortFrom(netip.AddrFrom4([4]byte(id[4:8])), binary.BigEndian.Uint16(id[0:]))
		r.Remote = netip.AddrPortFrom(netip.AddrFrom4([4]byte(id[20:24])), binary.BigEndian.Uint16(id[2:]))
	case unix.AF_INET6:
		r.Local = netip.AddrPortFrom(netip.AddrFrom16([16]byte(id[4:20])).Unmap(), binary.BigEndian.Uint16(id[0:]))
		r.Remote = netip.AddrPortFrom(netip.AddrFrom16([16]byte(id[20:36])).Unmap(), binary.BigEndian.Uint16(id[2:]))
	default:
		return tcpRow{}, fmt.Errorf("sock_diag: reply of family %d", b[0])
	}
	r.State = b[1]
	r.Inode = uint64(binary.NativeEndian.Uint32(b[4+sizeofSockID+16:]))
	return r, nil
}

// diagLookup asks the kernel, through sock_diag socket fd, for the TCP
// socket whose local end is local and remote end is remote. It returns
// only that socket: whatever else the kernel's lookup answers with (it
// falls back to a listener on the local address and port when no
// connection has the 4-tuple) is errDiagNoSocket.
func diagLookup(fd int, local, remote netip.AddrPort) (tcpRow, error) {
	r, err := diagAsk(fd, local, remote)
	if err != nil {
		return tcpRow{}, err
	}
	if r.Local != local || r.Remote != remote || r.State == tcpListen {
		return tcpRow{}, errDiagNoSocket
	}
	return r, nil
}

// diagAsk sends the request and returns the socket the kernel answered
// with, unchecked.
func diagAsk(fd int, local, remote netip.AddrPort) (tcpRow, error) {
	seq := diagSeq.Add(1)
	if err := unix.Sendto(fd, diagRequest(seq, local, remote), 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return tcpRow{}, fmt.Errorf("sock_diag: send: %w", err)
	}
	buf := make([]byte, diagRecvBufferSize)
	// The kernel answers while it handles the request, so the answer is
	// queued before sendto returns: the reads never wait.
	for range maxDiagReads {
		n, from, err := unix.Recvfrom(fd, buf, unix.MSG_DONTWAIT)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return tcpRow{}, fmt.Errorf("sock_diag: receive: %w", err)
		}
		if sa, ok := from.(*unix.SockaddrNetlink); !ok || sa.Pid != 0 {
			continue // not from the kernel
		}
		r, err := diagReply(buf[:n], seq)
		if errors.Is(err, errDiagNoReply) {
			continue // another request's answer: read on
		}
		return r, err
	}
	return tcpRow{}, errDiagNoReply
}

// maxDiagReads bounds the datagrams read for one answer.
const maxDiagReads = 16

// diagPeer looks the peer socket up by sock_diag in the network namespace
// of pid, which readlink showed as ns. errNoDiagSocket means that
// namespace could not be entered.
func diagPeer(pid int, ns string, peer, ours netip.AddrPort) (tcpRow, error) {
	nsFD, err := unix.Open("/proc/"+strconv.Itoa(pid)+"/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return tcpRow{}, fmt.Errorf("cannot open the sandbox's network namespace: %w", err)
	}
	defer unix.Close(nsFD)
	var st unix.Stat_t
	if err := unix.Fstat(nsFD, &st); err != nil {
		return tcpRow{}, fmt.Errorf("cannot stat the sandbox's network namespace: %w", err)
	}
	if got := "net:[" + strconv.FormatUint(st.Ino, 10) + "]"; got != ns {
		return tcpRow{}, fmt.Errorf("pid %d changed network namespace (%s, then %s) while it was being attributed", pid, ns, got)
	}
	fd, err := diagSocketIn(nsFD)
	if err != nil {
		return tcpRow{}, err
	}
	defer unix.Close(fd)
	return diagLookup(fd, peer, ours)
}
