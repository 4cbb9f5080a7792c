package gvisor

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/boundary"
)

// Every process moat starts in the sentry runs behind package seccomp's
// filter: the workload, which the pause forked from the thread the stage
// installed the filter on (pid 1 inside: the stage's process running the
// pause, so its command line is the stage's with the pause's after it),
// and a thread of pid 1, that one. The spec carries no filter of its own
// (runsc would apply it to the pause only). The workload's own line is
// the control: a reading of /proc that showed no filter would show it
// for both.
func TestRootGVisorEveryProcessFiltered(t *testing.T) {
	needRunsc(t)
	pol, _ := testPolicy(t)
	be, err := boundary.Lookup("gvisor")
	if err != nil {
		t.Fatal(err)
	}
	sb, err := be.Prepare(context.Background(), boundary.Spec{RunID: "filter", Policy: pol, StateDir: t.TempDir()})
	if err != nil {
		t.Fatalf("prepare: %v", err)
	}
	defer sb.Terminate()
	var out bytes.Buffer
	p, err := sb.Start(context.Background(), boundary.Process{
		Argv: []string{"/bin/sh", "-c", `printf 'self '; grep '^Seccomp:' /proc/self/status; cat /proc/1/task/*/status | grep -q '^Seccomp:.2$' && echo 'pid 1 has a filtered thread'; tr '\0' ' ' < /proc/1/cmdline`},
		Env:  []string{"PATH=/usr/bin:/bin"}, Stdout: &out, Stderr: &out,
	})
	if err != nil {
		t.Fatal(err)
	}
	if code, _ := p.Wait(); code != 0 {
		t.Fatalf("exit %d: %s", code, out.String())
	}
	t.Logf("output:\n%s", out.String())
	for _, want := range []string{"pid 1 has a filtered thread\n", "self Seccomp:\t2\n", moatInside + " " + StageHelper + " -- " + moatInside + " " + PauseHelper + " "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
}
