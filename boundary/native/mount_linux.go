package native

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
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

// grant is one host path bound into the sandbox at the same path.
type grant struct {
	Path  string `json:"path"`
	Write bool   `json:"write"`
	// Idmapped grants arrive from the supervisor as detached idmapped
	// mounts (root-owned read_write grants when moat runs as root).
	Idmapped bool `json:"idmapped,omitempty"`
}

// clonedTree is a detached copy of a host path, ready to be attached.
type clonedTree struct {
	grant
	fd  int
	dir bool
}

// buildRoot builds the sandbox's root and pivots into it. It runs in the
// init, which is uid 0 of a fresh user namespace that owns a fresh mount
// namespace. On return the process's root is the new tmpfs and nothing of
// the host is reachable by path.
func buildRoot(cfg *initConfig, recvGrant func(grant) (int, error)) error {
	// Nothing we mount may propagate back to the host.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making / recursively private: %w", err)
	}
	grants := cfg.Grants
	var trees []clonedTree
	defer func() {
		for _, t := range trees {
			unix.Close(t.fd)
		}
	}()
	for _, g := range cfg.Grants {
		// In the order the supervisor sends them.
		if !g.Idmapped {
			continue
		}
		fd, err := recvGrant(g)
		if err != nil {
			return fmt.Errorf("idmapped grant %s: %w", g.Path, err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			unix.Close(fd)
			return err
		}
		trees = append(trees, clonedTree{grant: g, fd: fd, dir: st.Mode&unix.S_IFMT == unix.S_IFDIR})
	}
	for _, g := range grants {
		if g.Idmapped {
			continue
		}
		t, err := cloneTree(g)
		if err != nil {
			return err
		}
		trees = append(trees, t)
	}
	sort.SliceStable(trees, func(i, j int) bool { return trees[i].Path < trees[j].Path })
	var devs []clonedTree
	defer func() {
		for _, t := range devs {
			unix.Close(t.fd)
		}
	}()
	for _, n := range devNodes {
		fd, err := unix.OpenTree(unix.AT_FDCWD, "/dev/"+n, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
		if err != nil {
			return fmt.Errorf("cloning /dev/%s: %w", n, err)
		}
		devs = append(devs, clonedTree{grant: grant{Path: "/dev/" + n, Write: true}, fd: fd})
		if err := setAttr(fd, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NOEXEC, false); err != nil {
			return fmt.Errorf("/dev/%s: %w", n, err)
		}
	}

	root, err := newTmpfs(rootTmpfsSize, "0755", 0)
	if err != nil {
		return fmt.Errorf("root tmpfs: %w", err)
	}
	defer unix.Close(root)
	if err := unix.MoveMount(root, "", unix.AT_FDCWD, stagingPoint, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("attaching the root tmpfs at %s: %w", stagingPoint, err)
	}
	stage := func(p string) string { return filepath.Join(stagingPoint, p) }

	// /tmp first, so that grants below /tmp are mounted on top of it.
	tmp, err := newTmpfs(cfg.TmpSize, "1777", unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV)
	if err != nil {
		return fmt.Errorf("/tmp tmpfs: %w", err)
	}
	defer unix.Close(tmp)
	if err := attachAt(tmp, stage("tmp")); err != nil {
		return fmt.Errorf("/tmp: %w", err)
	}

	for _, t := range trees {
		if err := mountPoint(stage(t.Path), t.dir); err != nil {
			return fmt.Errorf("mount point for %s: %w", t.Path, err)
		}
		if err := unix.MoveMount(t.fd, "", unix.AT_FDCWD, stage(t.Path), unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return fmt.Errorf("attaching grant %s: %w", t.Path, err)
		}
	}
	if err := os.MkdirAll(stage("dev"), 0o755); err != nil {
		return err
	}
	for _, t := range devs {
		if err := mountPoint(stage(t.Path), false); err != nil {
			return err
		}
		if err := unix.MoveMount(t.fd, "", unix.AT_FDCWD, stage(t.Path), unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return fmt.Errorf("attaching %s: %w", t.Path, err)
		}
	}
	for name, target := range map[string]string{"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"} {
		if err := os.Symlink(target, stage("dev/"+name)); err != nil {
			return err
		}
	}

	proc, err := newFS("proc", nil, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC)
	if err != nil {
		return fmt.Errorf("proc: %w", err)
	}
	defer unix.Close(proc)
	if err := attachAt(proc, stage("proc")); err != nil {
		return fmt.Errorf("/proc: %w", err)
	}

	// The skeleton is read-only: nothing can be created at the top.
	if err := unix.MountSetattr(unix.AT_FDCWD, stagingPoint, 0, &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}); err != nil {
		return fmt.Errorf("making the root read-only: %w", err)
	}
	if err := unix.Chdir(stagingPoint); err != nil {
		return err
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detaching the old root: %w", err)
	}
	return unix.Chdir("/")
}

// cloneTree makes a detached recursive copy of g.Path with the grant's
// attributes: read-only grants rdonly,nosuid,nodev; read-write nosuid,nodev.
func cloneTree(g grant) (clonedTree, error) {
	if !filepath.IsAbs(g.Path) || filepath.Clean(g.Path) != g.Path || g.Path == "/" {
		return clonedTree{}, fmt.Errorf("grant %q: must be a clean absolute path other than /", g.Path)
	}
	fd, err := unix.OpenTree(unix.AT_FDCWD, g.Path, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
	if err != nil {
		return clonedTree{}, fmt.Errorf("cloning grant %s: %w", g.Path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return clonedTree{}, err
	}
	attr := uint64(unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV)
	if !g.Write {
		attr |= unix.MOUNT_ATTR_RDONLY
	}
	if err := setAttr(fd, attr, true); err != nil {
		unix.Close(fd)
		return clonedTree{}, fmt.Errorf("grant %s: %w", g.Path, err)
	}
	return clonedTree{grant: g, fd: fd, dir: st.Mode&unix.S_IFMT == unix.S_IFDIR}, nil
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

// isUnder reports whether p is dir or below it.
func isUnder(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, strings.TrimSuffix(dir, "/")+"/")
}

// idmappedClone makes, in the supervisor (root), a detached recursive copy
// of path whose owners are mapped through the user namespace usernsFD:
// with the init's namespace (0 → host_uid), root-owned files appear as the
// workload's own, and its writes land on disk as root.
func idmappedClone(path string, usernsFD int) (int, error) {
	fd, err := unix.OpenTree(unix.AT_FDCWD, path, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
	if err != nil {
		return -1, fmt.Errorf("open_tree: %w", err)
	}
	attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV,
		Propagation: unix.MS_PRIVATE, Userns_fd: uint64(usernsFD)}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, attr); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("mount_setattr MOUNT_ATTR_IDMAP: %w", err)
	}
	return fd, nil
}
