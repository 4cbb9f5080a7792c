//go:build amd64 || arm64

package seccomp

import (
	"fmt"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/testenv"
)

// BenchmarkSyscall measures what the filter adds to a syscall. getppid's
// action does not depend on its arguments, so the kernel's action cache
// skips the filter; ioctl is argument-checked (on a bad fd, so the kernel
// does almost nothing else) and runs the program every time.
//
// The filtered variants install the filter on the benchmark goroutine's
// locked thread, which is never unlocked: the thread ends with the
// goroutine, so nothing else in this process runs under the filter.
func BenchmarkSyscall(b *testing.B) {
	ok, why := seccompAvailable()
	testenv.Need(b, ok, why)
	calls := []struct {
		name       string
		nr, a0, a1 uintptr
	}{
		{"getppid", unix.SYS_GETPPID, 0, 0},
		{"ioctl-TCGETS-EBADF", unix.SYS_IOCTL, ^uintptr(0), unix.TCGETS},
	}
	for _, filtered := range []bool{false, true} {
		for _, c := range calls {
			b.Run(fmt.Sprintf("%s/filtered=%v", c.name, filtered), func(b *testing.B) {
				if filtered {
					runtime.LockOSThread()
					prog, err := Build(Options{})
					if err != nil {
						b.Fatal(err)
					}
					if err := Install(prog); err != nil {
						b.Fatal(err)
					}
				}
				for b.Loop() {
					unix.RawSyscall(c.nr, c.a0, c.a1, 0)
				}
			})
		}
	}
}
