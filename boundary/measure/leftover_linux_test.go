package measure

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/reaper"
	"github.com/moat-sandbox/moat/internal/reexec/reexectest"
)

// receiversHelper is a measurement's host side, killed mid-measurement: it
// starts the reaper and the receivers in the workspace given, then waits.
var receiversHelper = reexectest.Helper("measure-receivers", func(args []string) int {
	exe, _ := os.Executable()
	rp, err := reaper.Start(exe)
	if err != nil {
		fmt.Println("reaper:", err)
		return 1
	}
	cfg := Config{ReadWrite: args, Reaper: rp}
	startReceivers(&cfg, "0123456789abcdef0123")
	fmt.Println("ready")
	time.Sleep(time.Hour)
	return 0
})

// TestReceiversLeaveNothing: the measurement's sockets in a read-write
// grant are removed even when moat is killed while they exist (they used
// to stay, and a later run refused the grant). The control: they exist
// while the measurement runs.
func TestReceiversLeaveNothing(t *testing.T) {
	ws := t.TempDir()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, receiversHelper.Name, ws)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	if line, _ := bufio.NewReader(out).ReadString('\n'); line != "ready\n" {
		t.Fatalf("helper said %q", line)
	}
	socks, _ := filepath.Glob(filepath.Join(ws, ".moat-measure-*"))
	if len(socks) != 2 {
		t.Fatalf("control: %v in the grant while measuring, want the stream and the datagram socket", socks)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	deadline := time.Now().Add(20 * time.Second)
	for {
		left, _ := filepath.Glob(filepath.Join(ws, ".moat-measure-*"))
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still in the grant after the kill: %v", left)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
