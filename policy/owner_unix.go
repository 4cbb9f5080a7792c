//go:build unix

package policy

import (
	"fmt"
	"os"
	"syscall"
)

// owner returns the uid and gid that own path.
func owner(path string) (uid, gid int, err error) {
	st, err := os.Stat(path)
	if err != nil {
		return 0, 0, err
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, 0, fmt.Errorf("cannot read the owner of %s", path)
	}
	return int(sys.Uid), int(sys.Gid), nil
}

// CheckWriteOwners refuses, with the fix, a read_write grant that host
// uid does not own: the workload writes as uid and never as anyone else,
// root least of all (an idmapped root-owned workspace let a workload make
// a setuid-root file). Backends call it before anything starts; the
// namespace that mounts a grant checks the owner again on its descriptor.
// how says where uid came from, for the message.
func (p *Policy) CheckWriteOwners(uid, gid int, how string) error {
	for _, g := range p.Filesystem.ReadWrite {
		u, _, err := owner(g)
		if err != nil {
			return fmt.Errorf("read_write grant %s: %w", g, err)
		}
		if u != uid {
			return fmt.Errorf("read_write grant %s is owned by uid %d, but the workload runs as host uid %d (%s) and moat never lets it write as another uid, root least of all; chown -R %d:%d %s, or set process.host_uid to its owner if that is not root", g, u, uid, how, uid, gid, g)
		}
	}
	return nil
}
