package evidence

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"
)

// maxHashed caps the content the host hashes for a PathRecord.
const maxHashed = 1 << 20

// lstatRecord is the host's view of abs, recorded as rel. A regular
// file's content is hashed through a descriptor opened without following
// a symlink or blocking on a FIFO, and checked to be the file lstat saw.
func lstatRecord(when, abs, rel string) PathRecord {
	p := PathRecord{When: when, Path: rel}
	var st unix.Stat_t
	if err := unix.Lstat(abs, &st); err != nil {
		if !errors.Is(err, unix.ENOENT) {
			p.Err = "lstat: " + err.Error()
		}
		return p
	}
	p.Exists, p.Mode, p.UID, p.GID = true, st.Mode, st.Uid, st.Gid
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFLNK:
		l, err := os.Readlink(abs)
		if err != nil {
			p.Err = "readlink: " + err.Error()
		}
		p.Link = l
	case unix.S_IFREG:
		fd, err := unix.Open(abs, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			p.Err = "open: " + err.Error()
			return p
		}
		f := os.NewFile(uintptr(fd), abs)
		defer f.Close()
		var fst unix.Stat_t
		if err := unix.Fstat(fd, &fst); err != nil || fst.Ino != st.Ino || fst.Dev != st.Dev {
			p.Err = "the file changed while it was observed"
			return p
		}
		h := sha256.New()
		if _, err := io.Copy(h, io.LimitReader(f, maxHashed)); err != nil {
			p.Err = "read: " + err.Error()
			return p
		}
		p.SHA256 = hex.EncodeToString(h.Sum(nil))
	}
	return p
}

// inotifyAs makes (and closes) one inotify instance with effective uid
// uid, and says "ok" or why it could not. The uid is changed on a locked
// thread of its own with the raw system call (Go's syscall.Setuid would
// change every thread); the saved uid stays, and the thread is put back,
// or never reused if that fails.
func inotifyAs(uid int) string {
	if uid == os.Geteuid() {
		return inotifyOnce()
	}
	res := make(chan string, 1)
	go func() {
		runtime.LockOSThread()
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, uintptr(uid), uintptr(uid), ^uintptr(0)); e != 0 {
			runtime.UnlockOSThread()
			res <- fmt.Sprintf("harness: setresuid(%d): %v", uid, e)
			return
		}
		r := inotifyOnce()
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, 0, 0, ^uintptr(0)); e != 0 {
			// Leave the thread locked: it ends with this goroutine.
			res <- r
			return
		}
		runtime.UnlockOSThread()
		res <- r
	}()
	return <-res
}

func inotifyOnce() string {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		return "inotify_init1: " + err.Error()
	}
	unix.Close(fd)
	return "ok"
}

// inotifyFDs counts the inotify descriptors the given processes hold, as
// the host sees them in /proc/<pid>/fd.
func inotifyFDs(pids []int) (int, error) {
	n := 0
	for _, pid := range pids {
		if pid <= 0 {
			continue
		}
		dir := "/proc/" + strconv.Itoa(pid) + "/fd"
		ents, err := os.ReadDir(dir)
		if err != nil {
			return -1, err
		}
		for _, e := range ents {
			if l, err := os.Readlink(dir + "/" + e.Name()); err == nil && l == "anon_inode:inotify" {
				n++
			} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
				return -1, err
			}
		}
	}
	return n, nil
}
