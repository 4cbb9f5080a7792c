package measure

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/internal/receiver"
	"github.com/moat-sandbox/moat/internal/testenv"
)

// hostSetup makes grants and a readable host secret in a temp dir.
type hostSetup struct {
	dir, rw, ro, secret string
}

func newHostSetup(t *testing.T) hostSetup {
	t.Helper()
	d := t.TempDir()
	h := hostSetup{dir: d, rw: filepath.Join(d, "ws"), ro: filepath.Join(d, "ro"), secret: filepath.Join(d, "secret")}
	for _, p := range []string{h.rw, h.ro} {
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(h.ro, "file"), []byte("ro"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(h.secret, []byte("sentinel"), 0o644); err != nil {
		t.Fatal(err)
	}
	return h
}

func (h hostSetup) config() Config {
	return Config{ReadWrite: []string{h.rw}, ReadOnly: []string{h.ro}, HostSecrets: []string{h.secret}}
}

func checkByName(t *testing.T, rep *Report, name string) Check {
	t.Helper()
	for _, c := range rep.Checks {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no check %q in the report", name)
	return Check{}
}

// wantCheck asserts a check's outcome and OK.
func wantCheck(t *testing.T, rep *Report, name, outcome string, ok bool) {
	t.Helper()
	c := checkByName(t, rep, name)
	if c.Outcome != outcome || c.OK != ok {
		t.Errorf("check %s: got outcome %s ok=%v (%s), want outcome %s ok=%v", name, c.Outcome, c.OK, c.Detail, outcome, ok)
	}
}

// userNSPossible reports whether this process may make a user namespace.
func userNSPossible() bool {
	out, _ := probeNewUserNS(false)
	return out == OutcomeSucceeded
}

// TestConfirmUnconfined runs the real measurement on a backend that
// confines nothing and claims everything: filesystem, egress and privilege
// must come out not enforced, each for the right reason, while every
// positive control succeeds (so the failures are the violations').
func TestConfirmUnconfined(t *testing.T) {
	h := newHostSetup(t)
	sb := newFakeSandbox(t)

	// Receivers on the host's loopback that the sandbox must not reach.
	recv, err := receiver.Start(receiver.Options{EchoUDP: true}) // echo: an answer
	if err != nil {
		t.Fatal(err)
	}
	defer recv.Close()
	cfg := h.config()
	cfg.ExtraTCPPorts = []int{recv.TCPPort()}
	cfg.ExtraUDPPorts = []int{recv.UDPPort()}

	leak, err := os.Open(h.dir) // a host directory fd, handed to the helper
	if err != nil {
		t.Fatal(err)
	}
	defer leak.Close()
	sb.leak = leak

	props, rep, err := Confirm(context.Background(), sb, cfg)
	if err != nil {
		t.Fatalf("Confirm: %v", err)
	}
	for _, np := range props.Named() {
		t.Logf("%s: enforced=%v mechanism=%q: %s", np.Name, np.Enforced, np.Mechanism, np.Detail)
	}
	if props.FilesystemConfinement.Enforced || props.EgressInterception.Enforced || props.PrivilegeFloor.Enforced {
		t.Errorf("an unconfined helper was judged enforced: %+v", props)
	}
	var nre *boundary.NotReadyError
	if err := boundary.Ready(props, boundary.Requirements{}); !errors.As(err, &nre) || nre.Property != PropFilesystem {
		t.Errorf("Ready: got %v, want not ready on %s", err, PropFilesystem)
	}
	// Mechanisms are recorded, and changed nothing.
	if props.FilesystemConfinement.Mechanism != lyingMechanisms.FilesystemConfinement || props.PrivilegeFloor.Mechanism != lyingMechanisms.PrivilegeFloor {
		t.Errorf("mechanisms not recorded: %+v", props)
	}

	// Filesystem: the violations succeeded, the controls too.
	wantCheck(t, rep, "fs/read-secret:"+h.secret, OutcomeSucceeded, false)
	var sentinel string
	for _, c := range rep.Checks {
		if strings.HasPrefix(c.Name, "fs/read-secret:/tmp/.moat-measure-sentinel-") {
			sentinel = c.Name
		}
	}
	if sentinel == "" {
		t.Error("no check of the host /tmp sentinel")
	} else {
		wantCheck(t, rep, sentinel, OutcomeSucceeded, false)
		if _, err := os.Stat(strings.TrimPrefix(sentinel, "fs/read-secret:")); err == nil {
			t.Errorf("the /tmp sentinel was left behind")
		}
	}
	if os.Geteuid() == 0 {
		wantCheck(t, rep, "fs/write-outside:/", OutcomeSucceeded, false)
	} else {
		wantCheck(t, rep, "fs/write-outside:/", OutcomeFailed, true)
	}
	wantCheck(t, rep, "fs/write-ro:"+h.ro, OutcomeSucceeded, false)
	wantCheck(t, rep, "fs/write-rw:"+h.rw, OutcomeSucceeded, true)
	wantCheck(t, rep, "fs/"+opInheritedFDs, OutcomeSucceeded, false)
	if c := checkByName(t, rep, "fs/"+opInheritedFDs); !strings.Contains(c.Detail, "fd 3: "+h.dir) {
		t.Errorf("inherited fd detail %q does not name fd 3 and %s", c.Detail, h.dir)
	}
	wantCheck(t, rep, "fs/read-ro:"+h.ro, OutcomeSucceeded, true)

	// Egress: the host receivers were reached and saw it.
	tcpName := "net/tcp:127.0.0.1:" + strconv.Itoa(cfg.ExtraTCPPorts[0])
	wantCheck(t, rep, tcpName, OutcomeSucceeded, false)
	wantCheck(t, rep, "net/dns-udp:127.0.0.1:"+strconv.Itoa(cfg.ExtraUDPPorts[0]), OutcomeSucceeded, false)
	li, _ := sb.Listener()
	wantCheck(t, rep, "net/tcp-broker:127.0.0.1:"+strconv.Itoa(li.Port), OutcomeSucceeded, true)
	wantCheck(t, rep, checkBrokerSeen, OutcomeSucceeded, true)
	// Confirm's own receivers: host TCP, UDP, an abstract Unix socket and
	// a Unix socket placed in the read-write grant; each was reached.
	wantCheck(t, rep, checkReceivers, OutcomeSucceeded, false)
	var unixAbstract, unixInGrant bool
	for _, c := range rep.Checks {
		switch {
		case strings.HasPrefix(c.Name, "net/unix:@moat-measure-"):
			unixAbstract = c.Outcome == OutcomeSucceeded
		case strings.HasPrefix(c.Name, "net/unix:"+h.rw+"/"):
			unixInGrant = c.Outcome == OutcomeSucceeded
		}
	}
	if !unixAbstract || !unixInGrant {
		t.Errorf("Unix receivers reached: abstract %v, in the grant %v; want both", unixAbstract, unixInGrant)
	}
	if c := checkByName(t, rep, checkReceivers); !strings.Contains(c.Detail, "unix @moat-measure-") || !strings.Contains(c.Detail, "tcp connection") || !strings.Contains(c.Detail, "udp datagram") {
		t.Errorf("host receivers detail %q does not name tcp, udp and the abstract socket", c.Detail)
	}
	seen := map[string]bool{}
	deadline := time.After(5 * time.Second)
wait:
	for !seen["tcp"] || !seen["udp"] {
		select {
		case e := <-recv.Events:
			seen[e.Net] = true
		case <-deadline:
			break wait
		}
	}
	if !seen["tcp"] {
		t.Error("the host TCP receiver saw no connection, yet the check says it connected")
	}
	if !seen["udp"] {
		t.Error("the host UDP receiver saw no datagram, yet the check says it was answered")
	}

	// Privilege: no_new_privs is unset on the host; root is root; an
	// unprivileged user can (usually) make a user namespace.
	wantCheck(t, rep, "priv/"+opNoNewPrivs, OutcomeSucceeded, false)
	if os.Geteuid() == 0 {
		wantCheck(t, rep, "priv/"+opUID, OutcomeSucceeded, false)
		wantCheck(t, rep, "priv/"+opCaps, OutcomeSucceeded, false)
	} else {
		wantCheck(t, rep, "priv/"+opUID, OutcomeFailed, true)
		if userNSPossible() {
			wantCheck(t, rep, "priv/"+opUnshare, OutcomeSucceeded, false)
			wantCheck(t, rep, "priv/"+opCloneUser, OutcomeSucceeded, false)
		} else {
			// Checked last, so that the rest of the test still runs.
			defer testenv.Need(t, false, "unprivileged user namespaces (to see unshare(CLONE_NEWUSER) succeed unconfined)")
		}
	}
	wantCheck(t, rep, "priv/"+opExec, OutcomeSucceeded, true)

	// The classes of issue 11, unconfined: a set-id file can be made, a
	// FIFO too, and a datagram reaches the host's socket in the grant.
	wantCheck(t, rep, "priv/"+opSetIDChmod, OutcomeSucceeded, false)
	wantCheck(t, rep, "priv/"+opSetIDCreate, OutcomeSucceeded, false)
	wantCheck(t, rep, "priv/"+opChmodPlain, OutcomeSucceeded, true)
	wantCheck(t, rep, "net/"+opFIFO, OutcomeSucceeded, false)
	wantCheck(t, rep, "net/"+opStreamPair, OutcomeSucceeded, true)
	dgram := 0
	for _, c := range rep.Checks {
		if strings.HasPrefix(c.Name, "net/unix-dgram:") {
			dgram++
			if c.Outcome != OutcomeSucceeded || c.OK {
				t.Errorf("check %s: got %s ok=%v (%s), want the datagram through", c.Name, c.Outcome, c.OK, c.Detail)
			}
		}
	}
	if dgram == 0 {
		t.Error("no net/unix-dgram check in the report")
	}
	if c := checkByName(t, rep, checkReceivers); !strings.Contains(c.Detail, "unix datagram") {
		t.Errorf("host receivers detail %q does not name the datagram", c.Detail)
	}

	// Attribution is real here: the host can attribute its own loopback.
	if !props.RequestAttribution.Enforced {
		t.Errorf("attribution on the host's own loopback: %s", props.RequestAttribution.Detail)
	}
	if c := checkByName(t, rep, checkAttribution); !strings.Contains(c.Detail, fmt.Sprintf("pid %d", sb.lastPID.Load())) {
		t.Errorf("attribution detail %q does not name the helper pid %d", c.Detail, sb.lastPID.Load())
	}

	// Nothing was left behind, and the broker listener is still open.
	if m, _ := filepath.Glob(filepath.Join(h.rw, ".moat-measure-*.sock")); len(m) > 0 {
		t.Errorf("receiver socket left behind: %v", m)
	}
	for _, d := range []string{h.dir, h.rw, h.ro, "/"} {
		if m, _ := filepath.Glob(filepath.Join(d, ".moat-measure-*")); len(m) > 0 {
			t.Errorf("left behind: %v", m)
		}
	}
	assertListenerOpen(t, sb)
}

// assertListenerOpen shows the broker's listener still accepts.
func assertListenerOpen(t *testing.T, sb *fakeSandbox) {
	t.Helper()
	li, _ := sb.Listener()
	ln, err := net.FileListener(li.File)
	if err != nil {
		t.Fatalf("broker listener unusable after Confirm: %v", err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("broker listener closed by Confirm: %v", err)
	}
	defer c.Close()
	ln.(*net.TCPListener).SetDeadline(time.Now().Add(5 * time.Second))
	a, err := ln.Accept()
	if err != nil {
		t.Fatalf("broker listener does not accept after Confirm: %v", err)
	}
	a.Close()
}

// TestConfirmAttribution: an attributor that claims a process it
// cannot know about, or the wrong binary, does not make attribution
// enforced; a declared endpoint-only backend is Unavailable.
func TestConfirmAttribution(t *testing.T) {
	h := newHostSetup(t)
	sum, err := selfSHA256()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name        string
		attr        boundary.Attributor
		unavailable string
		want        string
	}{
		{"wrong pid", fixedAttributor{Status: "resolved", PID: 1, Executable: "/sbin/init", SHA256: sum}, "", "attributed to pid 1"},
		{"wrong binary", nil, "", "but moat's binary has sha256"},
		{"unresolved", fixedAttributor{Status: "unavailable", Reason: "no idea"}, "", "no idea"},
		{"declared unavailable", nil, "gvisor netstack hides host sockets", "declares attribution unavailable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sb := newFakeSandbox(t)
			if tc.attr != nil {
				sb.attr = tc.attr
			}
			if tc.name == "wrong binary" {
				sb.attr = pidEchoAttributor{sb: sb, sha: strings.Repeat("0", 64)}
			}
			sb.mech.AttributionUnavailable = tc.unavailable
			cfg := h.config()
			cfg.RequireAttribution = true
			props, _, err := Confirm(context.Background(), sb, cfg)
			if err != nil {
				t.Fatal(err)
			}
			a := props.RequestAttribution
			if a.Enforced {
				t.Fatalf("attribution enforced: %+v", a)
			}
			if a.Unavailable != (tc.unavailable != "") {
				t.Errorf("unavailable = %v, want %v", a.Unavailable, tc.unavailable != "")
			}
			if !strings.Contains(a.Detail, tc.want) {
				t.Errorf("detail %q does not contain %q", a.Detail, tc.want)
			}
			err = boundary.Ready(props, boundary.Requirements{RequireAttribution: true})
			var nre *boundary.NotReadyError
			if !errors.As(err, &nre) {
				t.Errorf("Ready: got %v, want a NotReadyError", err)
			}
		})
	}
}

// pidEchoAttributor names the right pid (it peeks at the fake) with a
// made-up hash.
type pidEchoAttributor struct {
	sb  *fakeSandbox
	sha string
}

func (a pidEchoAttributor) Attribute(net.Conn) boundary.Attribution {
	return boundary.Attribution{Status: "resolved", PID: int(a.sb.lastPID.Load()), Executable: "/bin/true", SHA256: a.sha}
}
