package seccomp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/testenv"
)

const caseX32 = "x32"

func init() { extraChildMains[caseX32] = x32Main }

// x32Main makes an x32 getpid before and after installing the filter. The
// second must kill the process with SIGSYS; the lines it prints say how
// far it got.
func x32Main() int {
	rl := unix.Rlimit{} // no core file from the SIGSYS
	if err := unix.Setrlimit(unix.RLIMIT_CORE, &rl); err != nil {
		fmt.Println("setrlimit:", err)
		return 1
	}
	_, _, e := unix.RawSyscall(x32SyscallBit|unix.SYS_GETPID, 0, 0, 0)
	fmt.Println("pre", result(errnoErr(e)))
	prog, err := Build(Options{})
	if err == nil {
		err = Install(prog)
	}
	if err != nil {
		fmt.Println("install:", err)
		return 1
	}
	// A native syscall after the filter is fine (this write is one).
	fmt.Println("installed")
	unix.RawSyscall(x32SyscallBit|unix.SYS_GETPID, 0, 0, 0)
	fmt.Println("survived")
	return 0
}

// TestKernelKillsX32 shows the one kill in the filter at work: an x32
// syscall, which the kernel reports with the x86_64 arch value, kills the
// process, while the native write just before it goes through.
func TestKernelKillsX32(t *testing.T) {
	ok, why := seccompAvailable()
	testenv.Need(t, ok, why)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), childTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, caseHelper, caseX32)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	out := stdout.String()
	t.Logf("child output: %q", out)
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) {
		t.Fatalf("child: got %v, want death by SIGSYS\nstderr:\n%s", err, stderr.Bytes())
	}
	ws, _ := exitErr.Sys().(syscall.WaitStatus)
	if !ws.Signaled() || ws.Signal() != syscall.SIGSYS {
		t.Errorf("child: got %v, want killed by SIGSYS", exitErr)
	}
	if !strings.Contains(out, "installed\n") {
		t.Errorf("child did not reach the filtered x32 syscall (output %q)", out)
	}
	if strings.Contains(out, "survived") {
		t.Errorf("child survived an x32 syscall under the filter")
	}
}
