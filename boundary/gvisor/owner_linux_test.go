package gvisor

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/internal/reaper"
	"github.com/moat-sandbox/moat/internal/reexec/reexectest"
)

// TestRootGVisorOwnership: ownership follows native's rule. A root-owned
// read_write grant is refused with the chown fix, and so is one not owned
// by process.host_uid; the control: a grant owned by a non-root uid other
// than the policy's is used, and the workload writes as that uid (id -u
// inside, the file's owner on the host).
func TestRootGVisorOwnership(t *testing.T) {
	needRunsc(t)
	be, _ := boundary.Lookup("gvisor")
	prepare := func(t *testing.T, id string, mutate func(ws string) error, hostUID int) (boundary.Sandbox, string, error) {
		t.Helper()
		pol, ws := testPolicy(t)
		if err := mutate(ws); err != nil {
			t.Fatal(err)
		}
		pol.Process.HostUID, pol.Process.HostGID = hostUID, hostUID
		sb, err := be.Prepare(context.Background(), boundary.Spec{RunID: id, Policy: pol, StateDir: t.TempDir()})
		return sb, ws, err
	}
	t.Run("root-owned", func(t *testing.T) {
		sb, ws, err := prepare(t, "own-root", func(ws string) error { return os.Chown(ws, 0, 0) }, 0)
		if err == nil {
			sb.Terminate()
			t.Fatal("a root-owned read_write grant was accepted")
		}
		for _, want := range []string{"owned by uid 0", "chown -R 65534:65534 " + ws} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("refusal %q lacks %q", err, want)
			}
		}
	})
	t.Run("not-host-uid", func(t *testing.T) {
		sb, _, err := prepare(t, "own-mismatch", func(ws string) error { return os.Chown(ws, 4321, 4321) }, 1000)
		if err == nil {
			sb.Terminate()
			t.Fatal("a grant owned by uid 4321 was accepted with process.host_uid 1000")
		}
		if !strings.Contains(err.Error(), "owned by uid 4321") || !strings.Contains(err.Error(), "chown -R 1000:1000") {
			t.Errorf("refusal %q does not name the owner and the fix", err)
		}
	})
	t.Run("owner-uid", func(t *testing.T) {
		sb, ws, err := prepare(t, "own-4321", func(ws string) error { return os.Chown(ws, 4321, 4322) }, 0)
		if err != nil {
			t.Fatalf("a grant owned by uid 4321: %v", err)
		}
		defer sb.Terminate()
		var out bytes.Buffer
		p, err := sb.Start(context.Background(), boundary.Process{
			Argv: []string{"/bin/sh", "-c", "id -u; id -g; echo hi > " + ws + "/mine"},
			Env:  []string{"PATH=/usr/bin:/bin"}, Stdout: &out, Stderr: &out,
		})
		if err != nil {
			t.Fatal(err)
		}
		if code, _ := p.Wait(); code != 0 || out.String() != "4321\n4322\n" {
			t.Fatalf("exit %d, output %q, want ids 4321 and 4322", code, out.String())
		}
		var st syscall.Stat_t
		if err := syscall.Stat(filepath.Join(ws, "mine"), &st); err != nil {
			t.Fatal(err)
		}
		if st.Uid != 4321 || st.Gid != 4322 {
			t.Errorf("the workload's file is %d:%d on the host, want 4321:4322", st.Uid, st.Gid)
		}
	})
}

// runCgroups lists the cgroup directories named for a run in every
// hierarchy under /sys/fs/cgroup, found by walking two levels (not by
// cgroupDirs, which the test checks).
func runCgroups(t *testing.T, runID string) []string {
	t.Helper()
	name := "moat-" + sanitize(runID)
	var out []string
	for _, pat := range []string{filepath.Join(cgroupRoot, name), filepath.Join(cgroupRoot, "*", name), filepath.Join(cgroupRoot, "*", "*", name)} {
		m, err := filepath.Glob(pat)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m...)
	}
	return out
}

// TestRootGVisorNoCgroupLeftovers: runsc's cgroups for a sandbox exist
// while it runs (the control: the test looks in the right place) and are
// gone after Terminate.
func TestRootGVisorNoCgroupLeftovers(t *testing.T) {
	needRunsc(t)
	pol, _ := testPolicy(t)
	be, _ := boundary.Lookup("gvisor")
	id := fmt.Sprintf("cg-%d", time.Now().UnixNano())
	sb, err := be.Prepare(context.Background(), boundary.Spec{RunID: id, Policy: pol, StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	p, err := sb.Start(context.Background(), boundary.Process{Argv: []string{"/bin/true"}, Env: []string{}})
	if err != nil {
		sb.Terminate()
		t.Fatal(err)
	}
	p.Wait()
	during := runCgroups(t, id)
	sb.Terminate()
	if len(during) == 0 {
		t.Fatal("control: no cgroup of the running sandbox found")
	}
	t.Logf("while running: %d cgroup directories, e.g. %s", len(during), during[0])
	if left := runCgroups(t, id); len(left) > 0 {
		t.Errorf("after Terminate, left behind: %v", left)
	}
}

// killHelper prepares a sandbox with a reaper, says "ready" and waits to be
// killed: moat dying by SIGKILL with a sandbox up.
var killHelper = reexectest.Helper("gvisor-kill", func(args []string) int {
	if len(args) != 3 {
		return 125
	}
	ws, state, id := args[0], args[1], args[2]
	exe, err := os.Executable()
	if err != nil {
		fmt.Println("error:", err)
		return 125
	}
	rp, err := reaper.Start(exe)
	if err != nil {
		fmt.Println("error:", err)
		return 125
	}
	pol, _ := policyFor(ws)
	be, _ := boundary.Lookup("gvisor")
	if _, err := be.Prepare(context.Background(), boundary.Spec{RunID: id, Policy: pol, StateDir: state, Reaper: rp}); err != nil {
		fmt.Println("error:", err)
		return 125
	}
	fmt.Println("ready")
	time.Sleep(time.Hour)
	return 0
})

// TestRootGVisorKilledLeavesNoCgroups: moat SIGKILLed with a sandbox up
// leaves no cgroup behind (the reaper removes them); the control: they
// existed while it ran.
func TestRootGVisorKilledLeavesNoCgroups(t *testing.T) {
	needRunsc(t)
	_, ws := testPolicy(t)
	id := fmt.Sprintf("kill-%d", time.Now().UnixNano())
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, killHelper.Name, ws, t.TempDir(), id)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	line, _ := bufio.NewReader(stdout).ReadString('\n')
	if line != "ready\n" {
		t.Fatalf("helper: %q", line)
	}
	during := runCgroups(t, id)
	if len(during) == 0 {
		t.Fatal("control: no cgroup of the running sandbox found")
	}
	cmd.Process.Kill()
	cmd.Wait()
	deadline := time.Now().Add(15 * time.Second)
	for {
		left := runCgroups(t, id)
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after SIGKILL of moat, left behind: %v", left)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
