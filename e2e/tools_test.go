//go:build linux

package e2e

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/moat-sandbox/moat/internal/receiver"
)

// mcpProbe is the probe's "mcp" action: the official Go SDK's client,
// configured only from what moat put in the environment
// (MOAT_MCP_CALC_URL), calls the calc server. arg: "list", a tool name
// ("add", "mul": a=2, b=3), "env:NAME", or "config": list, at the URL
// that the file named by MOAT_MCP_CONFIG gives.
func mcpProbe(arg string) error {
	url := os.Getenv("MOAT_MCP_CALC_URL")
	if arg == "config" {
		// The generated client configuration, as an agent reads it.
		b, err := os.ReadFile(os.Getenv("MOAT_MCP_CONFIG"))
		if err != nil {
			return err
		}
		var cfg struct {
			MCPServers map[string]struct{ Type, URL string } `json:"mcpServers"`
		}
		if err := json.Unmarshal(b, &cfg); err != nil {
			return err
		}
		if cfg.MCPServers["calc"].Type != "http" {
			return fmt.Errorf("config %s has no http server calc", b)
		}
		url, arg = cfg.MCPServers["calc"].URL, "list"
	}
	if url == "" {
		return fmt.Errorf("MOAT_MCP_CALC_URL is not set")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := sdk.NewClient(&sdk.Implementation{Name: "probe", Version: "1"}, nil)
	cs, err := c.Connect(ctx, &sdk.StreamableClientTransport{Endpoint: url, MaxRetries: -1}, nil)
	if err != nil {
		return err
	}
	defer cs.Close()
	if arg == "list" {
		lt, err := cs.ListTools(ctx, nil)
		if err != nil {
			return err
		}
		var names []string
		for _, t := range lt.Tools {
			names = append(names, t.Name)
		}
		fmt.Printf("mcp-tools %s\n", strings.Join(names, ","))
		return nil
	}
	p := &sdk.CallToolParams{Name: arg, Arguments: map[string]any{"b": 3, "a": 2}}
	if name, ok := strings.CutPrefix(arg, "env:"); ok {
		p = &sdk.CallToolParams{Name: "env", Arguments: map[string]any{"name": name}}
	}
	res, err := cs.CallTool(ctx, p)
	if err != nil {
		return err
	}
	for _, ct := range res.Content {
		if tc, ok := ct.(*sdk.TextContent); ok {
			fmt.Printf("mcp-result %s %s\n", arg, tc.Text)
		}
	}
	return nil
}

// buildMCPCalc puts examples/mcp-calc into dir: MOAT_MCP_CALC_BIN when
// set (scripts/test builds it, as it builds moat), else built here.
func buildMCPCalc(t *testing.T, dir string) string {
	t.Helper()
	out := filepath.Join(dir, "mcp-calc")
	if p := os.Getenv("MOAT_MCP_CALC_BIN"); p != "" {
		copyFile(t, p, out, 0o755)
		return out
	}
	cmd := exec.Command("go", "build", "-o", out, "github.com/moat-sandbox/moat/examples/mcp-calc")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build mcp-calc: %v\n%s", err, b)
	}
	return out
}

// toolsPolicy writes a policy whose calc server is the example server,
// logging the calls it receives to logDir (the workload cannot see it).
func toolsPolicy(e *env, calc, logDir string, extraArgs ...string) string {
	return toolsPolicyOn(e, "native", calc, logDir, extraArgs...)
}

// toolsPolicyOn is toolsPolicy for a backend (the server's sandbox is the
// same backend's).
func toolsPolicyOn(e *env, backend, calc, logDir string, extraArgs ...string) string {
	args := []string{calc, "--log", filepath.Join(logDir, "calls.jsonl")}
	args = append(args, extraArgs...)
	b, _ := json.Marshal(args)
	return e.policy(fmt.Sprintf(`backend: %s
tools:
  mcp:
    - name: calc
      command: %s
      env: {LANG: C.UTF-8}
      credential_env: MOAT_E2E_CALC_TOKEN
      tools: [add, env]
      max_calls: 8
      timeout: 10s
      filesystem:
        read_only: [%s]
        read_write: [%s]
`, backend, b, filepath.Dir(calc), logDir))
}

// TestToolsMCP: in one run, a real SDK client inside the sandbox (native,
// and gVisor as root, where the server's sandbox is gVisor's too)
// calls the example server through the broker: the allowed call returns
// its result, the unlisted tool is refused and never reaches the server
// (the server's own log), the server sees its own environment and
// credential but not moat's (a canary), its stderr does not reach the
// workload, a host-file probe from the workload is denied, and the
// journal holds tool.requested before tool.completed and verifies.
func TestToolsMCP(t *testing.T) {
	t.Setenv("MOAT_E2E_CALC_TOKEN", "calc-token-e2e-0123456789abcdef")
	t.Setenv("MOAT_E2E_CANARY", "canary-e2e-fedcba9876543210")
	for _, backend := range ttyBackends(t) { // native, and gVisor as root
		t.Run(backend, func(t *testing.T) { testToolsMCP(t, backend) })
	}
}

func testToolsMCP(t *testing.T, backend string) {
	e := newEnv(t)
	calc := buildMCPCalc(t, e.binDir)
	logDir := e.newWorkspace("mcplog")
	pol := toolsPolicyOn(e, backend, calc, logDir)
	r := e.helper(pol, "mcp=config", "mcp=list", "mcp=add", "mcp=mul", "mcp=env:MOAT_E2E_CANARY", "mcp=env:MOAT_E2E_CALC_TOKEN", "mcp=env:LANG", "read=/etc/shadow")
	if r.code != 0 {
		t.Fatalf("run: %s", r)
	}
	for _, want := range []string{
		"mcp-tools add,env\n", // mul is on the server, not on the allowlist
		"mcp=config ok\n",
		"mcp-result add 5\n",
		"mcp-result env:MOAT_E2E_CANARY MOAT_E2E_CANARY set: false\n",
		"mcp-result env:MOAT_E2E_CALC_TOKEN MOAT_E2E_CALC_TOKEN set: true\n",
		"mcp-result env:LANG LANG set: true\n",
		"read=/etc/shadow err",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, r)
		}
	}
	if !strings.Contains(r.stdout, `mcp=mul err`) || !strings.Contains(r.stdout, `tool "mul" is not allowed`) {
		t.Errorf("mul was not refused with the reason:\n%s", r)
	}
	if strings.Contains(r.stdout+r.stderr, "mcp-calc: serving") {
		t.Errorf("the server's stderr reached the workload or the terminal:\n%s", r)
	}
	// The server's own log: add and the env calls arrived, add with
	// exactly the canonical arguments; mul never did.
	log, err := os.ReadFile(filepath.Join(logDir, "calls.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var calls []string
	sc := bufio.NewScanner(strings.NewReader(string(log)))
	for sc.Scan() {
		var c struct{ Tool, Arguments string }
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			t.Fatalf("server log line %q: %v", sc.Text(), err)
		}
		calls = append(calls, c.Tool+" "+c.Arguments)
	}
	want := []string{`add {"a":2,"b":3}`, `env {"name":"MOAT_E2E_CANARY"}`, `env {"name":"MOAT_E2E_CALC_TOKEN"}`, `env {"name":"LANG"}`}
	if strings.Join(calls, "\n") != strings.Join(want, "\n") {
		t.Errorf("server saw\n%s\nwant\n%s", strings.Join(calls, "\n"), strings.Join(want, "\n"))
	}
	// The journal: verify, then the tool records in order.
	runDir := onlyRunDir(t, e.auditDir)
	if v := e.moat("audit", "verify", filepath.Join(runDir, "journal.jsonl"), "--pubkey", filepath.Join(runDir, "pubkey.pem")); v.code != 0 {
		t.Fatalf("audit verify: %s", v)
	}
	var types []string
	for _, p := range journalPayloads(t, filepath.Join(runDir, "journal.jsonl")) {
		if typ, _ := p["type"].(string); strings.HasPrefix(typ, "tool.") {
			types = append(types, typ+":"+fmt.Sprint(p["tool"]))
		}
	}
	wantTypes := "tool.server_confirmed:<nil> tool.requested:add tool.completed:<nil> tool.refused:mul tool.requested:env tool.completed:<nil> tool.requested:env tool.completed:<nil> tool.requested:env tool.completed:<nil>"
	if got := strings.Join(types, " "); got != wantTypes {
		t.Errorf("journal tool records:\n got %s\nwant %s", got, wantTypes)
	}
	stderrLog, err := os.ReadFile(filepath.Join(runDir, "tools", "calc.stderr"))
	if err != nil || !strings.Contains(string(stderrLog), "mcp-calc: serving on stdio") {
		t.Errorf("the server's stderr is not in the run directory: %v %q", err, stderrLog)
	}
	if show := e.moat("audit", "show", filepath.Join(runDir, "journal.jsonl")); show.code != 0 || !strings.Contains(show.stdout, "tool.requested") {
		t.Errorf("audit show: %s", show)
	}
}

// TestToolsServerSandboxConfirmed: the server's own sandbox is measured
// before the server starts (tool.server_confirmed, ready, in the journal
// after boundary.confirmed and before any call), and a server that tries
// to reach host receivers over TCP and UDP when it starts reaches
// neither, while the host's own deliveries to the same receiver (the
// control) arrive; the server still serves its call.
func TestToolsServerSandboxConfirmed(t *testing.T) {
	recv, err := receiver.Start(receiver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer recv.Close()
	tcpAddr, udpAddr := recv.TCP.Addr().String(), recv.UDP.LocalAddr().String()
	for _, network := range []string{"tcp", "udp"} {
		addr := map[string]string{"tcp": tcpAddr, "udp": udpAddr}[network]
		c, err := net.Dial(network, addr)
		if err != nil {
			t.Fatalf("control: %v", err)
		}
		c.Write([]byte("control\n"))
		c.Close()
	}
	waitFor(t, "the host's control deliveries", 5*time.Second, func() bool { return recv.Count() == 2 })

	e := newEnv(t)
	calc := buildMCPCalc(t, e.binDir)
	logDir := e.newWorkspace("mcplog")
	t.Setenv("MOAT_E2E_CALC_TOKEN", "calc-token-e2e-0123456789abcdef")
	pol := toolsPolicy(e, calc, logDir, "--dial", "tcp:"+tcpAddr, "--dial", "udp:"+udpAddr)
	r := e.helper(pol, "mcp=add")
	if r.code != 0 || !strings.Contains(r.stdout, "mcp-result add 5") {
		t.Fatalf("run: %s", r)
	}
	time.Sleep(200 * time.Millisecond) // a late datagram would have arrived
	if n := recv.Count(); n != 2 {
		t.Errorf("the receiver saw %d arrivals, want only the host's 2: %v", n, recv.Seen())
	}
	runDir := onlyRunDir(t, e.auditDir)
	stderrLog, _ := os.ReadFile(filepath.Join(runDir, "tools", "calc.stderr"))
	t.Logf("the server's stderr:\n%s", stderrLog)
	if !strings.Contains(string(stderrLog), "mcp-calc: dial tcp:"+tcpAddr+": ") || strings.Contains(string(stderrLog), "mcp-calc: dial tcp:"+tcpAddr+": <nil>") {
		t.Errorf("the server's TCP attempt did not fail (or did not run): %q", stderrLog)
	}
	var types []string
	for _, p := range journalPayloads(t, filepath.Join(runDir, "journal.jsonl")) {
		typ, _ := p["type"].(string)
		types = append(types, typ)
		if typ == "tool.server_confirmed" {
			props, _ := p["properties"].(map[string]any)
			if p["ready"] != true || p["server"] != "calc" || props == nil {
				t.Errorf("tool.server_confirmed: %v", p)
			}
		}
	}
	if got := strings.Join(types, " "); !strings.HasPrefix(got, "run.started boundary.confirmed tool.server_confirmed ") || !strings.Contains(got, " tool.requested") {
		t.Errorf("journal order: %s", got)
	}
}

// onlyRunDir returns the one run directory under auditDir.
func onlyRunDir(t *testing.T, auditDir string) string {
	t.Helper()
	ents, err := os.ReadDir(auditDir)
	if err != nil || len(ents) != 1 {
		t.Fatalf("audit dir %s: %v, %d entries", auditDir, err, len(ents))
	}
	return filepath.Join(auditDir, ents[0].Name())
}

// journalPayloads decodes each line's payload (the journal was verified).
func journalPayloads(t *testing.T, path string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		var env struct{ Payload []byte }
		if err := json.Unmarshal([]byte(line), &env); err != nil {
			t.Fatal(err)
		}
		var p map[string]any
		if err := json.Unmarshal(env.Payload, &p); err != nil {
			t.Fatal(err)
		}
		out = append(out, p)
	}
	return out
}

// TestToolsServerReaped: killing moat (SIGKILL, no clean-up of its own)
// ends the tool server and the detached (setsid) child it started,
// observed from the host by their executable.
func TestToolsServerReaped(t *testing.T) {
	e := newEnv(t)
	calc := buildMCPCalc(t, e.binDir)
	logDir := e.newWorkspace("mcplog")
	t.Setenv("MOAT_E2E_CALC_TOKEN", "calc-token-e2e-0123456789abcdef")
	pol := toolsPolicy(e, calc, logDir, "--detach-child")
	never := "wait-file=" + e.workspace + "/never" // each waits 10s
	cmd := e.command("run", "--policy", pol, "--", e.probe, helperArg, "mcp=add", never, never, never, never, never)
	out := &lockedBuilder{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	deadline := time.Now().Add(60 * time.Second)
	for !(len(pidsOf(calc)) == 2 && strings.Contains(out.String(), "mcp-result add 5")) {
		if time.Now().After(deadline) {
			t.Fatalf("the server and its detached child did not appear: pids %v, output:\n%s", pidsOf(calc), out)
		}
		time.Sleep(50 * time.Millisecond)
	}
	pids := pidsOf(calc)
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	waitFor(t, fmt.Sprintf("server processes %v to be gone", pids), 30*time.Second, func() bool { return len(pidsOf(calc)) == 0 })
}

// lockedBuilder is a strings.Builder that moat's output goroutine writes
// while the test reads it.
type lockedBuilder struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuilder) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuilder) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// pidsOf lists host processes whose executable is exe.
func pidsOf(exe string) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if l, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe")); err == nil && l == exe {
			out = append(out, pid)
		}
	}
	return out
}

// TestToolsRunAccounting: the broker's refusals and the tool gateway's
// are one count, capped by inference.max_refusals, and run.terminated
// counts the tool records. With a cap of 1, one refusal (the broker's, of
// an unknown path) leaves the run to complete: the control; that refusal
// and a refused tool are two, past the cap, and end the run as
// refusal_limit (each alone would be within it).
func TestToolsRunAccounting(t *testing.T) {
	t.Setenv("MOAT_E2E_CALC_TOKEN", "calc-token-e2e-0123456789abcdef")
	upload := "raw=" + base64.StdEncoding.EncodeToString([]byte("POST /upload HTTP/1.1\r\nHost: moat\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"))
	for _, tc := range []struct {
		name   string
		calls  []string
		reason string
		tools  map[string]any
	}{
		{"one refusal", []string{"mcp=add", upload}, "completed",
			map[string]any{"requested": 1.0, "completed": 1.0, "refused": 0.0, "failed": 0.0}},
		{"an inference and a tool refusal", []string{"mcp=add", upload, "mcp=mul", "mcp=add"}, "refusal_limit",
			map[string]any{"requested": 1.0, "completed": 1.0, "refused": 1.0, "failed": 0.0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			calc := buildMCPCalc(t, e.binDir)
			logDir := e.newWorkspace("mcplog")
			pol := toolsPolicy(e, calc, logDir)
			b, err := os.ReadFile(pol)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(pol, append(b, "inference:\n  max_refusals: 1\n"...), 0o644); err != nil {
				t.Fatal(err)
			}
			r := e.helper(pol, tc.calls[0], tc.calls[1:]...)
			if (tc.reason == "completed") != (r.code == 0) {
				t.Fatalf("run: %s", r)
			}
			runDir := onlyRunDir(t, e.auditDir)
			if v := e.moat("audit", "verify", filepath.Join(runDir, "journal.jsonl"), "--pubkey", filepath.Join(runDir, "pubkey.pem")); v.code != 0 {
				t.Fatalf("audit verify: %s", v)
			}
			ps := journalPayloads(t, filepath.Join(runDir, "journal.jsonl"))
			last := ps[len(ps)-1]
			if last["type"] != "run.terminated" || last["reason"] != tc.reason {
				t.Fatalf("terminal record %v, want run.terminated %s", last, tc.reason)
			}
			counts, _ := last["counts"].(map[string]any)
			if got := fmt.Sprint(counts["tools"]); got != fmt.Sprint(tc.tools) {
				t.Errorf("counts.tools %s, want %s", got, fmt.Sprint(tc.tools))
			}
		})
	}
}
