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

// searchable reports whether this process may look up names in dir.
func searchable(dir string) bool {
	return syscall.Access(dir, 1 /* X_OK */) == nil
}
