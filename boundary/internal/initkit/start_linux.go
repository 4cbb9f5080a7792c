package initkit

import "runtime"

// StartLocked calls start (which starts the init, with Pdeathsig set) on
// a goroutine locked to its OS thread, and returns start's error. On
// success the thread stays alive, locked, until release is closed: the
// kernel sends the Pdeathsig when the thread that forked the child exits,
// not when the process does, so an unlocked thread that the Go runtime
// retired would kill a live sandbox. On failure the thread exits at once.
// start may change the thread's own state (ids, capabilities): no other
// goroutine ever runs on that thread.
func StartLocked(start func() error, release <-chan struct{}) error {
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		err := start()
		started <- err
		if err != nil {
			return
		}
		<-release
	}()
	return <-started
}
