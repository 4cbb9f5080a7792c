package native

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestStageEnded: stageEnded tells a stage that died before it read its
// config (a zombie) from a live one, and leaves the zombie unreaped for
// the init's reaper.
func TestStageEnded(t *testing.T) {
	p, err := os.StartProcess("/bin/sleep", []string{"sleep", "30"}, &os.ProcAttr{})
	if err != nil {
		t.Fatal(err)
	}
	pidfd, err := unix.PidfdOpen(p.Pid, 0)
	if err != nil {
		p.Kill()
		p.Wait()
		t.Fatal(err)
	}
	defer unix.Close(pidfd)
	// Control: a live process has not ended, and its namespace is readable.
	if stageEnded(pidfd) {
		t.Error("a live process is reported ended")
	}
	p.Signal(unix.SIGINT)
	deadline := time.Now().Add(10 * time.Second)
	for !zombie(t, p.Pid) {
		if time.Now().After(deadline) {
			t.Fatal("the process did not become a zombie")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if !stageEnded(pidfd) {
		t.Error("a process that died of SIGINT is not reported ended")
	}
	// Still unreaped: the reaper gets its status.
	ps, err := p.Wait()
	if err != nil {
		t.Fatalf("reaping after stageEnded: %v", err)
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGINT {
		t.Errorf("the reaped status is %v, want death by SIGINT", ps)
	}
	if stageEnded(-1) {
		t.Error("no pidfd is reported ended")
	}
}

func zombie(t *testing.T, pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && len(s) > i+2 && s[i+2] == 'Z'
}
