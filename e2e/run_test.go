//go:build linux

package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/examples"
	"github.com/moat-sandbox/moat/internal/probekit"
	"github.com/moat-sandbox/moat/internal/receiver"
)

// line returns the probe's result line for an action, or fails.
func line(t *testing.T, r result, action string) string {
	t.Helper()
	for _, l := range strings.Split(r.stdout, "\n") {
		if strings.HasPrefix(l, action+" ") {
			return strings.TrimPrefix(l, action+" ")
		}
	}
	t.Fatalf("no result for %q\n%s", action, r)
	return ""
}

func wantOK(t *testing.T, r result, action string) {
	t.Helper()
	if got := line(t, r, action); got != "ok" && !strings.HasPrefix(got, "ok ") {
		t.Errorf("%s: got %q, want ok (positive control)", action, got)
	}
}

func wantErr(t *testing.T, r result, action, substr string) {
	t.Helper()
	got := line(t, r, action)
	if !strings.HasPrefix(got, "err") || !strings.Contains(got, substr) {
		t.Errorf("%s: got %q, want an error containing %q", action, got, substr)
	}
}

// The issue's own acceptance command, on the shipped example policy.
func TestRunMinimalExample(t *testing.T) {
	e := newEnv(t)
	pol := filepath.Join(e.dir, "minimal.yaml")
	if err := os.WriteFile(pol, examples.Minimal, 0o644); err != nil {
		t.Fatal(err)
	}
	ws := filepath.Join(e.dir, "workspace") // ./workspace beside the policy
	_ = ws
	r := e.moat("run", "--policy", pol, "--", "sh", "-c",
		`id -u; grep -E "NoNewPrivs|CapEff|Seccomp:" /proc/self/status`)
	if r.code != 0 {
		t.Fatalf("moat run failed\n%s", r)
	}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if uid, err := strconv.Atoi(lines[0]); err != nil || uid == 0 {
		t.Errorf("uid inside: got %q, want a non-zero number", lines[0])
	}
	for _, re := range []string{`NoNewPrivs:\s+1`, `CapEff:\s+0000000000000000`, `Seccomp:\s+2`} {
		if !regexp.MustCompile(re).MatchString(r.stdout) {
			t.Errorf("status lacks %s\n%s", re, r)
		}
	}
}

func TestRunExitCodes(t *testing.T) {
	e := newEnv(t)
	pol := e.policy("")
	for _, c := range []struct {
		name string
		argv []string
		want int
	}{
		{"workload code", []string{"sh", "-c", "exit 7"}, 7},
		{"success", []string{"true"}, 0},
		{"not found", []string{"/usr/bin/no-such-command-moat"}, 127},
		{"not executable", []string{"/etc/hostname-not-granted"}, 127},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := e.moat(append([]string{"run", "--policy", pol, "--"}, c.argv...)...)
			if r.code != c.want {
				t.Errorf("got exit %d, want %d\n%s", r.code, c.want, r)
			}
		})
	}
	// 126: a granted file without execute permission.
	noexec := filepath.Join(e.binDir, "noexec")
	if err := os.WriteFile(noexec, []byte("#!/bin/sh\necho hi\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := e.moat("run", "--policy", pol, "--", noexec); r.code != 126 {
		t.Errorf("non-executable: got exit %d, want 126\n%s", r.code, r)
	}
}

// Host secrets are unreadable and writes outside the workspace fail, while
// the workspace itself reads and writes.
func TestRunFilesystemWalls(t *testing.T) {
	e := newEnv(t)
	secretDir := filepath.Join(e.dir, "secret")
	os.Mkdir(secretDir, 0o755)
	secret := filepath.Join(secretDir, "token")
	os.WriteFile(secret, []byte("host-secret\n"), 0o644)
	pol := e.policy("")
	// Writes aimed at host paths: /var/tmp is not granted (it does not
	// exist inside); e.dir/outside lies beside the workspace, whose parent
	// inside is the sandbox's private /tmp (a write there may succeed, but
	// it must never reach the host, which is what is checked below).
	hostOutside := filepath.Join("/var/tmp", fmt.Sprintf("moat-e2e-%d", os.Getpid()))
	defer os.Remove(hostOutside)
	r := e.helper(pol, "probe",
		"read="+secret, "read=/etc/shadow", "read=/root", "write="+filepath.Join(e.dir, "outside"), "write="+hostOutside,
		"write=/usr/moat-e2e", "write="+filepath.Join(e.binDir, "x"),
		"write="+filepath.Join(e.workspace, "inside"), "read="+filepath.Join(e.workspace, "inside"),
		"read=/usr/bin/sh")
	if r.code != 0 {
		t.Fatalf("%s", r)
	}
	wantErr(t, r, "read="+secret, "")
	wantErr(t, r, "read=/etc/shadow", "")
	wantErr(t, r, "read=/root", "")
	wantErr(t, r, "write="+hostOutside, "")
	if _, err := os.Stat(hostOutside); err == nil {
		t.Errorf("a file appeared in /var/tmp on the host")
	}
	wantErr(t, r, "write=/usr/moat-e2e", "")
	wantErr(t, r, "write="+filepath.Join(e.binDir, "x"), "")
	wantOK(t, r, "write="+filepath.Join(e.workspace, "inside"))
	wantOK(t, r, "read="+filepath.Join(e.workspace, "inside"))
	wantOK(t, r, "read=/usr/bin/sh")
	if _, err := os.Stat(filepath.Join(e.dir, "outside")); err == nil {
		t.Errorf("a file appeared outside the workspace")
	}
	if b, err := os.ReadFile(filepath.Join(e.workspace, "inside")); err != nil || string(b) != probekit.Written {
		t.Errorf("workspace write did not land on the host: %q %v", b, err)
	}
}

// receivers on the host observe nothing while the broker is reachable.
func TestRunNetworkWalls(t *testing.T) {
	e := newEnv(t)
	pol := e.policy("")
	recv, err := receiver.Start(receiver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer recv.Close()
	tcpAddr, udpAddr := recv.TCP.Addr().String(), recv.UDP.LocalAddr().String()
	got := make(chan string, 16)
	abs := fmt.Sprintf("moat-e2e-%d", os.Getpid())
	al, err := net.Listen("unix", "@"+abs)
	if err != nil {
		t.Fatal(err)
	}
	defer al.Close()
	go func() {
		for {
			c, err := al.Accept()
			if err != nil {
				return
			}
			got <- "abstract connection"
			c.Close()
		}
	}()
	// Positive delivery controls from the host side: each receiver works.
	for _, ctl := range []func() error{
		func() error {
			c, err := net.Dial("tcp", tcpAddr)
			if err == nil {
				c.Close()
			}
			return err
		},
		func() error {
			c, err := net.Dial("udp", udpAddr)
			if err == nil {
				c.Write([]byte("ctl"))
				c.Close()
			}
			return err
		},
		func() error {
			c, err := net.Dial("unix", "@"+abs)
			if err == nil {
				c.Close()
			}
			return err
		},
	} {
		if err := ctl(); err != nil {
			t.Fatalf("delivery control: %v", err)
		}
		select {
		case <-got:
		case <-recv.Events:
		case <-time.After(5 * time.Second):
			t.Fatal("delivery control: receiver observed nothing")
		}
	}

	r := e.helper(pol, "probe", "broker=", "tcp="+tcpAddr, "udp="+udpAddr, "abstract="+abs,
		"socket=inet,stream,0", "socket=unix,stream,0", "socket=packet,raw,0", "socket=vsock,stream,0", "socket=inet,stream,mptcp")
	if r.code != 0 {
		t.Fatalf("%s", r)
	}
	wantOK(t, r, "broker=")
	wantErr(t, r, "tcp="+tcpAddr, "")
	wantErr(t, r, "abstract="+abs, "")
	wantOK(t, r, "socket=inet,stream,0")
	wantErr(t, r, "socket=unix,stream,0", "")
	wantErr(t, r, "socket=packet,raw,0", "")
	wantErr(t, r, "socket=vsock,stream,0", "")
	wantErr(t, r, "socket=inet,stream,mptcp", "")
	select {
	case o := <-got:
		t.Errorf("a host receiver observed traffic from the sandbox: %s", o)
	case o := <-recv.Events:
		t.Errorf("a host receiver observed traffic from the sandbox: %s", o)
	case <-time.After(300 * time.Millisecond):
	}
}

// A Unix socket that a host process places inside the writable workspace
// after the sandbox is Ready observes nothing.
func TestRunWorkspaceUnixSocket(t *testing.T) {
	e := newEnv(t)
	pol := e.policy("")
	runInfo := filepath.Join(e.dir, "run.json")
	sock := filepath.Join(e.workspace, "host.sock")
	dsock := filepath.Join(e.workspace, "host.dgram")
	goFile := filepath.Join(e.workspace, "go")
	cmd := exec.Command(moatBin(t), "run", "--policy", pol, "--run-info", runInfo, "--",
		e.probe, helperArg, "wait-file="+goFile, "unix="+sock, "unixgram="+dsock, "write="+filepath.Join(e.workspace, "after"))
	var so, se strings.Builder
	cmd.Stdout, cmd.Stderr = &so, &se
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "run info", 30*time.Second, func() bool { _, err := os.Stat(runInfo); return err == nil })
	got := make(chan string, 4)
	ul, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ul.Close()
	go func() {
		for {
			c, err := ul.Accept()
			if err != nil {
				return
			}
			got <- "unix stream connection"
			c.Close()
		}
	}()
	dl, err := net.ListenPacket("unixgram", dsock)
	if err != nil {
		t.Fatal(err)
	}
	defer dl.Close()
	go func() {
		buf := make([]byte, 256)
		for {
			n, _, err := dl.ReadFrom(buf)
			if err != nil {
				return
			}
			got <- fmt.Sprintf("unix datagram %q", buf[:n])
		}
	}()
	if os.Geteuid() == 0 {
		os.Lchown(sock, 65534, 65534)
		os.Lchown(dsock, 65534, 65534)
	}
	os.Chmod(sock, 0o777)
	os.Chmod(dsock, 0o777)
	// Delivery controls from the host.
	if c, err := net.Dial("unix", sock); err != nil {
		t.Fatalf("stream delivery control: %v", err)
	} else {
		c.Close()
		<-got
	}
	if c, err := net.Dial("unixgram", dsock); err != nil {
		t.Fatalf("datagram delivery control: %v", err)
	} else {
		c.Write([]byte("ctl"))
		c.Close()
		<-got
	}
	os.WriteFile(goFile, nil, 0o644)
	err = cmd.Wait()
	r := result{so.String(), se.String(), cmd.ProcessState.ExitCode()}
	if err != nil {
		t.Fatalf("%v\n%s", err, r)
	}
	wantOK(t, r, "wait-file="+goFile)
	wantErr(t, r, "unix="+sock, "")
	wantErr(t, r, "unixgram="+dsock, "")
	wantOK(t, r, "write="+filepath.Join(e.workspace, "after"))
	select {
	case o := <-got:
		t.Errorf("the workspace socket observed: %s", o)
	case <-time.After(300 * time.Millisecond):
	}
}

// Privilege: no new user namespace, io_uring, keyctl or ptrace; fork works.
func TestRunPrivilegeWalls(t *testing.T) {
	e := newEnv(t)
	pol := e.policy("")
	// Outside the sandbox, unshare(CLONE_NEWUSER) works for this user:
	// the control that shows the in-sandbox failure is the sandbox's doing.
	ctl := exec.Command("unshare", "--user", "true")
	if out, err := ctl.CombinedOutput(); err != nil {
		t.Fatalf("control: unshare --user fails outside the sandbox too: %v %s", err, out)
	}
	r := e.helper(pol, "probe", "fork=", "unshare-user=", "io_uring=", "keyctl=", "ptrace-child=")
	if r.code != 0 {
		t.Fatalf("%s", r)
	}
	wantOK(t, r, "fork=")
	wantErr(t, r, "unshare-user=", "")
	wantErr(t, r, "io_uring=", "")
	wantErr(t, r, "keyctl=", "")
	wantErr(t, r, "ptrace-child=", "")
	// unshare -U as a shell user would try it.
	r = e.moat("run", "--policy", pol, "--", "sh", "-c", "unshare -U true && echo ESCAPED || echo denied")
	if !strings.Contains(r.stdout, "denied") || strings.Contains(r.stdout, "ESCAPED") {
		t.Errorf("unshare -U inside: %s", r)
	}
}

// Only stdio and the policy's environment cross into the sandbox; no host
// process is visible or signalable.
func TestRunIsolationOfFDsEnvAndPIDs(t *testing.T) {
	e := newEnv(t)
	pol := e.policy("")
	extra, err := os.Open(e.probe)
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	cmd := exec.Command(moatBin(t), "run", "--policy", pol, "--", e.probe, helperArg,
		"fds=", "env=", "pids=", fmt.Sprintf("kill0=%d", os.Getpid()), "kill0=1")
	cmd.Env = append(os.Environ(), "MOAT_E2E_SECRET=hunter2")
	cmd.ExtraFiles = []*os.File{extra}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%v %s", err, out)
	}
	s := string(out)
	r := result{stdout: s}
	if strings.Contains(s, "hunter2") {
		t.Errorf("a secret from moat's environment is visible inside:\n%s", s)
	}
	if env := line(t, r, "env="); !strings.HasPrefix(env, "ok ") || !strings.Contains(env, "PATH=/usr/bin:/bin") {
		t.Errorf("the policy's env is missing inside (positive control):\n%s", s)
	}
	fds, ok := strings.CutPrefix(line(t, r, "fds="), "ok ")
	if !ok {
		t.Errorf("fds: %s", s)
	}
	for _, fd := range strings.Fields(fds) {
		n, _ := strconv.Atoi(fd)
		if n > 3 { // 0-2 stdio, 3 is ReadDir's own
			t.Errorf("an extra fd is open inside: %s", fds)
		}
	}
	pids, ok := strings.CutPrefix(line(t, r, "pids="), "ok ")
	if n := len(strings.Fields(pids)); !ok || n > 4 || n < 1 {
		t.Errorf("/proc inside shows %d pids (want only the sandbox's): %s", n, pids)
	}
	if !strings.Contains(s, fmt.Sprintf("kill0=%d err", os.Getpid())) && os.Getpid() != 1 {
		t.Errorf("a host pid is signalable from inside:\n%s", s)
	}
}

// SIGKILL to moat run leaves no process of the sandbox on the host, not even
// a detached setsid, double-forked grandchild.
func TestRunSupervisorKillLeavesNothing(t *testing.T) {
	e := newEnv(t)
	pol := e.policy("")
	marker := fmt.Sprintf("moat-e2e-marker-%d-%d", os.Getpid(), time.Now().UnixNano())
	runInfo := filepath.Join(e.dir, "run.json")
	script := fmt.Sprintf(`setsid sh -c 'sleep 300 & exit 0' %s; sleep 300 # %s`, marker, marker)
	cmd := exec.Command(moatBin(t), "run", "--policy", pol, "--run-info", runInfo, "--", "sh", "-c", script)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "run info", 30*time.Second, func() bool { _, err := os.Stat(runInfo); return err == nil })
	waitFor(t, "the sandbox's processes", 10*time.Second, func() bool { return len(findMarked(marker)) >= 2 })
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	waitFor(t, "every sandbox process to die", 10*time.Second, func() bool { return len(findMarked(marker)) == 0 })

	// The killed run's journal is a valid prefix: exit 2.
	var ri struct {
		Journal      string `json:"journal"`
		PublicKeyPEM string `json:"public_key_pem"`
	}
	b, _ := os.ReadFile(runInfo)
	if err := json.Unmarshal(b, &ri); err != nil {
		t.Fatalf("run info: %v", err)
	}
	pub := filepath.Join(e.dir, "pub.pem")
	os.WriteFile(pub, []byte(ri.PublicKeyPEM), 0o644)
	if r := e.moat("audit", "verify", ri.Journal, "--pubkey", pub); r.code != 2 {
		t.Errorf("journal of a killed run: got exit %d, want 2\n%s", r.code, r)
	}
}

// findMarked returns host pids whose command line holds marker.
func findMarked(marker string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && strings.Contains(string(b), marker) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// A Landlock ABI floor above the host's refuses before the workload runs,
// naming both ABIs.
func TestRunABIFloorRefuses(t *testing.T) {
	e := newEnv(t)
	abi, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, 1 /* LANDLOCK_CREATE_RULESET_VERSION */)
	if errno != 0 {
		t.Fatalf("landlock: %v", errno)
	}
	floor := int(abi) + 1
	pol := e.policy(fmt.Sprintf("landlock:\n  abi_floor: %d\n", floor))
	marker := filepath.Join(e.workspace, "ran")
	r := e.moat("run", "--policy", pol, "--", "sh", "-c", "touch "+marker)
	if r.code != 125 {
		t.Fatalf("got exit %d, want 125\n%s", r.code, r)
	}
	if !strings.Contains(r.stderr, strconv.Itoa(int(abi))) || !strings.Contains(r.stderr, strconv.Itoa(floor)) {
		t.Errorf("refusal does not name ABI %d and floor %d:\n%s", abi, floor, r)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Errorf("the workload ran despite the refusal")
	}
}

// A completed run leaves a journal that verifies complete (exit 0).
func TestRunJournalVerifies(t *testing.T) {
	e := newEnv(t)
	pol := e.policy("")
	runInfo := filepath.Join(e.dir, "run.json")
	r := e.moat("run", "--policy", pol, "--run-info", runInfo, "--", "true")
	if r.code != 0 {
		t.Fatalf("%s", r)
	}
	var ri struct {
		Journal      string `json:"journal"`
		PublicKeyPEM string `json:"public_key_pem"`
		KeyID        string `json:"keyid"`
	}
	b, _ := os.ReadFile(runInfo)
	if err := json.Unmarshal(b, &ri); err != nil {
		t.Fatalf("run info: %v", err)
	}
	if !strings.Contains(r.stderr, ri.KeyID) {
		t.Errorf("stderr does not show the key fingerprint %s:\n%s", ri.KeyID, r)
	}
	pub := filepath.Join(filepath.Dir(ri.Journal), "pubkey.pem")
	v := e.moat("audit", "verify", ri.Journal, "--pubkey", pub)
	if v.code != 0 {
		t.Fatalf("verify: %s", v)
	}
	// The records are run.started, boundary.confirmed, …, run.terminated.
	f, _ := os.Open(ri.Journal)
	defer f.Close()
	n := 0
	for sc := bufio.NewScanner(f); sc.Scan(); {
		n++
	}
	if n < 3 {
		t.Errorf("journal has %d records, want at least run.started, boundary.confirmed, run.terminated", n)
	}
}

// SIGTERM to moat run reaches the workload, whose own exit code comes back.
func TestRunForwardsSignals(t *testing.T) {
	e := newEnv(t)
	pol := e.policy("")
	ready := filepath.Join(e.workspace, "trap-set")
	runInfo := filepath.Join(e.dir, "run.json")
	cmd := e.command("run", "--policy", pol, "--run-info", runInfo, "--", "sh", "-c",
		`trap 'exit 42' TERM; touch `+ready+`; while :; do sleep 0.1; done`)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	waitFor(t, "the workload's trap", 30*time.Second, func() bool { _, err := os.Stat(ready); return err == nil })
	cmd.Process.Signal(syscall.SIGTERM)
	cmd.Wait()
	if got := cmd.ProcessState.ExitCode(); got != 42 {
		t.Errorf("got exit %d, want the workload's 42 from its TERM trap", got)
	}
}
