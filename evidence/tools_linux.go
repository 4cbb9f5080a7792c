package evidence

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// pidsOfExe lists the host processes whose executable is exe.
func pidsOfExe(exe string) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if l, err := os.Readlink("/proc/" + e.Name() + "/exe"); err == nil && l == exe {
			out = append(out, pid)
		}
	}
	return out
}

// procSID is a process's session id (field 6 of /proc/<pid>/stat), or -1.
func procSID(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return -1
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return -1
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 4 {
		return -1
	}
	sid, err := strconv.Atoi(f[3])
	if err != nil {
		return -1
	}
	return sid
}

// procEnvSHA reads a process's environment from /proc/<pid>/environ:
// each name with the sha256 of its value (the values stay out of the
// bundle).
func procEnvSHA(pid int) (map[string]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, kv := range bytes.Split(b, []byte{0}) {
		if len(kv) == 0 {
			continue
		}
		k, v, _ := bytes.Cut(kv, []byte("="))
		out[string(k)] = sha256Hex(v)
	}
	return out, nil
}
