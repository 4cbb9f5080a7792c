package attrib

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/boundary/internal/initkit"
	"github.com/moat-sandbox/moat/internal/reexec/reexectest"
	"github.com/moat-sandbox/moat/internal/testenv"
)

// sockInode is the inode of the socket behind c.
func sockInode(t testing.TB, c net.Conn) uint64 {
	t.Helper()
	rc, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.Fstat(int(fd), &st) }); err != nil {
		t.Fatal(err)
	}
	if serr != nil {
		t.Fatal(serr)
	}
	return st.Ino
}

func ends(c net.Conn) (local, remote netip.AddrPort) {
	return unmapped(c.LocalAddr().(*net.TCPAddr).AddrPort()), unmapped(c.RemoteAddr().(*net.TCPAddr).AddrPort())
}

func ownNetns(t testing.TB) string {
	t.Helper()
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	return ns
}

// TestDiagLookupFindsTheOneSocket checks the sock_diag lookup against the
// sockets' own inodes: each of several connections on one listener (both
// ends, so the same ports appear in several 4-tuples) is found as itself,
// never as a neighbour, and the table lookup agrees. The denial: a 4-tuple
// no connection has, whose local end is the listener's, is answered by
// the kernel with the listener (its lookup falls back to one), and the
// lookup refuses that answer.
func TestDiagLookupFindsTheOneSocket(t *testing.T) {
	for _, tc := range []struct{ name, network, listen, dial string }{
		{"ipv4", "tcp4", "127.0.0.1:0", "127.0.0.1"},
		{"ipv6", "tcp6", "[::1]:0", "::1"},
		// A dual-stack listener's accepted sockets are AF_INET6 ones
		// holding IPv4-mapped addresses; the kernel answers an AF_INET
		// question with them.
		{"mapped", "tcp", ":0", "127.0.0.1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen(tc.network, tc.listen)
			if tc.name != "ipv4" {
				testenv.Need(t, err == nil, fmt.Sprintf("an IPv6 loopback (%v)", err))
			}
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			port := ln.Addr().(*net.TCPAddr).Port
			var conns []net.Conn
			for range 3 {
				cl, err := net.Dial("tcp", net.JoinHostPort(tc.dial, strconv.Itoa(port)))
				if err != nil {
					t.Fatal(err)
				}
				defer cl.Close()
				cl.Write([]byte("x"))
				conns = append(conns, cl, acceptOne(t, ln))
			}
			ns := ownNetns(t)
			a := &attributor{netnsPID: os.Getpid()}
			seen := map[uint64]bool{}
			for i, c := range conns {
				local, remote := ends(c)
				want := sockInode(t, c)
				if seen[want] {
					t.Fatalf("conn %d: inode %d twice", i, want)
				}
				seen[want] = true
				r, err := diagPeer(os.Getpid(), ns, local, remote)
				if err != nil {
					t.Fatalf("conn %d (%s → %s): %v", i, local, remote, err)
				}
				if r.Inode != want || r.Local != local || r.Remote != remote || r.State != 1 {
					t.Errorf("conn %d (%s → %s): got %+v, want inode %d, established", i, local, remote, r, want)
				}
				if got, err := a.tablePeerInode(local, remote); err != nil || got != want {
					t.Errorf("conn %d: the table says %d, %v; sock_diag %d", i, got, err, want)
				}
			}

			// The denial, beside the control above: the listener's end
			// with a remote end nobody has.
			local := unmapped(ln.Addr().(*net.TCPAddr).AddrPort())
			if tc.name == "mapped" {
				local = netip.AddrPortFrom(netip.MustParseAddr(tc.dial), local.Port())
			}
			nobody := netip.AddrPortFrom(local.Addr(), 9) // discard: no connection from it here
			fd, err := newDiagSocket()
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(fd)
			raw, err := diagAsk(fd, local, nobody)
			switch {
			case err == nil && raw.State == tcpListen:
				// The kernel's answer is the listener: the wrong socket.
			case errors.Is(err, errDiagNoSocket):
				t.Logf("this kernel answers ENOENT, not the listener")
			default:
				t.Fatalf("raw lookup of %s → %s: %+v, %v", local, nobody, raw, err)
			}
			if r, err := diagLookup(fd, local, nobody); !errors.Is(err, errDiagNoSocket) {
				t.Errorf("lookup of %s → %s returned %+v, %v; want no socket (the kernel's listener is not the peer)", local, nobody, r, err)
			}
			if r, err := diagPeer(os.Getpid(), ns, local, nobody); !errors.Is(err, errDiagNoSocket) {
				t.Errorf("diagPeer of %s → %s returned %+v, %v; want no socket", local, nobody, r, err)
			}
		})
	}
}

// TestDiagLookupRefusesAMismatchedAnswer feeds the decoder answers that
// are not the socket asked for.
func TestDiagLookupRefusesAMismatchedAnswer(t *testing.T) {
	local := netip.MustParseAddrPort("127.0.0.1:40000")
	remote := netip.MustParseAddrPort("127.0.0.1:8080")
	msg := func(seq uint32, l, r netip.AddrPort, state uint8, inode uint32) []byte {
		b := diagRequest(seq, l, r) // same header and id layout
		out := make([]byte, sizeofNlMsghdr+sizeofInetDiagMsg)
		copy(out, b[:sizeofNlMsghdr])
		body := out[sizeofNlMsghdr:]
		body[0], body[1] = b[sizeofNlMsghdr], state
		copy(body[4:4+sizeofSockID], b[sizeofNlMsghdr+8:])
		binary.NativeEndian.PutUint32(out[0:], uint32(len(out)))
		binary.NativeEndian.PutUint16(out[4:], unix.SOCK_DIAG_BY_FAMILY)
		binary.NativeEndian.PutUint32(body[4+sizeofSockID+16:], inode)
		return out
	}
	if r, err := diagReply(msg(7, local, remote, 1, 42), 7); err != nil || r.Inode != 42 || r.Local != local || r.Remote != remote {
		t.Fatalf("control: got %+v, %v", r, err)
	}
	if _, err := diagReply(msg(8, local, remote, 1, 42), 7); !errors.Is(err, errDiagNoReply) {
		t.Errorf("another request's answer: %v, want errDiagNoReply", err)
	}
	if _, err := diagReply(msg(7, local, remote, 1, 42)[:20], 7); err == nil {
		t.Errorf("a truncated answer was accepted")
	}
}

// netnsPair makes the re-executed test binary, in a network namespace of
// its own, connect to itself on loopback, print "<local> <remote> <inode>"
// of the client socket, and wait for stdin to close.
var netnsPair = reexectest.Helper("attrib-netns-pair", func([]string) int {
	if err := initkit.LoopbackUp(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		return 2
	}
	cl, err := net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		return 3
	}
	srv, err := ln.Accept()
	if err != nil {
		return 4
	}
	defer srv.Close()
	var st unix.Stat_t
	f, err := cl.(*net.TCPConn).File()
	if err != nil {
		return 5
	}
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return 6
	}
	fmt.Printf("%s %s %d\n", cl.LocalAddr(), cl.RemoteAddr(), st.Ino)
	bufio.NewReader(os.Stdin).ReadString('\n')
	return 0
})

// TestDiagLookupInAnotherNetns checks the lookup that enters the
// sandbox's network namespace (a user namespace's, as the native
// backend's is): as root a socket there is found as itself by sock_diag;
// unprivileged the namespace cannot be entered and the table answers;
// either way the peer's inode is the socket's own. Controls: the same
// 4-tuple is not that socket in our namespace, and a namespace name that
// is not the pid's is refused.
func TestDiagLookupInAnotherNetns(t *testing.T) {
	exe, _ := selfSHA256(t)
	cmd := exec.Command(exe, netnsPair.Name)
	cmd.Env = []string{}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWNET,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Geteuid(), Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getegid(), Size: 1}},
	}
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	err = cmd.Start()
	testenv.Need(t, err == nil, fmt.Sprintf("user and network namespaces (%v)", err))
	defer cmd.Wait()
	defer stdin.Close()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("helper: %v", err)
	}
	f := strings.Fields(line)
	if len(f) != 3 {
		t.Fatalf("helper printed %q", line)
	}
	local, remote := netip.MustParseAddrPort(f[0]), netip.MustParseAddrPort(f[1])
	want, _ := strconv.ParseUint(f[2], 10, 64)
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	if ns == ownNetns(t) {
		t.Fatal("the helper shares our network namespace")
	}
	r, err := diagPeer(cmd.Process.Pid, ns, local, remote)
	if os.Geteuid() == 0 {
		if err != nil || r.Inode != want {
			t.Fatalf("in the helper's namespace: got %+v, %v; want inode %d", r, err, want)
		}
	} else if !errors.Is(err, errNoDiagSocket) {
		t.Fatalf("unprivileged, in the helper's namespace: got %+v, %v; want errNoDiagSocket", r, err)
	}
	a := &attributor{netnsPID: cmd.Process.Pid}
	if got, err := a.peerInode(ns, local, remote); err != nil || got != want {
		t.Fatalf("peerInode: got %d, %v; want %d", got, err, want)
	}
	// Ours has no such connection (the helper's ports are its own).
	if r, err := diagPeer(os.Getpid(), ownNetns(t), local, remote); err == nil && r.Inode == want {
		t.Errorf("the helper's socket was found in our namespace: %+v", r)
	}
	// The namespace named must be the pid's: a stale name is refused.
	if _, err := diagPeer(cmd.Process.Pid, ownNetns(t), local, remote); err == nil || !strings.Contains(err.Error(), "changed network namespace") {
		t.Errorf("a namespace name that is not the pid's: %v", err)
	}
	// And this thread is back in ours.
	if got, _ := os.Readlink("/proc/thread-self/ns/net"); got != ownNetns(t) {
		t.Errorf("left in namespace %s", got)
	}
}
