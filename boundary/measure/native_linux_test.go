package measure

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/internal/receiver"
	"github.com/moat-sandbox/moat/internal/testenv"
	"github.com/moat-sandbox/moat/policy"
)

// nobody is the host uid/gid the native backend runs the workload as when
// the tests run as root.
const nobody = 65534

func mkdirWorld(t *testing.T, pattern string) string {
	t.Helper()
	d, err := os.MkdirTemp("", pattern)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(d, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// TestConfirmNative: the measurement, run through the real native backend,
// finds all four properties enforced, while host receivers on the
// loopback observe nothing. (TestConfirmUnconfined is the same
// measurement finding them not enforced without the sandbox.)
func TestConfirmNative(t *testing.T) {
	testenv.Need(t, landlockABI() >= 1, "Landlock")
	testenv.Need(t, userNSPossible(), "unprivileged user namespaces")
	be, err := boundary.Lookup("native")
	if err != nil {
		t.Fatal(err)
	}
	ws, ro, outside := mkdirWorld(t, "moat-measure-ws-"), mkdirWorld(t, "moat-measure-ro-"), mkdirWorld(t, "moat-measure-outside-")
	if err := os.WriteFile(filepath.Join(ro, "file"), []byte("ro"), 0o644); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(outside, "secret")
	if err := os.WriteFile(secret, []byte("sentinel"), 0o644); err != nil { // readable by the workload's host uid
		t.Fatal(err)
	}
	var setuid []string
	if os.Geteuid() == 0 {
		if err := os.Chown(ws, nobody, nobody); err != nil {
			t.Fatal(err)
		}
		// A setuid-root copy of this binary in the workspace: it must not
		// raise the euid inside (nosuid, no_new_privs, unmapped owner).
		self, _ := os.Executable()
		suid := filepath.Join(ws, "suid")
		copyFile(t, self, suid, 0o755)
		if err := os.Chmod(suid, 0o755|os.ModeSetuid); err != nil {
			t.Fatal(err)
		}
		setuid = []string{suid}
	}
	readOnly := []string{ro}
	for _, p := range []string{"/usr", "/lib", "/lib64", "/bin"} {
		if _, err := os.Stat(p); err == nil {
			readOnly = append(readOnly, p)
		}
	}
	pol := &policy.Policy{
		Version: 1, Backend: "native",
		Landlock:   policy.Landlock{ABIFloor: 1},
		Filesystem: policy.Filesystem{ReadOnly: readOnly, ReadWrite: []string{ws}, TmpSize: 16 << 20},
		Process: policy.Process{UID: 1000, GID: 1000, HostUID: nobody, HostGID: nobody,
			Env:    map[string]string{"PATH": "/usr/bin:/bin"},
			Limits: policy.Limits{OpenFiles: 256, Pids: 128, Memory: 512 << 20}},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sb, err := be.Prepare(ctx, boundary.Spec{RunID: "measure-" + strconv.Itoa(os.Getpid()), Policy: pol, StateDir: t.TempDir()})
	if err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	defer sb.Terminate()

	recv, err := receiver.Start(receiver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer recv.Close()

	cfg := Config{
		ReadWrite: []string{ws}, ReadOnly: readOnly,
		HostSecrets:        []string{secret, outside, "/etc/shadow", "/root"},
		RequireAttribution: true,
		ExtraTCPPorts:      []int{recv.TCPPort()},
		ExtraUDPPorts:      []int{recv.UDPPort()},
		SetuidProbes:       setuid,
	}
	props, rep, err := Confirm(ctx, sb, cfg)
	if err != nil {
		t.Fatalf("Confirm: %v", err)
	}
	for _, c := range rep.Checks {
		if !c.OK {
			t.Errorf("%s %s %s: %s", c.Kind, c.Name, c.Outcome, c.Detail)
		}
	}
	for _, np := range props.Named() {
		t.Logf("%s: enforced=%v mechanism=%q: %s", np.Name, np.Enforced, np.Mechanism, np.Detail)
	}
	if err := boundary.Ready(props, boundary.Requirements{RequireAttribution: true}); err != nil {
		t.Errorf("Ready: %v", err)
	}
	select {
	case s := <-recv.Events:
		t.Errorf("a host receiver observed the sandbox: %s", s)
	case <-time.After(200 * time.Millisecond):
	}
}
