package fsutil

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Dir is a directory pinned by a descriptor. Files are created in it with
// openat and renamed with renameat relative to that descriptor, so nothing
// written through a Dir looks its path up again once it is open.
type Dir struct {
	f    *os.File
	path string
}

// OpenDir opens path as a directory with O_DIRECTORY|O_NOFOLLOW: the
// directory itself must not be a symlink (the components above it are
// resolved by the kernel as usual, once, here).
func OpenDir(path string) (*Dir, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			return nil, &os.PathError{Op: "open", Path: path, Err: fmt.Errorf("not a directory, or a symlink (which moat does not follow here): %w", err)}
		}
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return &Dir{f: os.NewFile(uintptr(fd), path), path: path}, nil
}

// Path is the path the directory was opened with.
func (d *Dir) Path() string { return d.path }

// Fd is the directory's descriptor.
func (d *Dir) Fd() int { return int(d.f.Fd()) }

// Close releases the descriptor.
func (d *Dir) Close() error { return d.f.Close() }

// checkName refuses anything but one plain path component.
func checkName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsRune(name, '/') || strings.ContainsRune(name, 0) {
		return fmt.Errorf("%q is not a file name", name)
	}
	return nil
}

// WriteFile replaces name in d with data, atomically: a temporary file
// created in d with O_EXCL|O_NOFOLLOW and mode perm is written, fsynced and
// renamed over name, and then d is fsynced. The rename replaces whatever
// name was (a symlink included) without following it: nothing outside d is
// ever opened or written. On error nothing is left behind but name's
// previous content.
func (d *Dir) WriteFile(name string, data []byte, perm os.FileMode) error {
	if err := checkName(name); err != nil {
		return err
	}
	dfd := d.Fd()
	var (
		tmp string
		fd  int
		err error
	)
	for i := 0; i < 8; i++ {
		var r [8]byte
		if _, err := rand.Read(r[:]); err != nil {
			return err
		}
		tmp = "." + name + ".tmp-" + hex.EncodeToString(r[:])
		if len(tmp) > 255 {
			tmp = ".moat.tmp-" + hex.EncodeToString(r[:])
		}
		fd, err = unix.Openat(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, uint32(perm.Perm()))
		if !errors.Is(err, unix.EEXIST) {
			break
		}
	}
	if err != nil {
		return &os.PathError{Op: "create", Path: filepath.Join(d.path, tmp), Err: err}
	}
	f := os.NewFile(uintptr(fd), filepath.Join(d.path, tmp))
	fail := func(err error) error {
		f.Close()
		unix.Unlinkat(dfd, tmp, 0)
		return err
	}
	// The umask may have narrowed perm; the caller's mode is what it asked.
	if err := f.Chmod(perm.Perm()); err != nil {
		return fail(err)
	}
	if _, err := f.Write(data); err != nil {
		return fail(err)
	}
	if err := f.Sync(); err != nil {
		return fail(err)
	}
	if err := f.Close(); err != nil {
		unix.Unlinkat(dfd, tmp, 0)
		return err
	}
	if err := unix.Renameat(dfd, tmp, dfd, name); err != nil {
		unix.Unlinkat(dfd, tmp, 0)
		return &os.LinkError{Op: "rename", Old: filepath.Join(d.path, tmp), New: filepath.Join(d.path, name), Err: err}
	}
	if err := unix.Fsync(dfd); err != nil {
		return &os.PathError{Op: "fsync", Path: d.path, Err: err}
	}
	return nil
}

// WriteFileAtomic writes path through its parent directory, opened with
// OpenDir, as Dir.WriteFile does.
func WriteFileAtomic(path string, data []byte, perm os.FileMode) error {
	d, err := OpenDir(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.WriteFile(filepath.Base(path), data, perm)
}

// FileID names an inode: device and inode number.
type FileID struct{ Dev, Ino uint64 }

func idOf(st *unix.Stat_t) FileID { return FileID{Dev: uint64(st.Dev), Ino: uint64(st.Ino)} }

// StatID returns the id of what path names, following symlinks.
func StatID(path string) (FileID, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return FileID{}, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	return idOf(&st), nil
}

// EntryID returns the id of name in d without following a symlink there;
// ok is false when there is no such entry.
func (d *Dir) EntryID(name string) (id FileID, ok bool, err error) {
	if err := checkName(name); err != nil {
		return FileID{}, false, err
	}
	var st unix.Stat_t
	err = unix.Fstatat(d.Fd(), name, &st, unix.AT_SYMLINK_NOFOLLOW)
	if errors.Is(err, unix.ENOENT) {
		return FileID{}, false, nil
	}
	if err != nil {
		return FileID{}, false, &os.PathError{Op: "stat", Path: filepath.Join(d.path, name), Err: err}
	}
	return idOf(&st), true, nil
}

// Ancestors returns the ids of d and of every directory above it, up to
// the root of this mount namespace, found by opening ".." from the
// descriptor (never by path). A mount point shows as the mounted root.
func (d *Dir) Ancestors() ([]FileID, error) {
	var st unix.Stat_t
	if err := unix.Fstat(d.Fd(), &st); err != nil {
		return nil, err
	}
	out := []FileID{idOf(&st)}
	cur := -1
	defer func() {
		if cur >= 0 {
			unix.Close(cur)
		}
	}()
	from := d.Fd()
	for i := 0; i < 4096; i++ {
		next, err := unix.Openat(from, "..", pathOnlyFlag|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("walking up from %s: %w", d.path, err)
		}
		if cur >= 0 {
			unix.Close(cur)
		}
		cur, from = next, next
		if err := unix.Fstat(cur, &st); err != nil {
			return nil, err
		}
		id := idOf(&st)
		if id == out[len(out)-1] {
			return out, nil // ".." of the root is the root
		}
		out = append(out, id)
	}
	return nil, fmt.Errorf("walking up from %s: too deep", d.path)
}
