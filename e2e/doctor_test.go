//go:build linux

package e2e

import (
	"encoding/json"
	"os"
	"testing"
)

// moat doctor lists both backends and whether each reaches Ready here; the
// native backend does wherever the sandbox tests run.
func TestDoctor(t *testing.T) {
	e := newEnv(t)
	r := e.moat("doctor", "-o", "json")
	var rep struct {
		Checks []struct {
			Name string `json:"name"`
			OK   bool   `json:"ok"`
		} `json:"checks"`
		Backends []struct {
			Backend string `json:"backend"`
			Ready   bool   `json:"ready"`
			Reason  string `json:"reason"`
		} `json:"backends"`
		Runnable bool `json:"runnable"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("doctor -o json: %v\n%s", err, r)
	}
	if r.code != 0 || !rep.Runnable {
		t.Errorf("doctor: exit %d runnable=%v\n%s", r.code, rep.Runnable, r)
	}
	ready := map[string]bool{}
	for _, b := range rep.Backends {
		ready[b.Backend] = b.Ready
		if !b.Ready && b.Reason == "" {
			t.Errorf("backend %s not Ready without a reason", b.Backend)
		}
	}
	if _, ok := ready["gvisor"]; !ok || len(ready) < 2 {
		t.Errorf("doctor lists %v, want native and gvisor", ready)
	}
	if !ready["native"] {
		t.Errorf("native does not reach Ready here")
	}
	if os.Geteuid() == 0 && !ready["gvisor"] {
		t.Errorf("gvisor does not reach Ready as root here")
	}
	names := map[string]bool{}
	for _, c := range rep.Checks {
		names[c.Name] = true
	}
	for _, n := range []string{"landlock", "user namespaces", "seccomp", "cgroups", "runsc", "openssl"} {
		if !names[n] {
			t.Errorf("doctor does not check %s", n)
		}
	}
}
