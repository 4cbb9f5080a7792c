package evidence

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/hostinfo"
)

// cleanupWait bounds how long the controller waits for the worker to be
// gone and the staging removed after moat exits.
const cleanupWait = 3 * time.Second

// geteuid is os.Geteuid; tests replace it to take the unprivileged path.
var geteuid = os.Geteuid

// FaultTmpfsSize is the size of the audit-storage-fault case's tmpfs.
const FaultTmpfsSize = 1 << 20

func boolp(b bool) *bool { return &b }

// observeNamespaces compares each pid's network and mount namespaces with
// the controller's (each must be private), and reads NoNewPrivs from
// /proc/<pid>/status: it must be set for the workload, pids[0]; for the
// others (the sandbox's host process) it is noted, not required.
func observeNamespaces(h *HostRecord, pids []int) {
	if len(pids) == 0 {
		h.Missing = append(h.Missing, "run info names no worker pid")
		return
	}
	net, mnt, nnp := true, true, true
	for _, pid := range pids {
		for _, ns := range []struct {
			name string
			ok   *bool
		}{{"net", &net}, {"mnt", &mnt}} {
			mine, err1 := os.Readlink("/proc/self/ns/" + ns.name)
			theirs, err2 := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", pid, ns.name))
			if err1 != nil || err2 != nil {
				h.Missing = append(h.Missing, fmt.Sprintf("cannot read the %s namespace of pid %d: %v", ns.name, pid, errors.Join(err1, err2)))
				return
			}
			if mine == theirs {
				*ns.ok = false
				h.Notes = append(h.Notes, fmt.Sprintf("pid %d shares the controller's %s namespace", pid, ns.name))
			}
		}
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			h.Missing = append(h.Missing, fmt.Sprintf("cannot read /proc/%d/status: %v", pid, err))
			return
		}
		found := false
		for _, line := range strings.Split(string(st), "\n") {
			if v, ok := strings.CutPrefix(line, "NoNewPrivs:"); ok {
				found = true
				if strings.TrimSpace(v) != "1" {
					if pid == pids[0] {
						nnp = false
					}
					h.Notes = append(h.Notes, fmt.Sprintf("pid %d runs without no_new_privs", pid))
				}
			}
		}
		if !found {
			h.Missing = append(h.Missing, fmt.Sprintf("no NoNewPrivs line in /proc/%d/status", pid))
			return
		}
	}
	h.NetNSPrivate, h.MntNSPrivate, h.NoNewPrivs = boolp(net), boolp(mnt), boolp(nnp)
}

// processAlive reports whether pid exists and is not a zombie.
func processAlive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return true
	}
	return b[i+2] != 'Z' && b[i+2] != 'X'
}

// observeCleanup waits for the worker pids to be gone and the run's
// staging directory and mounts to be removed.
func observeCleanup(h *HostRecord, pids []int, startTimes map[int]string) {
	deadline := time.Now().Add(cleanupWait)
	for {
		alive := false
		for _, pid := range pids {
			if pid > 0 && processAlive(pid) && procStart(pid) == startTimes[pid] {
				alive = true
			}
		}
		staging := stagingLeft(h.RunID)
		if (!alive && !staging) || time.Now().After(deadline) {
			h.WorkerGone, h.StagingRemoved = boolp(!alive), boolp(!staging)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// procStart is a process's start time (field 22 of /proc/<pid>/stat), to
// tell a reused pid from the worker.
func procStart(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return ""
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return ""
	}
	return f[19]
}

// stagingLeft reports whether anything of the run remains: its staging
// directory under the temp dir, or a mount naming its run id.
func stagingLeft(runID string) bool {
	if runID == "" {
		return false
	}
	if m, _ := filepath.Glob(filepath.Join(os.TempDir(), "moat-"+runID+"-*")); len(m) > 0 {
		return true
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	return err == nil && bytes.Contains(mi, []byte(runID))
}

// faultStorage is a small tmpfs for the audit-storage-fault case.
type faultStorage struct{ dir string }

func mountFaultStorage(dir string) (*faultStorage, error) {
	if geteuid() != 0 {
		return nil, errors.New("audit-storage-fault needs root to mount a tmpfs that it can fill; run the suite as root (CI does)")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if err := unix.Mount("moat-evidence-fault", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC,
		"size="+strconv.Itoa(FaultTmpfsSize)+",mode=0700"); err != nil {
		return nil, fmt.Errorf("mount tmpfs for the audit fault: %w", err)
	}
	return &faultStorage{dir: dir}, nil
}

// fill writes until the tmpfs is full, so that the next journal append fails.
func (f *faultStorage) fill() error {
	fh, err := os.OpenFile(filepath.Join(f.dir, "filler"), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer fh.Close()
	buf := make([]byte, 4096)
	for {
		if _, err := fh.Write(buf); err != nil {
			break
		}
	}
	for {
		if _, err := fh.Write(buf[:1]); err != nil {
			break
		}
	}
	return nil
}

func (f *faultStorage) unmount() error {
	return unix.Unmount(f.dir, unix.MNT_DETACH)
}

// landlockABI is the kernel's Landlock ABI version, 0 if unavailable.
func landlockABI() int {
	abi, _ := hostinfo.LandlockABI()
	return abi
}
