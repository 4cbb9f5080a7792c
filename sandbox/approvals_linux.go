package sandbox

import (
	"fmt"
	"net"
	"os"
	"syscall"
)

// peerIdent names a control client as "uid U pid P" from its peer
// credentials, and reports whether it may control this run: only the
// owning user or root (as sameUser).
func peerIdent(c *net.UnixConn) (string, bool) {
	raw, err := c.SyscallConn()
	if err != nil {
		return "", false
	}
	var cred *syscall.Ucred
	raw.Control(func(fd uintptr) {
		cred, _ = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	})
	if cred == nil || int(cred.Uid) != os.Geteuid() && cred.Uid != 0 {
		return "", false
	}
	return fmt.Sprintf("uid %d pid %d", cred.Uid, cred.Pid), true
}
