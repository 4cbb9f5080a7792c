//go:build !linux

package evidence

import "errors"

var geteuid = func() int { return -1 }

var errUnsupported = errors.New("the evidence suite observes the host through Linux /proc: Linux only")

func boolp(b bool) *bool { return &b }

func observeNamespaces(h *HostRecord, pids []int) {
	h.Missing = append(h.Missing, errUnsupported.Error())
}

func processAlive(pid int) bool { return false }

func observeCleanup(h *HostRecord, pids []int, startTimes map[int]string) {
	h.Missing = append(h.Missing, errUnsupported.Error())
}

func procStart(pid int) string { return "" }

type faultStorage struct{ dir string }

func mountFaultStorage(dir string) (*faultStorage, error) { return nil, errUnsupported }
func (f *faultStorage) fill() error                       { return errUnsupported }
func (f *faultStorage) unmount() error                    { return errUnsupported }

func landlockABI() int { return 0 }

func lstatRecord(when, abs, rel string) PathRecord {
	return PathRecord{When: when, Path: rel, Err: errUnsupported.Error()}
}

func inotifyAs(uid int) string { return errUnsupported.Error() }

func inotifyFDs(pids []int) (int, error) { return -1, errUnsupported }
