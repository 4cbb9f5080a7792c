//go:build linux

package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/audit"
)

type sbState struct {
	Name          string         `json:"name"`
	Phase         string         `json:"phase"`
	Error         string         `json:"error"`
	RunID         string         `json:"run_id"`
	Journal       string         `json:"journal"`
	PublicKey     string         `json:"public_key"`
	KeyID         string         `json:"keyid"`
	HostPID       int            `json:"host_pid"`
	SupervisorPID int            `json:"supervisor_pid"`
	Processes     map[string]int `json:"processes"`
	Properties    map[string]struct {
		Enforced bool `json:"enforced"`
	} `json:"properties"`
}

func (e *env) get(name string) (sbState, result) {
	e.t.Helper()
	r := e.moat("sandbox", "get", name, "-o", "json")
	var s sbState
	if r.code == 0 {
		if err := json.Unmarshal([]byte(r.stdout), &s); err != nil {
			e.t.Fatalf("get -o json: %v\n%s", err, r)
		}
	}
	return s, r
}

func TestSandboxLifecycle(t *testing.T) {
	e := newEnv(t)
	pol := e.policy("")
	if r := e.moat("sandbox", "create", "life", "--policy", pol); r.code != 0 {
		t.Fatalf("create: %s", r)
	}
	s, r := e.get("life")
	if r.code != 0 || s.Phase != "Ready" {
		t.Fatalf("get: phase %q, want Ready\n%s", s.Phase, r)
	}
	for name, p := range s.Properties {
		if !p.Enforced && name != "request_attribution" {
			t.Errorf("property %s not enforced in a Ready sandbox", name)
		}
	}
	if r := e.moat("sandbox", "create", "--name", "life", "--policy", pol); r.code == 0 || !strings.Contains(r.stderr, "already exists") {
		t.Errorf("duplicate create: %s", r)
	}
	if r := e.moat("sandbox", "create", "--name", "Bad/Name", "--policy", pol); r.code != 125 {
		t.Errorf("invalid name: %s", r)
	}
	l := e.moat("sandbox", "list", "-o", "json")
	var all []sbState
	if err := json.Unmarshal([]byte(l.stdout), &all); err != nil || len(all) != 1 || all[0].Name != "life" {
		t.Errorf("list: %v\n%s", err, l)
	}
	marker := fmt.Sprintf("marker-%d", time.Now().UnixNano())
	x := e.moat("sandbox", "exec", "life", "--", "echo", marker)
	if x.code != 0 || x.stdout != marker+"\n" {
		t.Errorf("exec: got %q, want exactly %q\n%s", x.stdout, marker+"\n", x)
	}
	if x := e.moat("sandbox", "exec", "life", "--", "sh", "-c", "exit 3"); x.code != 3 {
		t.Errorf("exec exit code: got %d, want 3", x.code)
	}
	// Without "--", as moat run: the command keeps its own flags.
	if x := e.moat("sandbox", "exec", "life", "sh", "-c", "exit 4"); x.code != 4 {
		t.Errorf("exec without --: got %d, want 4\n%s", x.code, x)
	}
	// A long command line (a script passed inline) reaches the sandbox
	// whole: the supervisor's control socket is a stream, and one read of
	// such a request returned only its first 36 KiB ("bad control
	// request").
	long := strings.Repeat("x", 40<<10)
	if x := e.moat("sandbox", "exec", "life", "--", "sh", "-c", `echo ${#1} ${#2}`, "sh", long, long); x.code != 0 || x.stdout != "40960 40960\n" {
		t.Errorf("exec with two 40 KiB arguments: got %q, want their lengths\n%s", x.stdout, x)
	}
	// Longer than a process may be given (the init's channel, 128 KiB),
	// or than a request may be (1 MiB): refused, saying what to do.
	for _, n := range []int{5, 26} {
		args := []string{"sandbox", "exec", "life", "--", "true"}
		for range n {
			args = append(args, long)
		}
		if x := e.moat(args...); x.code != 125 || !strings.Contains(x.stderr, "put long input in a file in the workspace") {
			t.Errorf("exec with %d KiB of arguments: got %d, want 125 and the limit explained\n%s", n*40, x.code, x)
		}
	}
	// Exit codes as moat run's: 127 not found, 126 not executable.
	if x := e.moat("sandbox", "exec", "life", "/no/such/command"); x.code != 127 {
		t.Errorf("exec of a missing command: got %d, want 127\n%s", x.code, x)
	}
	notExec := filepath.Join(e.workspace, "not-executable")
	if err := os.WriteFile(notExec, []byte("data\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if x := e.moat("sandbox", "exec", "life", notExec); x.code != 126 {
		t.Errorf("exec of a non-executable file: got %d, want 126\n%s", x.code, x)
	}
	if r := e.moat("sandbox", "delete", "life"); r.code != 0 {
		t.Fatalf("delete: %s", r)
	}
	if _, r := e.get("life"); r.code == 0 || !strings.Contains(r.stderr, "not found") {
		t.Errorf("get after delete: %s", r)
	}
	// A missing sandbox is refused alike by get, exec and delete: 125;
	// delete --ignore-not-found is the idempotent form.
	if r := e.moat("sandbox", "delete", "life"); r.code != 125 || !strings.Contains(r.stderr, "no sandbox named life") {
		t.Errorf("second delete: got %d, want 125 naming the sandbox\n%s", r.code, r)
	}
	if r := e.moat("sandbox", "exec", "life", "true"); r.code != 125 || !strings.Contains(r.stderr, "no sandbox named life") {
		t.Errorf("exec after delete: got %d, want 125 naming the sandbox\n%s", r.code, r)
	}
	if r := e.moat("sandbox", "delete", "life", "--ignore-not-found"); r.code != 0 {
		t.Errorf("second delete --ignore-not-found: %s", r)
	}
	if v := e.moat("audit", "verify", s.Journal, "--pubkey", s.PublicKey); v.code != 0 {
		t.Errorf("journal after delete: %s", v)
	}
	j, _ := os.ReadFile(s.Journal)
	if n := strings.Count(string(j), "\n"); n < 7 {
		// run.started, boundary.confirmed, 2×(process.started, process.exited), run.terminated
		t.Errorf("journal has %d records, want at least 7", n)
	}
	// Each exec is journaled with its argv and the binary it named.
	found := false
	for _, l := range strings.Split(strings.TrimSpace(string(j)), "\n") {
		e, err := audit.ParseLine([]byte(l))
		if err != nil {
			t.Fatalf("journal line: %v", err)
		}
		if ps, ok := e.Record.(audit.ProcessStarted); ok && len(ps.Argv) == 2 && ps.Argv[0] == "echo" {
			found = true
			if ps.Executable != "/usr/bin/echo" || len(ps.SHA256) != 64 {
				t.Errorf("process.started for echo names %q %q, want /usr/bin/echo and its sha256", ps.Executable, ps.SHA256)
			}
		}
	}
	if !found {
		t.Errorf("no process.started record for the exec'd echo")
	}
}

// An exec'd process is as confined as a moat run workload: same denials,
// same positive controls.
func TestSandboxExecConfinedAsRun(t *testing.T) {
	e := newEnv(t)
	pol := e.policy("")
	secret := e.dir + "/secret-file"
	os.WriteFile(secret, []byte("s"), 0o644)
	actions := []string{"broker=", "read=" + secret, "write=" + e.workspace + "/w", "write=/usr/x",
		"unshare-user=", "socket=unix,stream,0", "socket=packet,raw,0", "keyctl=", "fork="}
	run := e.helper(pol, "probe", actions...)
	if run.code != 0 {
		t.Fatalf("run: %s", run)
	}
	if r := e.moat("sandbox", "create", "--name", "conf", "--policy", pol); r.code != 0 {
		t.Fatalf("create: %s", r)
	}
	defer e.moat("sandbox", "delete", "conf")
	ex := e.moat(append([]string{"sandbox", "exec", "conf", "--", e.probe, helperArg}, actions...)...)
	if ex.code != 0 {
		t.Fatalf("exec: %s", ex)
	}
	for _, a := range actions {
		gr, ge := line(t, run, a), line(t, ex, a)
		if strings.HasPrefix(gr, "ok") != strings.HasPrefix(ge, "ok") {
			t.Errorf("%s: run says %q, exec says %q", a, gr, ge)
		}
	}
	wantOK(t, ex, "broker=")
	wantOK(t, ex, "fork=")
	wantOK(t, ex, "write="+e.workspace+"/w")
	wantErr(t, ex, "read="+secret, "")
	wantErr(t, ex, "unshare-user=", "")
}

func TestSandboxConcurrentCreate(t *testing.T) {
	e := newEnv(t)
	const n = 10
	// Ten sandboxes that share nothing: each its own workspace and policy.
	pols := make([]string, n)
	for i := range pols {
		pols[i] = e.policyAt(filepath.Join(e.dir, fmt.Sprintf("policy-%d.yaml", i)), e.newWorkspace(fmt.Sprintf("ws-%d", i)), "")
	}
	var wg sync.WaitGroup
	errs := make([]string, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			if r := e.moat("sandbox", "create", "--name", fmt.Sprintf("c%d", i), "--policy", pols[i]); r.code != 0 {
				errs[i] = r.String()
			}
		}(i)
	}
	wg.Wait()
	runs, pids := map[string]bool{}, map[int]bool{}
	for i := 0; i < n; i++ {
		if errs[i] != "" {
			t.Errorf("create c%d: %s", i, errs[i])
			continue
		}
		s, r := e.get(fmt.Sprintf("c%d", i))
		if s.Phase != "Ready" {
			t.Errorf("c%d: phase %q\n%s", i, s.Phase, r)
		}
		if runs[s.RunID] || pids[s.HostPID] {
			t.Errorf("c%d shares a run id or host pid with another sandbox", i)
		}
		runs[s.RunID], pids[s.HostPID] = true, true
		// Each sandbox has its own network namespace.
		for j := range pids {
			if j != s.HostPID && nsOf(j, "net") == nsOf(s.HostPID, "net") && nsOf(j, "net") != "" {
				t.Errorf("c%d shares a network namespace", i)
			}
		}
	}
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			if r := e.moat("sandbox", "delete", fmt.Sprintf("c%d", i)); r.code != 0 {
				errs[i] = r.String()
			}
		}(i)
	}
	wg.Wait()
	for i := 0; i < n; i++ {
		if errs[i] != "" {
			t.Errorf("delete c%d: %s", i, errs[i])
		}
	}
	l := e.moat("sandbox", "list", "-o", "json")
	if strings.TrimSpace(l.stdout) != "[]" {
		t.Errorf("list after deleting all: %s", l)
	}
	for pid := range pids {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil && procAlive(pid) {
			t.Errorf("sandbox init %d still alive after delete", pid)
		}
	}
}

func nsOf(pid int, ns string) string {
	l, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", pid, ns))
	return l
}

// procAlive is false for a missing or zombie process.
func procAlive(pid int) bool {
	st := procState(pid)
	return st != "" && st != "Z"
}

func TestSandboxSupervisorKill(t *testing.T) {
	e := newEnv(t)
	pol := e.policy("")
	if r := e.moat("sandbox", "create", "--name", "victim", "--policy", pol); r.code != 0 {
		t.Fatalf("create: %s", r)
	}
	marker := fmt.Sprintf("moat-e2e-sv-%d", time.Now().UnixNano())
	ex := e.command("sandbox", "exec", "victim", "--", "sh", "-c", "setsid sh -c 'sleep 300 & exit 0' "+marker+"; sleep 300 # "+marker)
	if err := ex.Start(); err != nil {
		t.Fatal(err)
	}
	defer ex.Process.Kill()
	waitFor(t, "the exec'd processes", 20*time.Second, func() bool { return len(findMarked(marker)) >= 2 })
	s, _ := e.get("victim")
	if s.SupervisorPID == 0 {
		t.Fatalf("no supervisor pid in state")
	}
	syscall.Kill(s.SupervisorPID, syscall.SIGKILL)
	waitFor(t, "every sandbox process to die", 10*time.Second, func() bool {
		return len(findMarked(marker)) == 0 && !procAlive(s.HostPID)
	})
	g, r := e.get("victim")
	if g.Phase != "Error" || g.Error == "" {
		t.Errorf("get after supervisor SIGKILL: phase %q error %q\n%s", g.Phase, g.Error, r)
	}
	if r := e.moat("sandbox", "delete", "victim"); r.code != 0 {
		t.Errorf("delete after supervisor loss: %s", r)
	}
	if _, r := e.get("victim"); r.code == 0 {
		t.Errorf("still there after delete: %s", r)
	}
	if v := e.moat("audit", "verify", s.Journal, "--pubkey", s.PublicKey); v.code != 2 {
		t.Errorf("journal of a killed supervisor: got exit %d, want 2 (incomplete prefix)\n%s", v.code, v)
	}
}
