//go:build linux

package exehash

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// stat returns f's key and whether it is a regular file.
func stat(f *os.File) (Key, bool, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return Key{}, false, fmt.Errorf("fstat: %w", err)
	}
	return Key{Dev: st.Dev, Ino: st.Ino, Size: st.Size, Mtime: st.Mtim.Nano(), Ctime: st.Ctim.Nano()},
		st.Mode&unix.S_IFMT == unix.S_IFREG, nil
}
