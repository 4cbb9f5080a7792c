package sandbox

import (
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// openLockfile reads a regular file of at most max bytes, opened with
// RESOLVE_NO_SYMLINKS|RESOLVE_NO_MAGICLINKS: no component of path may
// be a symlink (the workload cannot point a lockfile elsewhere). O_NONBLOCK:
// a named pipe the workload put in the lockfile's place is refused as not
// a regular file instead of blocking the open until a writer comes.
func openLockfile(path string, max int64) ([]byte, error) {
	fd, err := unix.Openat2(unix.AT_FDCWD, path, &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NOFOLLOW | unix.O_NONBLOCK,
		Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS})
	if err != nil {
		if err == unix.ELOOP {
			return nil, fmt.Errorf("a component of the path is a symlink; moat opens lockfiles without following symlinks")
		}
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
