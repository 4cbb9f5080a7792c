package evidence

import (
	"os"
	"slices"
	"strconv"
	"strings"
)

// podPids lists this host's processes whose cgroup names the Pod's uid
// (the kubelet's pod<uid> directory, with '_' for '-' under the systemd
// driver), in pid order.
func podPids(uid string) ([]int, error) {
	if uid == "" {
		return nil, nil
	}
	marks := []string{"pod" + uid, "pod" + strings.ReplaceAll(uid, "-", "_")}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cgroup")
		if err != nil {
			continue
		}
		if slices.ContainsFunc(marks, func(m string) bool { return strings.Contains(string(b), m) }) {
			pids = append(pids, pid)
		}
	}
	slices.Sort(pids)
	return pids, nil
}
