package native

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/grants"
	"github.com/moat-sandbox/moat/policy"
)

// Volumes are the policy's size-capped read-write file systems: an ext4
// image file on the host, which moat creates (sparse, with mkfs.ext4, its
// root owned by the workload's host uid) when it is missing, attaches to
// a loop device (autoclear) and mounts, as root, as a detached mount; the
// init attaches that mount inside like a grant. The workload's disk use
// there is capped by the image's size, which is the one way moat can cap
// disk use (a quota on a host directory needs project quotas that the
// host's file system may not have). Loop devices need root: rootless, a
// policy with volumes is refused.
//
// The image is the workload's file system, so it is opened without
// following symlinks (through its directory, resolved like a grant), must
// be a regular file owned by moat's uid that no one else can read or
// write, and must have the size the policy says.

// mkfsPaths are where mkfs.ext4 is looked for (never through PATH: moat
// runs it as root).
var mkfsPaths = []string{"/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4"}

func mkfsPath() (string, error) {
	for _, p := range mkfsPaths {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("mkfs.ext4 not found in %v (install e2fsprogs)", mkfsPaths)
}

// volumeMount opens or creates v's image and returns a detached mount of
// its file system (nosuid, nodev, errors=remount-ro) and the image, locked
// (flock, exclusive) for as long as the caller keeps it open: one image is
// never mounted by two runs at once (two kernels writing one ext4 image
// corrupt it, and hand the second a file system its workload shaped:
// found by attack).
func volumeMount(v policy.Volume, hostUID, hostGID int) (int, *os.File, error) {
	if os.Geteuid() != 0 {
		return -1, nil, fmt.Errorf("volume %s: volumes need root (a loop device); run moat as root or use a read_write grant", v.Path)
	}
	img, err := openImage(v, hostUID, hostGID)
	if err != nil {
		return -1, nil, err
	}
	m, err := mountImage(v, img, hostUID)
	if err != nil {
		img.Close()
		return -1, nil, err
	}
	return m, img, nil
}

func mountImage(v policy.Volume, img *os.File, hostUID int) (int, error) {
	loop, err := attachLoop(img)
	if err != nil {
		return -1, fmt.Errorf("volume %s: loop device for %s: %w", v.Path, v.Image, err)
	}
	defer loop.Close()
	fs, err := unix.Fsopen("ext4", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("volume %s: fsopen ext4: %w", v.Path, err)
	}
	defer unix.Close(fs)
	if err := unix.FsconfigSetString(fs, "source", loop.Name()); err != nil {
		return -1, fmt.Errorf("volume %s: %w", v.Path, err)
	}
	if err := unix.FsconfigSetString(fs, "errors", "remount-ro"); err != nil {
		return -1, fmt.Errorf("volume %s: %w", v.Path, err)
	}
	if err := unix.FsconfigCreate(fs); err != nil {
		return -1, fmt.Errorf("volume %s: mounting %s (is it an ext4 image?): %w", v.Path, v.Image, err)
	}
	m, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV)
	if err != nil {
		return -1, fmt.Errorf("volume %s: fsmount: %w", v.Path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(m, &st); err != nil || int(st.Uid) != hostUID {
		unix.Close(m)
		return -1, fmt.Errorf("volume %s: the root of %s is owned by uid %d, not the workload's host uid %d; remove the image to have it made anew", v.Path, v.Image, st.Uid, hostUID)
	}
	return m, nil
}

// openImage opens v's image read-write and locks it, creating it when
// missing: made under a temporary name (locked, formatted) and given its
// name only once it is a file system, so that no run ever opens a half
// made image.
func openImage(v policy.Volume, hostUID, hostGID int) (*os.File, error) {
	dir := filepath.Dir(v.Image)
	pl, err := grants.Resolve([]grants.Spec{{Key: "volume image directory", Path: dir}}, "")
	if err != nil {
		return nil, fmt.Errorf("volume %s: %w", v.Path, err)
	}
	dfd, err := pl.Mounts[0].Open(grants.Checks{WriteOwner: -1})
	if err != nil {
		return nil, fmt.Errorf("volume %s: %w", v.Path, err)
	}
	defer unix.Close(dfd)
	name := filepath.Base(v.Image)
	fail := func(format string, a ...any) (*os.File, error) {
		return nil, fmt.Errorf("volume %s: image %s: "+format, append([]any{v.Path, v.Image}, a...)...)
	}
	for range 2 {
		fd, err := unix.Openat(dfd, name, unix.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOENT) {
			f, err := createImage(dfd, name, v, hostUID, hostGID)
			if errors.Is(err, unix.EEXIST) {
				continue // made meanwhile by another run: open that one
			}
			if err != nil {
				return fail("%v", err)
			}
			return f, nil
		}
		if err != nil {
			return fail("opening it: %v", err)
		}
		f := os.NewFile(uintptr(fd), v.Image)
		if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			return fail("in use by another run (%v); a volume serves one sandbox at a time", err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			f.Close()
			return fail("%v", err)
		}
		var bad string
		switch {
		case st.Mode&unix.S_IFMT != unix.S_IFREG:
			bad = "not a regular file"
		case int(st.Uid) != os.Geteuid() || st.Mode&0o077 != 0:
			bad = fmt.Sprintf("owned by uid %d with mode %#o; an image must be moat's own (uid %d) and mode 0600: anyone else able to write it could hand the kernel a crafted file system", st.Uid, st.Mode&0o7777, os.Geteuid())
		case st.Nlink != 1:
			bad = fmt.Sprintf("has %d links; an image must have one name", st.Nlink)
		case st.Size != int64(v.Size):
			bad = fmt.Sprintf("is %d bytes, the policy says %d; remove it to have it made anew at the new size", st.Size, int64(v.Size))
		}
		if bad != "" {
			f.Close()
			return fail("%s", bad)
		}
		return f, nil
	}
	return fail("it keeps changing while moat opens it")
}

// createImage makes a formatted image under a temporary name and renames
// it to name (never over an existing one: EEXIST); the file it returns is
// locked.
func createImage(dfd int, name string, v policy.Volume, hostUID, hostGID int) (*os.File, error) {
	mkfs, err := mkfsPath()
	if err != nil {
		return nil, err
	}
	var r [8]byte
	rand.Read(r[:])
	tmp := "." + name + ".moat-" + hex.EncodeToString(r[:])
	fd, err := unix.Openat(dfd, tmp, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), v.Image)
	done := false
	defer func() {
		if !done {
			f.Close()
			unix.Unlinkat(dfd, tmp, 0)
		}
	}()
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return nil, err
	}
	if err := f.Truncate(int64(v.Size)); err != nil {
		return nil, err
	}
	cmd := exec.Command(mkfs, "-q", "-F", "-m", "0", "-E", "root_owner="+strconv.Itoa(hostUID)+":"+strconv.Itoa(hostGID), "/dev/fd/3")
	cmd.Env = []string{}
	cmd.ExtraFiles = []*os.File{f}
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("%s: %v: %s", mkfs, err, out)
	}
	if err := unix.Renameat2(dfd, tmp, dfd, name, unix.RENAME_NOREPLACE); err != nil {
		return nil, err
	}
	done = true
	return f, nil
}

// attachLoop attaches f to a free loop device that detaches by itself
// once nothing uses it.
func attachLoop(f *os.File) (*os.File, error) {
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	defer ctl.Close()
	for range 8 {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, fmt.Errorf("LOOP_CTL_GET_FREE: %w", err)
		}
		dev, err := os.OpenFile("/dev/loop"+strconv.Itoa(n), os.O_RDWR, 0)
		if err != nil {
			return nil, err
		}
		cfg := unix.LoopConfig{Fd: uint32(f.Fd())}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
		err = unix.IoctlLoopConfigure(int(dev.Fd()), &cfg)
		if err == nil {
			return dev, nil
		}
		dev.Close()
		if !errors.Is(err, unix.EBUSY) {
			return nil, fmt.Errorf("LOOP_CONFIGURE: %w", err)
		}
		// Taken by someone else between the two calls: try the next.
	}
	return nil, errors.New("no free loop device")
}
