package native

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/grants"
)

// devNodes are the only device nodes inside the sandbox, bind-mounted from
// the host because a user namespace cannot mknod.
var devNodes = []string{"null", "zero", "full", "random", "urandom"}

// stagingPoint is where the init attaches the new root's tmpfs inside its
// private mount namespace before pivot_root. The grants are cloned
// (open_tree) before it is mounted, so a grant below it is not hidden.
const stagingPoint = "/tmp"

// rootTmpfsSize bounds the tmpfs that holds the root's skeleton (mount
// points only; it is read-only once built).
const rootTmpfsSize = 1 << 20

// clonedTree is a detached copy of a granted tree, ready to be attached.
type clonedTree struct {
	path string // where it is attached inside (the grant's real path)
	fd   int
	dir  bool
}

// buildRoot builds the sandbox's root and pivots into it. It runs in the
// init, which is uid 0 of a fresh user namespace that owns a fresh mount
// namespace. On return the process's root is the new tmpfs and nothing of
// the host is reachable by path.
func buildRoot(cfg *initConfig, volumes []clonedTree) (ruleFDs []int, err error) {
	// Nothing we mount may propagate back to the host.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return nil, fmt.Errorf("making / recursively private: %w", err)
	}
	// Each grant is opened once, here, without following symlinks; the
	// checks run on that descriptor and the tree is cloned from it
	// (package grants). The plan is sorted parents first.
	var trees []clonedTree
	defer func() {
		if err != nil {
			for _, t := range trees {
				unix.Close(t.fd)
			}
		}
	}()
	for _, m := range cfg.Plan.Mounts {
		t, err := cloneTree(m)
		if err != nil {
			return nil, err
		}
		trees = append(trees, t)
	}
	// Volumes (mounted by the supervisor) come after the grants, in the
	// order of the Landlock rules; each is attached like a grant.
	trees = append(trees, volumes...)
	var devs []clonedTree
	defer func() {
		for _, t := range devs {
			unix.Close(t.fd)
		}
	}()
	for _, n := range devNodes {
		fd, err := unix.OpenTree(unix.AT_FDCWD, "/dev/"+n, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
		if err != nil {
			return nil, fmt.Errorf("cloning /dev/%s: %w", n, err)
		}
		devs = append(devs, clonedTree{path: "/dev/" + n, fd: fd})
		if err := setAttr(fd, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NOEXEC, false); err != nil {
			return nil, fmt.Errorf("/dev/%s: %w", n, err)
		}
	}

	root, err := newTmpfs(rootTmpfsSize, "0755", 0)
	if err != nil {
		return nil, fmt.Errorf("root tmpfs: %w", err)
	}
	defer unix.Close(root)
	if err := unix.MoveMount(root, "", unix.AT_FDCWD, stagingPoint, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return nil, fmt.Errorf("attaching the root tmpfs at %s: %w", stagingPoint, err)
	}
	stage := func(p string) string { return filepath.Join(stagingPoint, p) }

	// /tmp first, so that grants below /tmp are mounted on top of it.
	tmp, err := newTmpfs(cfg.TmpSize, "1777", unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV)
	if err != nil {
		return nil, fmt.Errorf("/tmp tmpfs: %w", err)
	}
	defer unix.Close(tmp)
	if err := attachAt(tmp, stage("tmp")); err != nil {
		return nil, fmt.Errorf("/tmp: %w", err)
	}

	// Mount points are made and opened beneath the staging root without
	// following symlinks: a nested grant's mount point lies inside an
	// earlier grant's tree, which a workload may have changed.
	stageFD, err := unix.Open(stagingPoint, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(stageFD)
	for _, t := range trees {
		to, err := mountPointAt(stageFD, t.path, t.dir)
		if err != nil {
			return nil, fmt.Errorf("mount point for grant %s: %w", t.path, err)
		}
		err = unix.MoveMount(t.fd, "", to, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH)
		unix.Close(to)
		if err != nil {
			return nil, fmt.Errorf("attaching grant %s: %w", t.path, err)
		}
	}
	// Trusted symlinks met while resolving (e.g. /bin -> usr/bin) are
	// recreated as symlinks, never mounted through.
	for _, l := range cfg.Plan.Links {
		dir, err := mountPointAt(stageFD, filepath.Dir(l.Path), true)
		if err != nil {
			return nil, fmt.Errorf("symlink %s: %w", l.Path, err)
		}
		err = unix.Symlinkat(l.Target, dir, filepath.Base(l.Path))
		unix.Close(dir)
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("symlink %s -> %s: %w", l.Path, l.Target, err)
		}
	}
	if err := os.MkdirAll(stage("dev"), 0o755); err != nil {
		return nil, err
	}
	for _, t := range devs {
		if err := mountPoint(stage(t.path), false); err != nil {
			return nil, err
		}
		if err := unix.MoveMount(t.fd, "", unix.AT_FDCWD, stage(t.path), unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return nil, fmt.Errorf("attaching %s: %w", t.path, err)
		}
	}
	for name, target := range map[string]string{"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"} {
		if err := os.Symlink(target, stage("dev/"+name)); err != nil {
			return nil, err
		}
	}

	proc, err := newFS("proc", nil, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC)
	if err != nil {
		return nil, fmt.Errorf("proc: %w", err)
	}
	defer unix.Close(proc)
	if err := attachAt(proc, stage("proc")); err != nil {
		return nil, fmt.Errorf("/proc: %w", err)
	}
	if err := maskProc(stage("proc")); err != nil {
		return nil, fmt.Errorf("masking /proc: %w", err)
	}

	// The skeleton is read-only: nothing can be created at the top.
	if err := unix.MountSetattr(unix.AT_FDCWD, stagingPoint, 0, &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}); err != nil {
		return nil, fmt.Errorf("making the root read-only: %w", err)
	}
	if err := unix.Chdir(stagingPoint); err != nil {
		return nil, err
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return nil, fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return nil, fmt.Errorf("detaching the old root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return nil, err
	}
	// The clones stay open: attached now, each is the Landlock rule's
	// descriptor for its grant (the same inode that was checked).
	for _, t := range trees {
		ruleFDs = append(ruleFDs, t.fd)
	}
	return ruleFDs, nil
}

// cloneTree opens the grant (grants.Mount.Open: no symlink followed, the
// planned inode, owned by this namespace's root when writable) and makes
// a detached recursive copy of it from that descriptor, with the grant's
// attributes: read-only grants rdonly,nosuid,nodev; read-write
// nosuid,nodev.
func cloneTree(m grants.Mount) (clonedTree, error) {
	pfd, err := m.Open(grants.Checks{WriteOwner: 0})
	if err != nil {
		return clonedTree{}, err
	}
	fd, err := unix.OpenTree(pfd, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE|unix.AT_EMPTY_PATH)
	unix.Close(pfd)
	if err != nil {
		return clonedTree{}, fmt.Errorf("cloning grant %s: %w", m.Path, err)
	}
	attr := uint64(unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV)
	if !m.Write {
		attr |= unix.MOUNT_ATTR_RDONLY
	}
	if err := setAttr(fd, attr, true); err != nil {
		unix.Close(fd)
		return clonedTree{}, fmt.Errorf("grant %s: %w", m.Path, err)
	}
	return clonedTree{path: m.Real, fd: fd, dir: m.Dir}, nil
}

// mountPointAt opens rel (an absolute path inside the new root) beneath
// the staging root, creating what is missing, and following no symlink:
// it returns an O_PATH descriptor to mount on.
func mountPointAt(rootFD int, rel string, dir bool) (int, error) {
	comps := strings.Split(strings.TrimPrefix(filepath.Clean(rel), "/"), "/")
	cur, err := unix.Openat(rootFD, ".", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	if rel == "/" {
		return cur, nil
	}
	how := &unix.OpenHow{Flags: unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_BENEATH}
	for i, c := range comps {
		last := i == len(comps)-1
		next, err := unix.Openat2(cur, c, how)
		if errors.Is(err, unix.ENOENT) {
			if !last || dir {
				err = unix.Mkdirat(cur, c, 0o755)
			} else {
				var f int
				f, err = unix.Openat(cur, c, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
				if err == nil {
					unix.Close(f)
				}
			}
			if err == nil || errors.Is(err, unix.EEXIST) {
				next, err = unix.Openat2(cur, c, how)
			}
		}
		unix.Close(cur)
		if err != nil {
			return -1, fmt.Errorf("%s: %w (a symlink, or changed while the sandbox was built)", rel, err)
		}
		cur = next
	}
	var st unix.Stat_t
	if err := unix.Fstat(cur, &st); err != nil || st.Mode&unix.S_IFMT == unix.S_IFLNK {
		unix.Close(cur)
		return -1, fmt.Errorf("%s: not a directory or file to mount on", rel)
	}
	return cur, nil
}

func setAttr(fd int, set uint64, recursive bool) error {
	flags := uint(unix.AT_EMPTY_PATH)
	if recursive {
		flags |= unix.AT_RECURSIVE
	}
	if err := unix.MountSetattr(fd, "", flags, &unix.MountAttr{Attr_set: set, Propagation: unix.MS_PRIVATE}); err != nil {
		return fmt.Errorf("mount_setattr: %w", err)
	}
	return nil
}

// mountPoint creates p (a directory, or an empty file when dir is false)
// and its parents, unless it exists already (inside an earlier grant).
func mountPoint(p string, dir bool) error {
	if _, err := os.Lstat(p); err == nil {
		return nil
	}
	if dir {
		return os.MkdirAll(p, 0o755)
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	return f.Close()
}

func newTmpfs(size int64, mode string, attrs int) (int, error) {
	return newFS("tmpfs", map[string]string{"size": strconv.FormatInt(size, 10), "mode": mode}, attrs)
}

// newFS creates a detached filesystem mount with the new mount API.
func newFS(fstype string, opts map[string]string, attrs int) (int, error) {
	fs, err := unix.Fsopen(fstype, unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("fsopen %s: %w", fstype, err)
	}
	defer unix.Close(fs)
	for k, v := range opts {
		if err := unix.FsconfigSetString(fs, k, v); err != nil {
			return -1, fmt.Errorf("fsconfig %s %s=%s: %w", fstype, k, v, err)
		}
	}
	if err := unix.FsconfigCreate(fs); err != nil {
		return -1, fmt.Errorf("fsconfig create %s: %w", fstype, err)
	}
	m, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, attrs)
	if err != nil {
		return -1, fmt.Errorf("fsmount %s: %w", fstype, err)
	}
	return m, nil
}

func attachAt(fd int, p string) error {
	if err := os.MkdirAll(p, 0o755); err != nil {
		return err
	}
	return unix.MoveMount(fd, "", unix.AT_FDCWD, p, unix.MOVE_MOUNT_F_EMPTY_PATH)
}

// procMasked are the host-wide /proc entries that leak what the host does
// (its command line and boot id, its load, memory, disks and interrupts),
// and pid 1's identity, which is moat's init. Each is covered with an
// empty read-only file (or directory); README lists what stays visible.
var procMasked = []string{
	"cmdline", "sys/kernel/random/boot_id", "pressure", "interrupts", "diskstats",
	"meminfo", "loadavg", "stat", "vmstat", "zoneinfo", "uptime", "softirqs",
	"partitions", "buddyinfo", "1/cmdline", "1/status",
}

// maskProc covers procMasked under dir (the sandbox's fresh procfs, not
// yet visible to anything but the init).
func maskProc(dir string) error {
	empty, err := newTmpfs(4096, "0555", unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC)
	if err != nil {
		return err
	}
	defer unix.Close(empty)
	f, err := unix.Openat(empty, "empty", unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o444)
	if err != nil {
		return fmt.Errorf("empty file: %w", err)
	}
	unix.Close(f)
	if err := setAttr(empty, unix.MOUNT_ATTR_RDONLY, false); err != nil {
		return err
	}
	for _, name := range procMasked {
		var st unix.Stat_t
		target := filepath.Join(dir, name)
		if err := unix.Lstat(target, &st); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue // not on this kernel
			}
			return fmt.Errorf("%s: %w", name, err)
		}
		src := "empty"
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			src = ""
		}
		flags := uint(unix.OPEN_TREE_CLONE | unix.OPEN_TREE_CLOEXEC)
		if src == "" {
			flags |= unix.AT_EMPTY_PATH
		}
		clone, err := unix.OpenTree(empty, src, flags)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		err = unix.MoveMount(clone, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH)
		unix.Close(clone)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	return nil
}
