//go:build amd64 || arm64

package seccomp

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Install sets no_new_privs (when it is not already set) and installs prog
// as a seccomp filter on the CALLING THREAD ONLY.
//
// It does not use SECCOMP_FILTER_FLAG_TSYNC: the other threads of a Go
// process keep running unfiltered. The caller must have called
// runtime.LockOSThread, must keep the goroutine locked for good (a locked
// goroutine that exits takes its thread with it), and must execve, or
// fork and execve, from this same thread: the new program inherits the
// thread's no_new_privs and filter, and a fork copies them to the child.
// no_new_privs is a per-thread attribute too.
func Install(prog []unix.SockFilter) error {
	if len(prog) == 0 || len(prog) > MaxInstructions {
		return fmt.Errorf("moat: seccomp: program has %d instructions, want 1…%d", len(prog), MaxInstructions)
	}
	nnp, err := unix.PrctlRetInt(unix.PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0)
	if err != nil {
		return fmt.Errorf("moat: seccomp: reading no_new_privs: %w", err)
	}
	if nnp != 1 {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			return fmt.Errorf("moat: seccomp: setting no_new_privs: %w", err)
		}
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	_, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(prog)
	if errno != 0 {
		return fmt.Errorf("moat: seccomp: installing the filter: %w", errno)
	}
	return nil
}
