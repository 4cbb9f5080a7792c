package gvisor

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/moat-sandbox/moat/internal/reaper"
)

// cgroupRoot is where the cgroup hierarchies are mounted.
const cgroupRoot = "/sys/fs/cgroup"

// Removing a cgroup whose last task is still exiting is retried.
const (
	cgroupRemoveTries = 50
	cgroupRemovePause = 20 * time.Millisecond
)

// cgroupDirs are the directories runsc makes for the container's
// cgroupsPath (absolute, as in the spec): one in each cgroup v1 hierarchy
// mounted under /sys/fs/cgroup (symlinked co-mounts counted once), or the
// one under the cgroup v2 root.
func cgroupDirs(cgroupsPath string) []string {
	if _, err := os.Stat(filepath.Join(cgroupRoot, "cgroup.controllers")); err == nil {
		return []string{filepath.Join(cgroupRoot, cgroupsPath)}
	}
	ents, err := os.ReadDir(cgroupRoot)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range ents {
		if !e.IsDir() { // symlinks (cpu -> cpu,cpuacct) are not followed
			continue
		}
		base := filepath.Join(cgroupRoot, e.Name())
		if _, err := os.Stat(filepath.Join(base, "cgroup.procs")); err != nil {
			continue
		}
		out = append(out, filepath.Join(base, cgroupsPath))
	}
	return out
}

// removeCgroups removes the directories (retrying while their last tasks
// exit) and tells the reaper of each one removed; one that cannot be
// removed stays the reaper's.
func removeCgroups(dirs []string, rp *reaper.Reaper) error {
	var errs []error
	for _, d := range dirs {
		var err error
		for range cgroupRemoveTries {
			if err = syscall.Rmdir(d); err == nil || errors.Is(err, os.ErrNotExist) {
				err = nil
				break
			}
			time.Sleep(cgroupRemovePause)
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		rp.Done(d)
	}
	return errors.Join(errs...)
}
