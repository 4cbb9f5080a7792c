package attrib

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/internal/exehash"
	"golang.org/x/sys/unix"
)

// New returns an Attributor for connections whose peers live in the network
// namespace of process netnsPID (the sandbox's; on the host's own loopback,
// os.Getpid()).
func New(netnsPID int) boundary.Attributor {
	return &attributor{netnsPID: netnsPID}
}

type attributor struct {
	netnsPID int
}

// Attribute implements boundary.Attributor.
func (a *attributor) Attribute(conn net.Conn) boundary.Attribution {
	if conn == nil {
		return unavailable("no connection")
	}
	local, ok1 := conn.LocalAddr().(*net.TCPAddr)
	remote, ok2 := conn.RemoteAddr().(*net.TCPAddr)
	if !ok1 || !ok2 || local == nil || remote == nil {
		return unavailable("not a TCP connection (%T)", conn)
	}
	ours := unmapped(local.AddrPort())
	peer := unmapped(remote.AddrPort())
	if a.netnsPID <= 0 {
		return unavailable("BUG: attributor has no network namespace pid (%d)", a.netnsPID)
	}
	nsPath := fmt.Sprintf("/proc/%d/ns/net", a.netnsPID)
	ns, err := os.Readlink(nsPath)
	if err != nil {
		return unavailable("cannot read the sandbox's network namespace: %v", err)
	}
	inode, err := a.peerInode(ns, peer, ours)
	if err != nil {
		return unavailable("%v", err)
	}
	pid, fd, err := socketHolder(ns, inode)
	if err != nil {
		return unavailable("%v", err)
	}
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		return unavailable("pid %d holds the peer socket but its executable cannot be read: %v", pid, err)
	}
	sum, err := a.exeSHA256(pid)
	if err != nil {
		return unavailable("pid %d (%s) holds the peer socket but its executable cannot be hashed: %v", pid, exe, err)
	}
	// The pid may have exited and been reused while we looked; the same fd
	// still naming the same socket rules that out.
	if l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd)); err != nil || l != socketLink(inode) {
		return unavailable("pid %d changed while it was being attributed", pid)
	}
	return boundary.Attribution{Status: boundary.AttributionResolved, PID: pid, Executable: exe, SHA256: sum}
}

func unmapped(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

func socketLink(inode uint64) string { return "socket:[" + strconv.FormatUint(inode, 10) + "]" }

// peerInode finds the socket whose local end is peer and remote end is
// ours in the sandbox's network namespace (ns, as readlink showed it): by
// a sock_diag lookup of that one 4-tuple, or where the namespace cannot
// be entered (an unprivileged moat), in its tcp and tcp6 tables.
func (a *attributor) peerInode(ns string, peer, ours netip.AddrPort) (uint64, error) {
	r, err := diagPeer(a.netnsPID, ns, peer, ours)
	switch {
	case errors.Is(err, errNoDiagSocket), errors.Is(err, errDiagNoSocket):
		// No sock_diag socket in that namespace, or no such socket: the
		// tables give the answer the lookup always gave (a kernel whose
		// tcp_diag is missing says ENOENT to everything; a peer that has
		// gone is a rare path).
		return a.tablePeerInode(peer, ours)
	case err != nil:
		return 0, err
	case r.Inode == 0:
		return 0, noLongerHeld(peer, r.State)
	}
	return r.Inode, nil
}

func noSocket(peer, ours netip.AddrPort) error {
	return fmt.Errorf("no socket from %s to %s in the sandbox's network namespace (the peer has closed, or is not in that namespace)", peer, ours)
}

func noLongerHeld(peer netip.AddrPort, state uint8) error {
	return fmt.Errorf("the peer socket %s is no longer held by any process (state %02X)", peer, state)
}

// tablePeerInode finds the socket whose local end is peer and remote end
// is ours in the sandbox's tcp and tcp6 tables.
func (a *attributor) tablePeerInode(peer, ours netip.AddrPort) (uint64, error) {
	// An IPv4 peer is an AF_INET socket (tcp) or an AF_INET6 one with a
	// mapped address (tcp6); an IPv6 peer is only in tcp6. A 4-tuple names
	// at most one live socket in a namespace, so the second table is read
	// only when the first has no live match.
	tables := []string{"tcp6"}
	if peer.Addr().Is4() {
		tables = []string{"tcp", "tcp6"}
	}
	var live, dead []tcpRow
	for _, name := range tables {
		p := fmt.Sprintf("/proc/%d/net/%s", a.netnsPID, name)
		rows, err := matchingRows(p, peer, ours)
		if err != nil {
			if name == "tcp6" && errors.Is(err, os.ErrNotExist) {
				continue // IPv6 disabled
			}
			return 0, err
		}
		for _, r := range rows {
			if r.Inode == 0 {
				dead = append(dead, r)
			} else {
				live = append(live, r)
			}
		}
		if len(live) > 0 {
			break
		}
	}
	switch {
	case len(live) == 1:
		return live[0].Inode, nil
	case len(live) > 1:
		return 0, fmt.Errorf("%d sockets from %s to %s in the sandbox's network namespace; refusing to choose", len(live), peer, ours)
	case len(dead) > 0:
		return 0, noLongerHeld(peer, dead[0].State)
	}
	return 0, noSocket(peer, ours)
}

func matchingRows(path string, local, remote netip.AddrPort) ([]tcpRow, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading the sandbox's socket table: %w", err)
	}
	defer f.Close()
	var out []tcpRow
	sc := bufio.NewScanner(f)
	for n := 0; sc.Scan(); n++ {
		if n > maxProcNetLines {
			return nil, fmt.Errorf("%s has more than %d lines", path, maxProcNetLines)
		}
		r, err := parseTCPLine(sc.Text())
		if errors.Is(err, errHeader) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if r.State != tcpListen && r.Local == local && r.Remote == remote {
			out = append(out, r)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return out, nil
}

// socketHolder returns the one process in network namespace ns (as
// readlink /proc/<pid>/ns/net shows it) that holds socket inode, and the
// fd number under which it does. It reads procfs with bare system calls
// relative to one descriptor of /proc: every process's namespace link is
// read, and every fd of those in ns (no os.File per directory, no string
// per link).
func socketHolder(ns string, inode uint64) (int, string, error) {
	proc, err := unix.Open("/proc", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, "", fmt.Errorf("listing processes: %w", err)
	}
	defer unix.Close(proc)
	names, err := direntNames(proc)
	if err != nil {
		return 0, "", fmt.Errorf("listing processes: %w", err)
	}
	want := []byte(socketLink(inode))
	nsb := []byte(ns)
	link := make([]byte, 64) // "net:[…]" and "socket:[…]" fit; longer links do not match
	type holder struct {
		pid int
		fd  string
	}
	var holders []holder
	unreadable := 0
	for _, name := range names {
		pid, err := strconv.Atoi(name)
		if err != nil || pid <= 0 {
			continue
		}
		if n, err := unix.Readlinkat(proc, name+"/ns/net", link); err != nil || !bytes.Equal(link[:n], nsb) {
			continue
		}
		fdDir, err := unix.Openat(proc, name+"/fd", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			unreadable++
			continue
		}
		fds, err := direntNames(fdDir)
		if err != nil {
			unix.Close(fdDir)
			unreadable++
			continue
		}
		for _, fd := range fds {
			if n, err := unix.Readlinkat(fdDir, fd, link); err == nil && bytes.Equal(link[:n], want) {
				holders = append(holders, holder{pid, fd})
				break
			}
		}
		unix.Close(fdDir)
	}
	switch len(holders) {
	case 0:
		return 0, "", fmt.Errorf("no process in the sandbox's network namespace holds socket inode %d (%d processes there could not be inspected)", inode, unreadable)
	case 1:
		return holders[0].pid, holders[0].fd, nil
	}
	pids := make([]int, len(holders))
	for i, h := range holders {
		pids[i] = h.pid
	}
	slices.Sort(pids)
	return 0, "", fmt.Errorf("socket inode %d is shared by pids %v; refusing to choose", inode, pids)
}

// direntNames lists directory fd (without "." and "..").
func direntNames(fd int) ([]string, error) {
	buf := make([]byte, 16<<10)
	var names []string
	for {
		n, err := unix.ReadDirent(fd, buf)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n <= 0 {
			return names, nil
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
	}
}

// exeSHA256 hashes the file that pid executes, through /proc/<pid>/exe.
// A version of a file is hashed once per process (internal/exehash says
// by which rule), whichever process or sandbox executes it.
func (a *attributor) exeSHA256(pid int) (string, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		return "", err
	}
	defer f.Close()
	return exehash.Sum(f, MaxExecutableBytes)
}
