package gvisor

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/boundary"
)

// Every process moat starts in the sentry runs behind package seccomp's
// filter: the container's pause (pid 1 inside) and the workload alike.
// The spec carries no filter of its own (runsc would apply it to the
// pause only). The workload's own line is the control: a reading of
// /proc that showed no filter would show it for both. (The stage execs
// the pause: pid 1's command line is the pause's.)
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
		Argv: []string{"/bin/sh", "-c", `for p in 1 self; do printf '%s ' $p; grep '^Seccomp:' /proc/$p/status; done; tr '\0' ' ' < /proc/1/cmdline`},
		Env:  []string{"PATH=/usr/bin:/bin"}, Stdout: &out, Stderr: &out,
	})
	if err != nil {
		t.Fatal(err)
	}
	if code, _ := p.Wait(); code != 0 {
		t.Fatalf("exit %d: %s", code, out.String())
	}
	t.Logf("output:\n%s", out.String())
	for _, want := range []string{"1 Seccomp:\t2\n", "self Seccomp:\t2\n", moatInside + " " + PauseHelper + " "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
}
