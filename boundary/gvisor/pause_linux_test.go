package gvisor

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/boundary"
)

// TestRootGVisorPauseChannelUnreachable: the pause's channel to the init
// (pauseCtlFD) is out of the workload's reach: the workload inherits no
// descriptor of it, cannot read the pause's fd links or open them
// (the pause is not dumpable), and cannot trace it. The controls, in the
// same sandbox: the workload reads its own fd links and opens its own
// descriptor through /proc, and reads the pause's stat.
func TestRootGVisorPauseChannelUnreachable(t *testing.T) {
	needRunsc(t)
	pol, _ := testPolicy(t)
	be, _ := boundary.Lookup("gvisor")
	sb, err := be.Prepare(context.Background(), boundary.Spec{RunID: "pausech", Policy: pol, StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Terminate()
	const script = `
ls /proc/self/fd | tr '\n' ' '; echo
readlink /proc/self/fd/1 >/dev/null && echo own-link-ok
head -c0 /proc/self/fd/0 </dev/null && echo own-open-ok
cut -d' ' -f1-3 /proc/1/stat | grep -q '^1 ' && echo pause-stat-ok
readlink /proc/1/fd/3 2>/dev/null && echo pause-link-READ
cat /proc/1/fd/3 </dev/null >/dev/null 2>&1 && echo pause-open-OPENED
cat /proc/1/environ >/dev/null 2>&1 && echo pause-environ-READ
(exec 7<>/proc/1/fd/3) 2>/dev/null && echo pause-fd-OPENED
exit 0`
	var out bytes.Buffer
	p, err := sb.Start(context.Background(), boundary.Process{Argv: []string{"/bin/sh", "-c", script}, Env: []string{"PATH=/usr/bin:/bin"}, Stdout: &out, Stderr: &out})
	if err != nil {
		t.Fatal(err)
	}
	if code, _ := p.Wait(); code != 0 {
		t.Fatalf("exit %d:\n%s", code, out.String())
	}
	t.Logf("output:\n%s", out.String())
	lines := strings.SplitN(out.String(), "\n", 2)
	// 0, 1, 2 and the descriptor ls itself reads /proc/self/fd with.
	if fds := strings.Fields(lines[0]); len(fds) > 4 {
		t.Errorf("the workload inherits descriptors beyond stdio: %v", fds)
	}
	for _, w := range []string{"own-link-ok", "own-open-ok", "pause-stat-ok"} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("control %s failed", w)
		}
	}
	for _, bad := range []string{"READ", "OPENED"} {
		if strings.Contains(out.String(), bad) {
			t.Errorf("the workload reached the pause (%s)", bad)
		}
	}
}
