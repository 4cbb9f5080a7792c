//go:build !linux

package evidence

func pidsOfExe(exe string) []int { return nil }

func procSID(pid int) int { return -1 }

func procEnvSHA(pid int) (map[string]string, error) { return nil, errUnsupported }
