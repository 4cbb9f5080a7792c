package reaper

import (
	"errors"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// unlinkFile removes path if it is a socket or a regular file, through its
// parent directory opened without following symlinks: the parent lies in a
// grant, where a sandbox may have swapped anything for a link. The names
// are moat's own, with a random nonce; removing a name never touches
// another name's file (a hard link to a host file loses only that link).
func unlinkFile(path string) error {
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
	if t := st.Mode & unix.S_IFMT; t != unix.S_IFSOCK && t != unix.S_IFREG {
		return errors.New("neither a socket nor a regular file: left alone")
	}
	return unix.Unlinkat(dir, name, 0)
}

func pidfdOpen(pid int) (int, error) { return unix.PidfdOpen(pid, 0) }

// waitExited waits until every pidfd is readable (its process exited), for
// at most d in all.
func waitExited(fds []int, d time.Duration) {
	deadline := time.Now().Add(d)
	for _, fd := range fds {
		for {
			left := time.Until(deadline)
			if left <= 0 {
				return
			}
			pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			n, err := unix.Poll(pfd, int(left.Milliseconds())+1)
			if err == unix.EINTR {
				continue
			}
			if n != 0 || err != nil {
				break
			}
		}
		unix.Close(fd)
	}
}
