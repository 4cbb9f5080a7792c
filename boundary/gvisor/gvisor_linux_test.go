package gvisor

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/boundary/measure"
	"github.com/moat-sandbox/moat/internal/reaper"
	"github.com/moat-sandbox/moat/internal/reexec"
	"github.com/moat-sandbox/moat/internal/reexec/reexectest"
	"github.com/moat-sandbox/moat/internal/testenv"
	"github.com/moat-sandbox/moat/policy"
)

// TestMain: the test binary is also the moat binary of the sandboxes the
// tests make, so it serves the helpers they start (the list of
// internal/cli/hidden.go that gVisor uses) and the tests' own.
func TestMain(m *testing.M) {
	boundary.Register(New())
	reexectest.Main(m,
		reexec.Helper{Name: InitHelper, Main: InitMain},
		reexec.Helper{Name: PauseHelper, Main: PauseMain},
		reexec.Helper{Name: StageHelper, Main: StageMain},
		reexec.Helper{Name: measure.Helper, Main: measure.Main},
		reexec.Helper{Name: reaper.Helper, Main: reaper.Main},
		seedProbeHelper, killHelper)
}

func needRunsc(t *testing.T) {
	t.Helper()
	testenv.NeedRoot(t)
	_, err := exec.LookPath("runsc")
	testenv.Need(t, err == nil, "runsc is not installed (apt-get install runsc)")
}

func testPolicy(t *testing.T) (*policy.Policy, string) {
	t.Helper()
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	ws := filepath.Join(dir, "ws")
	if err := os.Mkdir(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	// The workload runs as the workspace's owner (see hostIDs): uid 1000,
	// as the policy's uid, so that tests can say what id -u prints.
	if err := os.Chown(ws, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	return policyFor(ws)
}

// policyFor is the tests' policy with ws as the workspace.
func policyFor(ws string) (*policy.Policy, string) {
	pol := &policy.Policy{Version: 1, Backend: "gvisor"}
	pol.Filesystem.ReadOnly = []string{"/usr", "/bin", "/lib", "/lib64"}
	pol.Filesystem.ReadWrite = []string{ws}
	pol.Filesystem.TmpSize = 16 << 20
	pol.Process.UID, pol.Process.GID = 1000, 1000
	pol.Process.Limits.OpenFiles = 1024
	return pol, ws
}

func TestRootGVisorRunsConfined(t *testing.T) {
	needRunsc(t)
	pol, ws := testPolicy(t)
	be, err := boundary.Lookup("gvisor")
	if err != nil {
		t.Fatal(err)
	}
	sb, err := be.Prepare(context.Background(), boundary.Spec{RunID: "t1", Policy: pol, StateDir: t.TempDir()})
	if err != nil {
		t.Fatalf("prepare: %v", err)
	}
	defer sb.Terminate()
	var out bytes.Buffer
	p, err := sb.Start(context.Background(), boundary.Process{
		Argv: []string{"/bin/sh", "-c", "id -u; echo hi > " + ws + "/x && echo wrote; cat /etc/hostname 2>&1; unshare -U true 2>&1 || echo nouserns; exit 3"},
		Env:  []string{"PATH=/usr/bin:/bin"}, Stdout: &out, Stderr: &out,
	})
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	code, _ := p.Wait()
	t.Logf("output:\n%s", out.String())
	if code != 3 {
		t.Errorf("exit code: got %d, want 3", code)
	}
	for _, w := range []string{"1000\n", "wrote", "nouserns"} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("output lacks %q", w)
		}
	}
	if b, err := os.ReadFile(filepath.Join(ws, "x")); err != nil || string(b) != "hi\n" {
		t.Errorf("workspace write did not land: %q %v", b, err)
	}
}

// TestRootGVisorGrantSymlink: a grant whose last component is a symlink
// that a workload could have planted (here to a host directory outside
// the grants) is refused; runsc used to follow it. The control is the
// same grant as a real directory, read from inside.
func TestRootGVisorGrantSymlink(t *testing.T) {
	needRunsc(t)
	pol, ws := testPolicy(t)
	secret := filepath.Join(filepath.Dir(ws), "secret")
	if err := os.Mkdir(secret, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(secret, "key"), []byte("host secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(ws, "data")
	if err := os.Mkdir(data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(data, "f"), []byte("granted"), 0o644); err != nil {
		t.Fatal(err)
	}
	pol.Filesystem.ReadOnly = append(pol.Filesystem.ReadOnly, data)
	be, _ := boundary.Lookup("gvisor")
	sb, err := be.Prepare(context.Background(), boundary.Spec{RunID: "sym-ok", Policy: pol, StateDir: t.TempDir()})
	if err != nil {
		t.Fatalf("control: prepare: %v", err)
	}
	var out bytes.Buffer
	p, err := sb.Start(context.Background(), boundary.Process{Argv: []string{"/bin/cat", filepath.Join(data, "f")}, Env: []string{}, Stdout: &out, Stderr: &out})
	if err != nil {
		sb.Terminate()
		t.Fatal(err)
	}
	code, _ := p.Wait()
	sb.Terminate()
	if code != 0 || out.String() != "granted" {
		t.Fatalf("control: exit %d, %q", code, out.String())
	}
	// The workload swaps the directory for a symlink to the host secret.
	if err := os.Rename(data, data+".old"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, data); err != nil {
		t.Fatal(err)
	}
	sb, err = be.Prepare(context.Background(), boundary.Spec{RunID: "sym-bad", Policy: pol, StateDir: t.TempDir()})
	if err == nil {
		sb.Terminate()
		t.Fatal("prepare with a planted symlink grant succeeded")
	}
	if !strings.Contains(err.Error(), "symlink") {
		t.Errorf("refusal %q does not name the symlink", err)
	}
}

// TestRootGVisorNoSetID: the workload cannot give a file in its workspace
// a set-id bit through chmod or a creating open, and the host sees none;
// the controls: plain modes through the same calls work. This runsc
// refuses these with EPERM even without moat's seccomp rules (checked by
// removing them, 2026-11-30): the test shows the property, and the rules
// are a second wall that does not depend on the sentry's choice.
func TestRootGVisorNoSetID(t *testing.T) {
	needRunsc(t)
	pol, ws := testPolicy(t)
	be, _ := boundary.Lookup("gvisor")
	sb, err := be.Prepare(context.Background(), boundary.Spec{RunID: "setid", Policy: pol, StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Terminate()
	script := "cd " + ws + " && cp /bin/true f && " +
		"(chmod 755 f && echo chmod-plain-ok); (chmod 4755 f && echo chmod-suid-ok); (chmod 2755 f && echo chmod-sgid-ok); " +
		"(python3 -c 'import os; os.close(os.open(\"g\", os.O_CREAT|os.O_WRONLY, 0o4755))' && echo open-suid-ok); " +
		"(python3 -c 'import os; os.close(os.open(\"h\", os.O_CREAT|os.O_WRONLY, 0o755))' && echo open-plain-ok); true"
	var out bytes.Buffer
	p, err := sb.Start(context.Background(), boundary.Process{Argv: []string{"/bin/sh", "-c", script}, Env: []string{"PATH=/usr/bin:/bin"}, Stdout: &out, Stderr: &out})
	if err != nil {
		t.Fatal(err)
	}
	p.Wait()
	got := out.String()
	t.Logf("%s", got)
	for _, want := range []string{"chmod-plain-ok", "open-plain-ok"} {
		if !strings.Contains(got, want) {
			t.Errorf("control %s missing: %q", want, got)
		}
	}
	for _, bad := range []string{"chmod-suid-ok", "chmod-sgid-ok", "open-suid-ok"} {
		if strings.Contains(got, bad) {
			t.Errorf("%s: the workload set a set-id bit: %q", bad, got)
		}
	}
	for _, f := range []string{"f", "g", "h"} {
		if st, err := os.Stat(filepath.Join(ws, f)); err == nil && st.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 {
			t.Errorf("host sees %s with mode %v", f, st.Mode())
		}
	}
}

// TestRootGVisorExecLeavesNothing: on gVisor too, a process is reported
// exited only when what it started is gone: a background child (its
// process group) and a setsid'd orphan. The control: while the first
// process still runs, a second one sees its background child.
func TestRootGVisorExecLeavesNothing(t *testing.T) {
	needRunsc(t)
	pol, _ := testPolicy(t)
	be, _ := boundary.Lookup("gvisor")
	sb, err := be.Prepare(context.Background(), boundary.Spec{RunID: "linger", Policy: pol, StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Terminate()
	run := func(script string) (boundary.Running, *bytes.Buffer) {
		var out bytes.Buffer
		p, err := sb.Start(context.Background(), boundary.Process{Argv: []string{"/bin/sh", "-c", script}, Env: []string{"PATH=/usr/bin:/bin"}, Stdout: &out, Stderr: &out})
		if err != nil {
			t.Fatal(err)
		}
		return p, &out
	}
	const list = `for f in /proc/[0-9]*/cmdline; do tr '\0' ' ' < $f; echo; done`
	// Control: a live process's background child is seen.
	a, _ := run("sleep 7771 & sleep 3")
	time.Sleep(500 * time.Millisecond)
	b, out := run(list)
	b.Wait()
	if !strings.Contains(out.String(), "sleep 7771") {
		t.Fatalf("control: the live process's child is not seen:\n%s", out)
	}
	a.Wait()
	// The process that leaves a child and a setsid'd orphan behind.
	c, _ := run("sleep 7772 & setsid sh -c 'sleep 7773 &'; sleep 0.2")
	c.Wait()
	d, out := run(list)
	d.Wait()
	for _, s := range []string{"sleep 7771", "sleep 7772", "sleep 7773"} {
		if strings.Contains(out.String(), s) {
			t.Errorf("%s still runs after its process exited:\n%s", s, out)
		}
	}
}
