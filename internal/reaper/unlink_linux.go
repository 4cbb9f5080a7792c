package reaper

import (
	"errors"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// unlinkSocket removes path if it is a socket owned by this uid, through
// its parent directory opened without following symlinks: the parent lies
// in a grant, where a sandbox may have swapped anything for a link.
func unlinkSocket(path string) error {
	dir, err := unix.Openat2(unix.AT_FDCWD, filepath.Dir(path), &unix.OpenHow{
		Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS})
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return err
	}
	defer unix.Close(dir)
	name := filepath.Base(path)
	var st unix.Stat_t
	if err := unix.Fstatat(dir, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK || int(st.Uid) != os.Geteuid() {
		return errors.New("not a socket of moat's: left alone")
	}
	return unix.Unlinkat(dir, name, 0)
}
