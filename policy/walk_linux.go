package policy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// MaxWalkDepth caps how deep moat descends into a grant when it looks for
// Unix sockets; a deeper tree is refused like a too-large one.
const MaxWalkDepth = 256

// findSocket returns the first Unix socket at or under root, examining at
// most *budget entries. It never follows symlinks. This is the Linux
// walker: getdents64 and openat on directory descriptors, with the type
// from the directory entry, so that walking /usr costs about one syscall
// per directory instead of one per file.
func findSocket(root string, budget *int) (string, error) {
	var st unix.Stat_t
	if err := unix.Lstat(root, &st); err != nil {
		return "", fmt.Errorf("%s: %s", root, errText(err))
	}
	*budget--
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFSOCK:
		return root, nil
	case unix.S_IFDIR:
	default:
		return "", nil
	}
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.EACCES) && !searchable(root) {
			return "", nil
		}
		return "", fmt.Errorf("%s: %s", root, errText(err))
	}
	w := &walker{buf: make([]byte, 32<<10), budget: budget}
	return w.dir(fd, root, 0)
}

type walker struct {
	buf    []byte
	budget *int
}

// dir examines the directory open as fd (and closes it).
func (w *walker) dir(fd int, path string, depth int) (string, error) {
	defer unix.Close(fd)
	if depth >= MaxWalkDepth {
		return "", fmt.Errorf("%s: %w (deeper than %d)", path, errWalkBudget, MaxWalkDepth)
	}
	var subdirs []string
	for {
		n, err := unix.Getdents(fd, w.buf)
		if err != nil {
			return "", fmt.Errorf("%s: %s", path, errText(err))
		}
		if n <= 0 {
			break
		}
		for b := w.buf[:n]; len(b) >= 19; {
			reclen := int(binary.NativeEndian.Uint16(b[16:18]))
			if reclen < 19 || reclen > len(b) {
				return "", fmt.Errorf("BUG: %s: bad dirent length %d", path, reclen)
			}
			typ, name := b[18], b[19:reclen]
			b = b[reclen:]
			for i, c := range name {
				if c == 0 {
					name = name[:i]
					break
				}
			}
			if len(name) == 0 || name[0] == '.' && (len(name) == 1 || len(name) == 2 && name[1] == '.') {
				continue
			}
			*w.budget--
			if *w.budget < 0 {
				return "", errWalkBudget
			}
			if typ == unix.DT_UNKNOWN {
				var st unix.Stat_t
				if err := unix.Fstatat(fd, string(name), &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
					return "", fmt.Errorf("%s: %s", filepath.Join(path, string(name)), errText(err))
				}
				switch st.Mode & unix.S_IFMT {
				case unix.S_IFSOCK:
					typ = unix.DT_SOCK
				case unix.S_IFDIR:
					typ = unix.DT_DIR
				}
			}
			switch typ {
			case unix.DT_SOCK:
				return filepath.Join(path, string(name)), nil
			case unix.DT_DIR:
				subdirs = append(subdirs, string(name))
			}
		}
	}
	for _, name := range subdirs {
		sub := filepath.Join(path, name)
		cfd, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			// A directory moat cannot search is one the workload, which
			// has no more rights than moat, cannot reach into either.
			if errors.Is(err, unix.EACCES) && !searchable(sub) {
				continue
			}
			return "", fmt.Errorf("%s: %s", sub, errText(err))
		}
		if s, err := w.dir(cfd, sub, depth+1); s != "" || err != nil {
			return s, err
		}
	}
	return "", nil
}
