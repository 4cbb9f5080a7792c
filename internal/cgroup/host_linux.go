package cgroup

import (
	"bufio"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultRoot is where the cgroup file systems are mounted.
const DefaultRoot = "/sys/fs/cgroup"

// maxProcLines caps how many lines are read from /proc/self/mountinfo and
// /proc/self/cgroup; maxFileBytes what is read of one cgroup file.
const (
	maxProcLines = 100_000
	maxFileBytes = 1 << 20
)

// Mount is one cgroup or cgroup2 file system (a mountinfo line).
type Mount struct {
	Root   string // the hierarchy's directory mounted there ("/" usually)
	Point  string // the mount point
	FSType string // "cgroup" (v1) or "cgroup2"
	Super  string // super options: a v1 hierarchy's controllers
}

// Host is what the decisions depend on: the cgroup mounts, this process's
// cgroups and its effective uid.
type Host struct {
	Mounts []Mount
	// Own maps each v1 controller (and "name=systemd"-style names) to this
	// process's cgroup path in it, and "" to its cgroup v2 path.
	Own  map[string]string
	Euid int
}

// ReadHost reads this process's view of the host.
func ReadHost() (*Host, error) {
	h := &Host{Own: map[string]string{}, Euid: os.Geteuid()}
	err := readLines("/proc/self/mountinfo", func(line string) {
		if m, ok := ParseMountinfoLine(line); ok && (m.FSType == "cgroup" || m.FSType == "cgroup2") {
			h.Mounts = append(h.Mounts, m)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("reading /proc/self/mountinfo: %w", err)
	}
	err = readLines("/proc/self/cgroup", func(line string) { ParseCgroupLine(h.Own, line) })
	if err != nil {
		return nil, fmt.Errorf("reading /proc/self/cgroup: %w", err)
	}
	return h, nil
}

// Unified reports whether DefaultRoot itself is a cgroup v2 file system
// (a pure v2 host), and Hybrid whether a v2 hierarchy is mounted beside
// v1 ones.
func (h *Host) Unified() bool {
	for _, m := range h.Mounts {
		if m.Point == DefaultRoot {
			return m.FSType == "cgroup2"
		}
	}
	return false
}

// Hybrid: v1 hierarchies and a v2 one are both mounted.
func (h *Host) Hybrid() bool {
	var v1, v2 bool
	for _, m := range h.Mounts {
		v1 = v1 || m.FSType == "cgroup"
		v2 = v2 || m.FSType == "cgroup2"
	}
	return v1 && v2
}

// ParseMountinfoLine parses one /proc/<pid>/mountinfo line.
func ParseMountinfoLine(line string) (Mount, bool) {
	pre, post, ok := strings.Cut(line, " - ")
	if !ok {
		return Mount{}, false
	}
	f, g := strings.Fields(pre), strings.Fields(post)
	if len(f) < 5 || len(g) < 3 {
		return Mount{}, false
	}
	return Mount{Root: unescape(f[3]), Point: unescape(f[4]), FSType: g[0], Super: g[2]}, true
}

// ParseCgroupLine adds one /proc/<pid>/cgroup line ("id:controllers:path")
// to own. Only clean absolute paths are kept.
func ParseCgroupLine(own map[string]string, line string) {
	parts := strings.SplitN(line, ":", 3)
	if len(parts) != 3 || !filepath.IsAbs(parts[2]) || filepath.Clean(parts[2]) != parts[2] {
		return
	}
	if parts[1] == "" {
		if parts[0] == "0" {
			own[""] = parts[2]
		}
		return
	}
	for _, c := range strings.Split(parts[1], ",") {
		if c != "" {
			own[c] = parts[2]
		}
	}
}

// unescape undoes mountinfo's octal escapes (\040 for space, …).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && isOct(s[i+1]) && isOct(s[i+2]) && isOct(s[i+3]) {
			b.WriteByte((s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0'))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOct(c byte) bool { return c >= '0' && c <= '7' }

func readLines(path string, fn func(string)) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for n := 0; sc.Scan() && n < maxProcLines; n++ {
		fn(sc.Text())
	}
	return sc.Err()
}

// Dir maps a cgroup path from /proc/self/cgroup to a directory under the
// mount point, allowing for a mount whose root is not the hierarchy's.
func Dir(m Mount, path string) string {
	rel := path
	if m.Root != "/" {
		if r, ok := strings.CutPrefix(path, m.Root); ok && (r == "" || r[0] == '/') {
			rel = r
		}
	}
	return filepath.Join(m.Point, "/", rel)
}

// Info is what the decisions read of a file's metadata.
type Info struct {
	UID     int
	Mode    fs.FileMode
	ModTime time.Time
}

// FS is what this package does to a cgroup file system. Paths are
// absolute.
type FS interface {
	Mkdir(dir string) error
	Rmdir(dir string) error
	ReadDir(dir string) ([]fs.DirEntry, error)
	ReadFile(name string) ([]byte, error)
	// WriteFile writes data to an existing file (never creating one).
	WriteFile(name string, data []byte) error
	Stat(name string) (Info, error)
	// Lock opens dir and takes an exclusive flock on it without waiting;
	// it fails if another open file holds one.
	Lock(dir string) (*os.File, error)
}

// OS is the real file system.
type OS struct{}

func (OS) Mkdir(dir string) error                    { return os.Mkdir(dir, 0o755) }
func (OS) Rmdir(dir string) error                    { return pathErr("rmdir", dir, syscall.Rmdir(dir)) }
func (OS) ReadDir(dir string) ([]fs.DirEntry, error) { return os.ReadDir(dir) }

func (OS) ReadFile(name string) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, maxFileBytes))
}

func (OS) WriteFile(name string, data []byte) error {
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func (OS) Stat(name string) (Info, error) {
	st, err := os.Stat(name)
	if err != nil {
		return Info{}, err
	}
	uid := -1
	if s, ok := st.Sys().(*syscall.Stat_t); ok {
		uid = int(s.Uid)
	}
	return Info{UID: uid, Mode: st.Mode(), ModTime: st.ModTime()}, nil
}

func (OS) Lock(dir string) (*os.File, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, pathErr("flock", dir, err)
	}
	return f, nil
}

func pathErr(op, path string, err error) error {
	if err == nil {
		return nil
	}
	return &os.PathError{Op: op, Path: path, Err: err}
}

// errText is the bare reason of a path error (the path is said anyway).
func errText(err error) string {
	if pe, ok := err.(*os.PathError); ok {
		return pe.Err.Error()
	}
	return err.Error()
}
