//go:build !linux

package sandbox

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// openLockfile reads a regular file of at most max bytes, refusing a path
// with a symlink in it (O_NOFOLLOW, and the path must be its own real
// path). O_NONBLOCK: a named pipe in the lockfile's place is refused as
// not a regular file instead of blocking the open.
func openLockfile(path string, max int64) ([]byte, error) {
	if real, err := filepath.EvalSymlinks(path); err != nil || real != filepath.Clean(path) {
		return nil, fmt.Errorf("a component of the path is a symlink; moat opens lockfiles without following symlinks")
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("not a regular file")
	}
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > max {
		return nil, fmt.Errorf("larger than %d bytes", max)
	}
	return data, nil
}
