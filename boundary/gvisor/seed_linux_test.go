package gvisor

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/boundary/measure"
	"github.com/moat-sandbox/moat/internal/reexec/reexectest"
)

// seedProbeHelper makes the test binary, run inside the sentry, make the
// two syscalls of seed 003 and print what they returned.
var seedProbeHelper = reexectest.Helper("gvisor-seed-probe", seedProbe)

func seedProbe([]string) int {
	_, _, e := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, 1 /* VERSION */)
	fmt.Printf("landlock_create_ruleset: %s\n", errnoName(e))
	// A filter that allows everything, installed with NEW_LISTENER.
	prog := []unix.SockFilter{{Code: 0x06, K: 0x7fff0000}} // ret ALLOW
	fprog := unix.SockFprog{Len: 1, Filter: &prog[0]}
	unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
	_, _, e = unix.Syscall(unix.SYS_SECCOMP, 1 /* SET_MODE_FILTER */, 1<<3 /* FLAG_NEW_LISTENER */, uintptr(unsafe.Pointer(&fprog)))
	fmt.Printf("seccomp_new_listener: %s\n", errnoName(e))
	return 0
}

func errnoName(e unix.Errno) string {
	if e == 0 {
		return "ok"
	}
	return unix.ErrnoName(e)
}

// The seed's case, working: inside gVisor there is no Landlock and no
// seccomp listener, and the sandbox still reaches Ready through its
// measured properties.
func TestRootGVisorSeedCase(t *testing.T) {
	needRunsc(t)
	pol, ws := testPolicy(t)
	be, _ := boundary.Lookup("gvisor")
	sb, err := be.Prepare(context.Background(), boundary.Spec{RunID: "seed", Policy: pol, StateDir: t.TempDir()})
	if err != nil {
		t.Fatalf("prepare: %v", err)
	}
	defer sb.Terminate()

	var out bytes.Buffer
	p, err := sb.StartHelper(context.Background(), []string{seedProbeHelper.Name}, boundary.Process{Stdout: &out, Stderr: &out})
	if err != nil {
		t.Fatal(err)
	}
	p.Wait()
	if !strings.Contains(out.String(), "landlock_create_ruleset: ENOSYS") {
		t.Errorf("landlock inside gVisor: want ENOSYS\n%s", out.String())
	}
	if !strings.Contains(out.String(), "seccomp_new_listener: EINVAL") {
		t.Errorf("seccomp NEW_LISTENER inside gVisor: want EINVAL\n%s", out.String())
	}
	// The same binary on the host: Landlock answers (the control that
	// makes the ENOSYS the sentry's doing).
	if _, _, e := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, 1); e != 0 {
		t.Errorf("control: landlock on the host: %v", e)
	}

	secret := t.TempDir() + "/host-secret"
	os.WriteFile(secret, []byte("s"), 0o644)
	li, err := sb.Listener()
	if err != nil {
		t.Fatal(err)
	}
	props, rep, err := measure.Confirm(context.Background(), sb, measure.Config{
		BrokerPort: li.Port, ReadWrite: []string{ws}, ReadOnly: pol.Filesystem.ReadOnly,
		HostSecrets: []string{secret, "/etc/shadow"},
	})
	li.File.Close()
	if err != nil {
		t.Fatalf("confirm: %v", err)
	}
	for _, c := range rep.Checks {
		if !c.OK {
			t.Logf("check not OK: %+v", c)
		}
	}
	if err := boundary.Ready(props, boundary.Requirements{}); err != nil {
		t.Errorf("gVisor sandbox not Ready: %v", err)
	}
	if !props.RequestAttribution.Unavailable {
		t.Errorf("attribution: want declared unavailable (endpoint-only), got %+v", props.RequestAttribution)
	}
	if err := boundary.Ready(props, boundary.Requirements{RequireAttribution: true}); err == nil {
		t.Errorf("require_attribution: true must refuse an endpoint-only backend")
	} else if !strings.Contains(err.Error(), "request_attribution") {
		t.Errorf("refusal does not name the property: %v", err)
	}
	t.Logf("properties: %+v", props)
}
