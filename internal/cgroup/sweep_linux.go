package cgroup

import (
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// SweepGrace is how old a moat-* cgroup must be before Sweep considers
// it: longer than the moment between a cgroup's mkdir and its maker's
// flock, and than runsc takes to make its cgroups and put its sandbox in
// them (runsc's cgroups are not locked by moat).
const SweepGrace = time.Minute

// maxSweep bounds how many directories one sweep looks at.
const maxSweep = 20_000

// SweepDirs are the directories where moat makes cgroups, seen from this
// process: the root of every cgroup hierarchy (where runsc makes its
// moat-<run> cgroups), this process's cgroup in each v1 hierarchy (the
// native backend's, as root) and its delegated cgroup v2 directory.
func SweepDirs(h *Host) []string {
	var out []string
	add := func(d string) {
		if !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	for _, m := range h.Mounts {
		add(m.Point)
		var path string
		if m.FSType == "cgroup2" {
			path = h.Own[""]
		} else {
			for _, c := range strings.Split(m.Super, ",") {
				if p, ok := h.Own[c]; ok {
					path = p
					break
				}
			}
		}
		if path == "" {
			continue
		}
		d := Dir(m, path)
		if filepath.Base(d) == LeafName {
			d = filepath.Dir(d)
		}
		add(d)
	}
	return out
}

// Sweep removes the moat-* cgroups in dirs that their makers left: a
// directory is removed only when it is older than grace, no process holds
// its flock (every live run holds the lock on its cgroups until it has
// removed them), its cgroup.procs is empty, and rmdir succeeds (the
// kernel refuses a cgroup with processes or children). It returns what it
// removed.
func Sweep(fsys FS, dirs []string, now time.Time, grace time.Duration) []string {
	var removed []string
	seen := 0
	for _, dir := range dirs {
		ents, err := fsys.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range ents {
			if seen++; seen > maxSweep {
				return removed
			}
			if !e.IsDir() || !validName(e.Name()) {
				continue
			}
			d := filepath.Join(dir, e.Name())
			if sweepOne(fsys, d, now, grace) {
				removed = append(removed, d)
			}
		}
	}
	return removed
}

func sweepOne(fsys FS, d string, now time.Time, grace time.Duration) bool {
	st, err := fsys.Stat(d)
	if err != nil || now.Sub(st.ModTime) < grace {
		return false
	}
	lk, err := fsys.Lock(d)
	if err != nil {
		return false // a live run holds it (or it is gone)
	}
	defer lk.Close()
	b, err := fsys.ReadFile(filepath.Join(d, "cgroup.procs"))
	if err != nil || strings.TrimSpace(string(b)) != "" {
		return false
	}
	return fsys.Rmdir(d) == nil
}
