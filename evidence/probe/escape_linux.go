package probe

import "golang.org/x/sys/unix"

// holdInotify makes inotify instances until the kernel refuses one (or
// MaxInotify), calls held with the count and the refusal, and then closes
// them all.
func holdInotify(held func(n int, why error)) (int, error) {
	var fds []int
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	var why error
	for len(fds) < MaxInotify {
		fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
		if err != nil {
			why = err
			break
		}
		fds = append(fds, fd)
	}
	held(len(fds), why)
	return len(fds), why
}
