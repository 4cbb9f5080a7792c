package sandbox

import (
	"net"
	"os"
	"syscall"
)

// sameUser checks the peer's credentials: only the owning user (or root)
// may control a sandbox. The socket's 0600 mode and 0700 directory say the
// same; this is the second check.
func sameUser(c *net.UnixConn) bool {
	raw, err := c.SyscallConn()
	if err != nil {
		return false
	}
	var cred *syscall.Ucred
	raw.Control(func(fd uintptr) {
		cred, _ = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	})
	return cred != nil && (int(cred.Uid) == os.Geteuid() || cred.Uid == 0)
}
