//go:build !linux

package evidence

import "errors"

// podPids needs /proc: the kubernetes suite's host view is Linux's.
func podPids(string) ([]int, error) {
	return nil, errors.New("finding a Pod's processes needs Linux's /proc")
}
