package initkit

import (
	"strconv"

	"golang.org/x/sys/unix"
)

// CloseInherited closes every fd from from on that this process inherited
// across its execve: those whose close-on-exec flag is clear. Every fd the
// Go runtime and this program open is close-on-exec, and the runtime opens
// some before main runs (its netpoller's epoll fd, once any package's
// initialisation touched it: a binary that links more packages does):
// closing every fd from from on (close_range) closed those too, and the
// runtime died with "netpoll failed" (the native init, once the kubernetes
// backend was linked in). When /proc/self/fd cannot be listed, every fd
// from from on is made close-on-exec instead: none reaches a process this
// one starts.
func CloseInherited(from int) {
	dir, err := unix.Open("/proc/self/fd", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.CloseRange(uint(from), ^uint(0), unix.CLOSE_RANGE_CLOEXEC)
		return
	}
	defer unix.Close(dir)
	var fds []int
	buf := make([]byte, 4096)
	for {
		n, err := unix.Getdents(dir, buf)
		if err != nil {
			unix.CloseRange(uint(from), ^uint(0), unix.CLOSE_RANGE_CLOEXEC)
			return
		}
		if n <= 0 {
			break
		}
		_, _, names := unix.ParseDirent(buf[:n], -1, nil)
		for _, name := range names {
			if fd, err := strconv.Atoi(name); err == nil && fd >= from && fd != dir {
				fds = append(fds, fd)
			}
		}
	}
	for _, fd := range fds {
		if flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err == nil && flags&unix.FD_CLOEXEC == 0 {
			unix.Close(fd)
		}
	}
}
