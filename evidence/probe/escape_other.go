//go:build !linux

package probe

import "errors"

// The escape classes of issue 11 are Linux system calls; elsewhere each
// step reports that it could not run (the sandbox is Linux-only).
var errLinuxOnly = errors.New("this step needs Linux")

var dgramWays = []string{"socketpair-sendto"}

func (p *runner) dgram(how, addr string) { p.step("dgram-"+how, 0, errLinuxOnly, "") }

func setID(path string) (string, error) { return "", errLinuxOnly }

func chmodNew(path string, mode uint32) (string, error) { return "", errLinuxOnly }

func holdInotify(held func(n int, why error)) (int, error) {
	held(0, errLinuxOnly)
	return 0, errLinuxOnly
}
