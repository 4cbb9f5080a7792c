package native

import (
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/boundary"
)

func TestIdentityAndPrivilege(t *testing.T) {
	f := newFixture(t)
	sb := f.prepare(t)
	res := f.ops(t, sb, "id", "status", "rlimit", "unshare-user", "read:/proc/sys/user/max_user_namespaces")
	wantPrefix(t, res, "id", "ok 1000:1000")
	for _, kv := range []string{"NoNewPrivs=1", "CapInh=0000000000000000", "CapPrm=0000000000000000",
		"CapEff=0000000000000000", "CapBnd=0000000000000000", "CapAmb=0000000000000000", "Seccomp=2"} {
		if !strings.Contains(res["status"], kv) {
			t.Errorf("status: got %q, want it to contain %s", res["status"], kv)
		}
	}
	wantPrefix(t, res, "rlimit", "ok core=0 nofile=256")
	wantPrefix(t, res, "unshare-user", "err E")
	wantPrefix(t, res, "read:/proc/sys/user/max_user_namespaces", "ok 0")
}

func TestTwoSandboxes(t *testing.T) {
	f := newFixture(t)
	a, b := f.prepare(t), f.prepare(t)
	for _, sb := range []boundary.Sandbox{a, b} {
		res := f.ops(t, sb, "id")
		wantPrefix(t, res, "id", "ok 1000:1000")
	}
	if a.HostPID() == b.HostPID() || a.HostPID() <= 0 {
		t.Errorf("host pids: got %d and %d, want two distinct pids", a.HostPID(), b.HostPID())
	}
}
