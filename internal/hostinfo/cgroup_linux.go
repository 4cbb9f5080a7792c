package hostinfo

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// CgroupRoot is where the cgroup file systems are mounted.
const CgroupRoot = "/sys/fs/cgroup"

// maxProcLines caps how many lines are read from /proc/self/mountinfo and
// /proc/self/cgroup.
const maxProcLines = 100_000

type mount struct{ root, point, fstype, super string }

// Cgroups measures cgroup support for this process: it creates (and
// removes at once) a child cgroup where the memory and pids controllers
// apply, and reports what happened.
func Cgroups() CgroupInfo {
	var info CgroupInfo
	mounts, err := mountinfo()
	if err != nil {
		info.Reason = "cannot read /proc/self/mountinfo: " + err.Error()
		return info
	}
	own, err := ownCgroups()
	if err != nil {
		info.Reason = "cannot read /proc/self/cgroup: " + err.Error()
		return info
	}
	var st unix.Statfs_t
	if err := unix.Statfs(CgroupRoot, &st); err != nil {
		info.Reason = fmt.Sprintf("cannot stat %s: %v", CgroupRoot, err)
		return info
	}
	if st.Type == unix.CGROUP2_SUPER_MAGIC {
		info.Version = 2
		cgroupV2(&info, mounts, own[""])
	} else {
		info.Version = 1
		info.Hybrid = slices.ContainsFunc(mounts, func(m mount) bool { return m.fstype == "cgroup2" })
		info.Memory = cgroupV1("memory", mounts, own)
		info.Pids = cgroupV1("pids", mounts, own)
	}
	info.Delegated = info.Memory.Writable && info.Pids.Writable
	if !info.Delegated && info.Reason == "" {
		var why []string
		for _, c := range []struct {
			name string
			c    CgroupController
		}{{"memory", info.Memory}, {"pids", info.Pids}} {
			if !c.c.Writable {
				why = append(why, c.name+": "+c.c.Reason)
			}
		}
		info.Reason = strings.Join(why, "; ")
		if info.Version == 1 && os.Geteuid() != 0 {
			info.Reason += "; moat enforces memory and pids limits as root on cgroup v1 only: run moat as root"
		}
	}
	// What moat implements: cgroup v1, as root. (cgroup v2, and delegation
	// to unprivileged users, are not managed yet: never advise them.)
	if info.Delegated && info.Version == 2 {
		info.Delegated = false
		info.Reason = "this host uses cgroup v2, which moat does not manage yet: memory and pids limits are not enforced here"
	}
	return info
}

func cgroupV1(ctrl string, mounts []mount, own map[string]string) CgroupController {
	i := slices.IndexFunc(mounts, func(m mount) bool {
		return m.fstype == "cgroup" && slices.Contains(strings.Split(m.super, ","), ctrl)
	})
	if i < 0 {
		return CgroupController{Reason: "the " + ctrl + " controller is not mounted"}
	}
	path, ok := own[ctrl]
	if !ok {
		return CgroupController{Reason: "/proc/self/cgroup has no " + ctrl + " line"}
	}
	c := CgroupController{Dir: cgroupDir(mounts[i], path)}
	if _, err := os.Stat(c.Dir); err != nil {
		c.Reason = err.Error()
		return c
	}
	c.Available = true
	child, err := makeChild(c.Dir)
	if err != nil {
		c.Reason = fmt.Sprintf("cannot create a child cgroup in %s: %v", c.Dir, errText(err))
		return c
	}
	os.Remove(child)
	c.Writable = true
	return c
}

func cgroupV2(info *CgroupInfo, mounts []mount, path string) {
	i := slices.IndexFunc(mounts, func(m mount) bool { return m.fstype == "cgroup2" && m.point == CgroupRoot })
	if i < 0 {
		info.Reason = "no cgroup2 file system at " + CgroupRoot
		return
	}
	dir := cgroupDir(mounts[i], path)
	info.Memory.Dir, info.Pids.Dir = dir, dir
	avail, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	if err != nil {
		info.Reason = err.Error()
		return
	}
	have := strings.Fields(string(avail))
	child, err := makeChild(dir)
	var childCtrl []string
	if err == nil {
		b, _ := os.ReadFile(filepath.Join(child, "cgroup.controllers"))
		childCtrl = strings.Fields(string(b))
		os.Remove(child)
	}
	for _, c := range []struct {
		name string
		dst  *CgroupController
	}{{"memory", &info.Memory}, {"pids", &info.Pids}} {
		c.dst.Available = slices.Contains(have, c.name)
		switch {
		case !c.dst.Available:
			c.dst.Reason = fmt.Sprintf("%s is not in %s/cgroup.controllers", c.name, dir)
		case err != nil:
			c.dst.Reason = fmt.Sprintf("cannot create a child cgroup in %s: %v", dir, errText(err))
		case !slices.Contains(childCtrl, c.name):
			c.dst.Reason = fmt.Sprintf("%s is not enabled in %s/cgroup.subtree_control", c.name, dir)
		default:
			c.dst.Writable = true
		}
	}
}

// cgroupDir maps a cgroup path from /proc/self/cgroup to a directory under
// the mount point, allowing for a mount whose root is not the hierarchy's.
func cgroupDir(m mount, path string) string {
	rel := path
	if m.root != "/" {
		if r, ok := strings.CutPrefix(path, m.root); ok {
			rel = r
		}
	}
	return filepath.Join(m.point, rel)
}

func makeChild(dir string) (string, error) {
	child := filepath.Join(dir, fmt.Sprintf("moat-probe-%d-%d", os.Getpid(), time.Now().UnixNano()))
	if err := os.Mkdir(child, 0o755); err != nil {
		return "", err
	}
	return child, nil
}

func errText(err error) string {
	if pe, ok := err.(*os.PathError); ok {
		return pe.Err.Error()
	}
	return err.Error()
}

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

func mountinfo() ([]mount, error) {
	var out []mount
	err := readLines("/proc/self/mountinfo", func(line string) {
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			return
		}
		f, g := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(g) < 3 {
			return
		}
		out = append(out, mount{root: unescape(f[3]), point: unescape(f[4]), fstype: g[0], super: g[2]})
	})
	return out, err
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

// ownCgroups maps each v1 controller (and "" for the v2 hierarchy) to this
// process's cgroup path.
func ownCgroups() (map[string]string, error) {
	out := map[string]string{}
	err := readLines("/proc/self/cgroup", func(line string) {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			return
		}
		if parts[1] == "" {
			out[""] = parts[2]
			return
		}
		for _, c := range strings.Split(parts[1], ",") {
			out[c] = parts[2]
		}
	})
	return out, err
}
