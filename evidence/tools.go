package evidence

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/moat-sandbox/moat/evidence/probe"
	"github.com/moat-sandbox/moat/internal/mcpcalc"
)

// The controller's side of the tool cases (issue 12). A command case's
// server is the calc server of the moat binary under test (its hidden
// helper __moat-demo-calc), from a copy of the binary in the case's
// scratch that nothing else runs, so that the host finds the server's
// processes by their executable. Its policy entry grants it that copy
// and a log directory, gives it LANG and the synthetic tool credential,
// and lists one tool, add. The url case's server is ToolServer, on the
// host's 127.0.0.1.

// toolRun is a tool case's live state.
type toolRun struct {
	calc    string // the server's executable (command cases)
	logDir  string
	args    string // the add operands, "A,B"
	env     []string
	url     *ToolServer
	moatPID int
	ready   []ProcRecord
}

// setupTool prepares a tool case before moat starts.
func (r *caseRun) setupTool() error {
	if r.c.Tool == "" {
		return nil
	}
	t := &toolRun{}
	a, b := smallRand(), smallRand()
	t.args = fmt.Sprintf("%d,%d", a, b)
	cred, canary := r.s.creds[credTool], "MOAT-TOOL-CANARY-"+randHex(12)
	t.env = []string{ToolCredEnv + "=" + cred, ToolCanaryEnv + "=" + canary}
	r.host.Values = map[string]string{
		ValueToolArgs:   fmt.Sprintf(`{"a":%d,"b":%d}`, a, b),
		ValueToolSum:    strconv.Itoa(a + b),
		ValueToolEnvSHA: "LANG=" + sha256Hex([]byte(toolServerLang)) + "," + ToolCredEnv + "=" + sha256Hex([]byte(cred)),
		ValueSecretsSHA: ToolCanaryEnv + "=" + sha256Hex([]byte(canary)) + "," + CredEnvAnthropic + "=" + sha256Hex([]byte(r.s.creds["anthropic"])) +
			"," + CredEnvOpenAI + "=" + sha256Hex([]byte(r.s.creds["openai"])),
	}
	if r.c.Name == "tool-call" {
		// A host file outside every grant, its content a canary.
		outside := filepath.Join(r.sdir, "outside")
		if err := os.Mkdir(outside, 0o755); err != nil {
			return err
		}
		hc := "MOAT-HOST-CANARY-" + randHex(12)
		r.target = filepath.Join(outside, "secret")
		if err := os.WriteFile(r.target, []byte(hc+"\n"), 0o644); err != nil {
			return err
		}
		r.host.Values[ValueCanary] = hc
	}
	r.tool = t
	if r.c.Tool == ToolURL {
		t.url = &ToolServer{OpenSSL: r.s.openssl}
		return t.url.Start(filepath.Join(r.dir, FileToolEvents), r.sdir)
	}
	bin := filepath.Join(r.sdir, "toolbin")
	t.logDir = filepath.Join(r.sdir, "toollog")
	for _, d := range []string{bin, t.logDir} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return err
		}
	}
	if os.Geteuid() == 0 {
		// The server runs as the workload's identity.
		if err := os.Chown(t.logDir, workloadUID, workloadUID); err != nil {
			return err
		}
	}
	t.calc = filepath.Join(bin, "calc")
	return copyFile(r.s.Binary, t.calc, 0o755)
}

// smallRand is a random operand in [100, 99999].
func smallRand() int {
	var b [4]byte
	rand.Read(b[:])
	return 100 + int(binary.BigEndian.Uint32(b[:])%99900)
}

// toolReapWait bounds the wait for the tool server processes to be gone
// once moat was killed.
const toolReapWait = 30 * time.Second

// credTool is the key of the synthetic tool credential in suite.creds.
const credTool = "tool"

// toolPolicy is the case policy's tools section.
func (r *caseRun) toolPolicy(ro []string) string {
	t := r.tool
	if t == nil {
		return ""
	}
	if t.url != nil {
		return fmt.Sprintf(`tools:
  mcp:
    - name: %s
      url: %s
      credential_env: %s
      tools: [%s]
      max_calls: 8
      timeout: 20s
`, probe.ToolServer, t.url.URL(), ToolCredEnv, toolAllowed)
	}
	argv := []string{t.calc, mcpcalc.Helper, "--log", filepath.Join(t.logDir, "calls.jsonl")}
	if r.c.Tool == ToolDetach {
		argv = append(argv, "--detach-child")
	}
	ab, _ := json.Marshal(argv)
	rob, _ := json.Marshal(append(slices.Clone(ro), filepath.Dir(t.calc)))
	return fmt.Sprintf(`tools:
  mcp:
    - name: %s
      command: %s
      env: {LANG: %s}
      credential_env: %s
      tools: [%s]
      max_calls: 8
      timeout: 20s
      filesystem:
        read_only: %s
        read_write: [%s]
`, probe.ToolServer, ab, toolServerLang, ToolCredEnv, toolAllowed, rob, t.logDir)
}

// toolReady runs at Ready, before the probe is let go: the host's view of
// moat and the server, the server's environment, the pids the signal
// probe aims at, and the url server's pinned key.
func (r *caseRun) toolReady(ri runInfo) error {
	t := r.tool
	if t == nil {
		return nil
	}
	if t.url != nil {
		pub, err := parsePublicKeyPEM([]byte(ri.PublicKeyPEM))
		if err != nil {
			return err
		}
		return t.url.Pin(ri.RunID, pub)
	}
	t.ready = r.toolProcs(procWhenReady, nil)
	if r.c.Name == "tool-secrets" {
		for _, p := range t.ready {
			if p.Role != "server" {
				continue
			}
			env, err := procEnvSHA(p.PID)
			if err != nil {
				r.host.Missing = append(r.host.Missing, fmt.Sprintf("the server's environment (pid %d): %v", p.PID, err))
			} else {
				r.host.ToolEnv = env
			}
			break
		}
	}
	if r.c.Name == "tool-call" {
		r.host.ToolProcs = append(r.host.ToolProcs, t.ready...)
		var pids []string
		for _, p := range t.ready {
			pids = append(pids, strconv.Itoa(p.PID))
		}
		return os.WriteFile(filepath.Join(r.workspace, probe.ToolPIDs), []byte(strings.Join(pids, "\n")+"\n"), 0o644)
	}
	return nil
}

// toolProcs records moat and every process running the server's
// executable. prev, when given, fixes the pids and start times: each is
// recorded again, alive only with the same start time.
func (r *caseRun) toolProcs(when string, prev []ProcRecord) []ProcRecord {
	var out []ProcRecord
	if prev != nil {
		for _, p := range prev {
			q := p
			q.When, q.Alive = when, processAlive(p.PID) && procStart(p.PID) == p.Start
			out = append(out, q)
		}
		return out
	}
	rec := func(role string, pid int) {
		st := procStart(pid)
		out = append(out, ProcRecord{When: when, Role: role, PID: pid, Start: st, SID: procSID(pid), Alive: st != "" && processAlive(pid)})
	}
	rec("moat", r.tool.moatPID)
	for _, pid := range pidsOfExe(r.tool.calc) {
		rec("server", pid)
	}
	return out
}

// toolDuring runs while moat runs, after the probe was let go.
func (r *caseRun) toolDuring(exited <-chan struct{}, moat *os.Process) {
	t := r.tool
	switch r.c.Name {
	case "tool-call":
		if !r.waitWorkspaceFile(probe.ToolSignalled, exited) {
			return
		}
		r.host.ToolProcs = append(r.host.ToolProcs, r.toolProcs(procWhenSignaled, t.ready)...)
		if err := os.WriteFile(filepath.Join(r.workspace, probe.ToolRelease), []byte("release\n"), 0o644); err != nil {
			r.host.Notes = append(r.host.Notes, "tool release marker: "+err.Error())
		}
	case "tool-reaped":
		if !r.waitWorkspaceFile(probe.ToolCalled, exited) {
			return
		}
		// The detached child may still be starting.
		var ps []ProcRecord
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			ps = r.toolProcs(procWhenBefore, nil)
			if len(ps) >= 3 || time.Now().After(deadline) {
				break
			}
		}
		r.host.ToolProcs = append(r.host.ToolProcs, ps...)
		if err := moat.Signal(syscall.SIGKILL); err != nil {
			r.host.Notes = append(r.host.Notes, "SIGKILL moat: "+err.Error())
		}
	}
}

// finishTool runs once moat has exited: the reap's observation and the
// server's log.
func (r *caseRun) finishTool() {
	t := r.tool
	if t == nil {
		return
	}
	if r.c.KillMoat {
		before := r.host.procs(procWhenBefore)
		if len(before) > 0 {
			var after []ProcRecord
			for deadline := time.Now().Add(toolReapWait); ; time.Sleep(20 * time.Millisecond) {
				after = r.toolProcs(procWhenAfter, before)
				if !slices.ContainsFunc(after, func(p ProcRecord) bool { return p.Alive }) || time.Now().After(deadline) {
					break
				}
			}
			r.host.ToolProcs = append(r.host.ToolProcs, after...)
		}
	}
	if t.logDir != "" {
		b, err := os.ReadFile(filepath.Join(t.logDir, "calls.jsonl"))
		if err != nil {
			if !os.IsNotExist(err) {
				r.host.Missing = append(r.host.Missing, "the server's log: "+err.Error())
			}
			b = nil // no call reached the server: an empty log
		}
		if err := os.WriteFile(filepath.Join(r.dir, FileToolLog), r.s.redact(b), 0o644); err != nil {
			r.host.Missing = append(r.host.Missing, "the server's log: "+err.Error())
		}
	}
}

// waitWorkspaceFile waits for the probe's marker file, or moat's exit.
func (r *caseRun) waitWorkspaceFile(name string, exited <-chan struct{}) bool {
	deadline := time.Now().Add(runInfoWait)
	for {
		if _, err := os.Stat(filepath.Join(r.workspace, name)); err == nil {
			return true
		}
		select {
		case <-exited:
			return false
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			r.host.Notes = append(r.host.Notes, "the probe never wrote "+name)
			return false
		}
	}
}

// ToolServer is the url tool case's MCP server (streamable HTTP, the
// official Go SDK's) on the host's 127.0.0.1, with one tool, add. Before
// passing a tools/call on, it verifies the Moat-Pre-Effect header against
// the pinned run key natively and with openssl (the provider's check),
// that the record is the run's tool.requested for this tool, and that
// its arguments digest is that of the params.arguments bytes received,
// and persists a ToolEvent. A tools/call that fails is answered with 500.
type ToolServer struct {
	OpenSSL string

	prov  *Provider // its pinned key, openssl and scratch
	mu    sync.Mutex
	n     int
	log   *eventLog
	ln    net.Listener
	srv   *http.Server
	inner http.Handler
}

// Start listens on 127.0.0.1:0 and persists events to eventsPath.
func (t *ToolServer) Start(eventsPath, scratch string) error {
	l, err := openEventLog(eventsPath)
	if err != nil {
		return fmt.Errorf("tool server events: %w", err)
	}
	tmp, err := os.MkdirTemp(scratch, "openssl-tool-")
	if err != nil {
		l.close()
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		l.close()
		return fmt.Errorf("tool server listen: %w", err)
	}
	s := sdk.NewServer(&sdk.Implementation{Name: "moat-evidence-calc", Version: "1"}, nil)
	sdk.AddTool(s, &sdk.Tool{Name: toolAllowed, Description: "Add two numbers."}, func(_ context.Context, _ *sdk.CallToolRequest, in struct {
		A float64 `json:"a"`
		B float64 `json:"b"`
	}) (*sdk.CallToolResult, any, error) {
		return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: fmt.Sprint(in.A + in.B)}}}, nil, nil
	})
	t.inner = sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return s }, nil)
	t.prov = &Provider{OpenSSL: t.OpenSSL, tmp: tmp}
	t.log, t.ln = l, ln
	t.srv = &http.Server{Handler: t, ReadHeaderTimeout: 10 * time.Second}
	go t.srv.Serve(ln)
	return nil
}

// URL is the server's MCP endpoint.
func (t *ToolServer) URL() string { return "http://" + t.ln.Addr().String() + "/mcp" }

// Pin sets the run key.
func (t *ToolServer) Pin(runID string, pub ed25519.PublicKey) error { return t.prov.Pin(runID, pub) }

// Close stops the server and closes its event log.
func (t *ToolServer) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	t.srv.Shutdown(ctx)
	os.RemoveAll(t.prov.tmp)
	return t.log.close()
}

func (t *ToolServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		t.inner.ServeHTTP(w, r)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxProviderBody+1))
	if err != nil || len(body) > MaxProviderBody {
		http.Error(w, "body unreadable or too large", http.StatusBadRequest)
		return
	}
	var msg struct {
		Method string `json:"method"`
		Params struct {
			Name      string          `json:"name"`
			Arguments json.RawMessage `json:"arguments"`
		} `json:"params"`
	}
	json.Unmarshal(body, &msg)
	if msg.Method != "tools/call" {
		r.Body = io.NopCloser(bytes.NewReader(body))
		t.inner.ServeHTTP(w, r)
		return
	}
	t.mu.Lock()
	t.n++
	n := t.n
	t.mu.Unlock()
	p := t.prov
	p.mu.Lock()
	pub, runID, pubPath := p.pub, p.runID, p.pubPath
	p.mu.Unlock()
	hdr := r.Header.Values("Moat-Pre-Effect")
	ev := ToolEvent{N: n, Time: time.Now().UTC().Format(time.RFC3339Nano), Method: msg.Method, Tool: msg.Params.Name,
		Arguments: string(msg.Params.Arguments), PreEffectCount: len(hdr)}
	switch {
	case pub == nil:
		ev.Detail = errNoKey.Error()
	case len(hdr) != 1:
		ev.Detail = fmt.Sprintf("%d Moat-Pre-Effect headers, want 1", len(hdr))
	default:
		raw, err := base64.StdEncoding.Strict().DecodeString(hdr[0])
		if err != nil {
			ev.Detail = "Moat-Pre-Effect is not base64: " + err.Error()
			break
		}
		ev.PreEffect = string(raw)
		if err := checkToolPreEffectLine(raw, ev.Tool, msg.Params.Arguments, runID, pub); err != nil {
			ev.Detail = err.Error()
			break
		}
		ev.NativeVerified = true
		if t.OpenSSL == "" {
			ev.Detail = "openssl not available"
			break
		}
		if err := p.opensslVerify(raw, pubPath); err != nil {
			ev.Detail = err.Error()
			break
		}
		ev.OpenSSLVerified = true
	}
	if err := t.log.append(ev); err != nil {
		http.Error(w, "tool server could not persist its event", http.StatusInternalServerError)
		return
	}
	if !ev.NativeVerified || !ev.OpenSSLVerified {
		http.Error(w, "evidence tool server: pre-effect record not verified: "+ev.Detail, http.StatusInternalServerError)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	t.inner.ServeHTTP(w, r)
}

// checkToolPreEffectLine verifies a tool call's pre-effect line natively:
// signature, record type, run, tool, and the arguments digest and length
// against the bytes received.
func checkToolPreEffectLine(line []byte, tool string, args []byte, runID string, pub ed25519.PublicKey) error {
	if pub == nil {
		return errNoKey
	}
	payload, _, _, err := verifyEnvelope(line, auditPayloadType, pub)
	if err != nil {
		return err
	}
	var rec struct {
		Run             string `json:"run"`
		Type            string `json:"type"`
		Tool            string `json:"tool"`
		ArgumentsSHA256 string `json:"arguments_sha256"`
		ArgumentsBytes  int64  `json:"arguments_bytes"`
	}
	if err := json.Unmarshal(payload, &rec); err != nil {
		return fmt.Errorf("pre-effect payload: %w", err)
	}
	switch {
	case rec.Type != "tool.requested":
		return fmt.Errorf("pre-effect record type %q, want tool.requested", rec.Type)
	case runID != "" && rec.Run != runID:
		return fmt.Errorf("pre-effect record of run %q, want %q", rec.Run, runID)
	case rec.Tool != tool:
		return fmt.Errorf("pre-effect record for tool %q, the call is to %q", rec.Tool, tool)
	case rec.ArgumentsSHA256 != sha256Hex(args) || rec.ArgumentsBytes != int64(len(args)):
		return fmt.Errorf("arguments_sha256 %s (%d bytes) does not match the %d bytes received (%s)", rec.ArgumentsSHA256, rec.ArgumentsBytes, len(args), sha256Hex(args))
	}
	return nil
}
