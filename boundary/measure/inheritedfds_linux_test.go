package measure

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/testenv"
)

// inheritedFDs lists the open fds from /proc/self/fd: an inherited fd is
// reported whatever its number, also past the 4,096 that the fcntl scan
// it replaced looked at; an fd of the process's own (close-on-exec) at a
// high number is not (the control).
func TestInheritedFDsListsEveryNumber(t *testing.T) {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	testenv.Need(t, lim.Cur > 5002, "RLIMIT_NOFILE "+strconv.FormatUint(lim.Cur, 10)+" leaves no fd above 5000")
	f, err := os.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const inherited, own = 5000, 5001
	if err := unix.Dup3(int(f.Fd()), inherited, 0); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(inherited)
	if err := unix.Dup3(int(f.Fd()), own, unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(own)
	outcome, detail := inheritedFDs()()
	if outcome != OutcomeSucceeded || !strings.Contains(detail, "fd 5000: "+f.Name()) {
		t.Errorf("an inherited fd 5000: got %s %q, want it reported with its path %s", outcome, detail, f.Name())
	}
	if strings.Contains(detail, "fd 5001:") {
		t.Errorf("a close-on-exec fd was reported as inherited: %q", detail)
	}
	// After it is closed it is gone from the report.
	unix.Close(inherited)
	if _, detail := inheritedFDs()(); strings.Contains(detail, "fd 5000:") {
		t.Errorf("a closed fd was reported: %q", detail)
	}
}
