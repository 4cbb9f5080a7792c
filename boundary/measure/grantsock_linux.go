package measure

import (
	"fmt"
	"net"
	"os"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/grants"
)

// grantSock is a receiver's Unix socket inside a read-write grant. The
// grant is a directory that a sandbox can write, so nothing here is looked
// up by path in it: the grant is opened once without following symlinks
// (package grants), the socket is bound through that descriptor
// (/proc/self/fd/N/name), made mode 0777 through a descriptor of the
// socket inode itself, and removed with unlinkat on the same descriptor.
// (Binding and chmodding by path let a second sandbox swap the grant for
// a symlink and have root moat chmod a host file 0777: found by attack.)
type grantSock struct {
	dir  int // O_PATH descriptor of the grant
	name string
	ln   net.Listener
	pc   net.PacketConn
}

// testAfterOpen, set only by tests, runs between opening the grant and
// binding in it: where a second sandbox would swap the grant's path.
var testAfterOpen func()

// bindInGrant makes a socket of network ("unix" or "unixgram") named name
// in the read-write grant g.
func bindInGrant(g, name, network string) (*grantSock, error) {
	pl, err := grants.Resolve([]grants.Spec{{Key: g, Path: g, Write: true}}, "")
	if err != nil {
		return nil, err
	}
	dir, err := pl.Mounts[0].Open(grants.Checks{WriteOwner: -1})
	if err != nil {
		return nil, err
	}
	if testAfterOpen != nil {
		testAfterOpen()
	}
	gs := &grantSock{dir: dir, name: name}
	addr := "/proc/self/fd/" + strconv.Itoa(dir) + "/" + name
	if network == "unix" {
		gs.ln, err = net.Listen("unix", addr)
		if err == nil {
			gs.ln.(*net.UnixListener).SetUnlinkOnClose(false)
		}
	} else {
		gs.pc, err = net.ListenPacket("unixgram", addr)
	}
	if err != nil {
		unix.Close(dir)
		return nil, err
	}
	// Only the sandbox's walls may stop a connection, not the socket's
	// mode: 0777, set on the inode just made (a socket owned by this
	// process), never on whatever the name points to.
	fd, err := unix.Openat(dir, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err == nil {
		var st unix.Stat_t
		if err = unix.Fstat(fd, &st); err == nil && (st.Mode&unix.S_IFMT != unix.S_IFSOCK || int(st.Uid) != os.Geteuid()) {
			err = fmt.Errorf("%s is not the socket just bound (mode %#o, uid %d)", name, st.Mode, st.Uid)
		}
		if err == nil {
			err = unix.Chmod("/proc/self/fd/"+strconv.Itoa(fd), 0o777)
		}
		unix.Close(fd)
	}
	if err != nil {
		gs.close()
		return nil, err
	}
	return gs, nil
}

// close closes the socket and removes its name from the grant, if the
// name is still a socket of this process's uid.
func (gs *grantSock) close() {
	if gs.ln != nil {
		gs.ln.Close()
	}
	if gs.pc != nil {
		gs.pc.Close()
	}
	var st unix.Stat_t
	if unix.Fstatat(gs.dir, gs.name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFSOCK && int(st.Uid) == os.Geteuid() {
		unix.Unlinkat(gs.dir, gs.name, 0)
	}
	unix.Close(gs.dir)
}
