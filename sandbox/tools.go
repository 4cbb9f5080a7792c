package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/boundary/measure"
	"github.com/moat-sandbox/moat/broker"
	"github.com/moat-sandbox/moat/broker/tools"
	"github.com/moat-sandbox/moat/internal/reaper"
	"github.com/moat-sandbox/moat/policy"
)

// Tool servers (issue 12). A command server runs outside the workload's
// sandbox, in a sandbox of its own that the same backend builds from the
// entry (policy.ServerPolicy: its grants only, its env plus its
// credential, no network, the workload's identity and limits), started
// by moat with its stdio on pipes to moat. Its stderr goes to
// tools/<name>.stderr in the run directory (capped), never to the
// workload. Each server's sandbox is Terminated when the session closes;
// when moat is killed, the backend's own lifetime rules (the init dies
// with the supervisor, a PID namespace empties with its init) and the
// reaper end it and every descendant, as for the workload's sandbox.
const (
	// toolConnectTimeout bounds a server's start and initialize.
	toolConnectTimeout = 60 * time.Second
	// maxToolStderr caps what a server's stderr may write to the run
	// directory; the rest is dropped.
	maxToolStderr = 1 << 20
	// MCPConfigEnv names the variable holding the path of the generated
	// MCP client configuration inside the sandbox.
	MCPConfigEnv = "MOAT_MCP_CONFIG"
)

// toolServers are the run's tool servers.
type toolServers struct {
	mu        sync.Mutex
	sessions  []*tools.Session
	sandboxes []boundary.Sandbox
	files     []*os.File
}

// startToolServers connects every tools.mcp entry: command servers in
// their own sandboxes, url servers over streamable HTTP. On error what
// was started is stopped.
func startToolServers(ctx context.Context, be boundary.Backend, pol *policy.Policy, runID, stateDir, runDir string, rp *reaper.Reaper, log *slog.Logger, journal func(audit.Record) error) (*toolServers, map[string]tools.Upstream, error) {
	ts := &toolServers{}
	ups := map[string]tools.Upstream{}
	for i := range pol.Tools.MCP {
		e := &pol.Tools.MCP[i]
		cred := ""
		if e.CredentialEnv != "" {
			cred = os.Getenv(e.CredentialEnv)
			if cred == "" {
				ts.stop()
				return nil, nil, &RefusedError{Msg: fmt.Sprintf("tool server %q needs its credential in %s, which is not set in moat's environment; set it, or remove credential_env from tools.mcp", e.Name, e.CredentialEnv)}
			}
		}
		cctx, cancel := context.WithTimeout(ctx, toolConnectTimeout)
		var t sdk.Transport
		var err error
		if e.URL != "" {
			// A remote url through the run's egress guard (a hooks
			// binary's test-global address and resolver included);
			// a loopback one directly (URLTransport's default dial
			// connects to loopback addresses only).
			var o tools.URLOptions
			if !policy.IsLoopbackURL(e.URL) {
				o.Dial = tunnelGuard().DialContext
			}
			t = tools.URLTransport(e.URL, cred, o)
		} else {
			t, err = ts.startCommand(cctx, be, pol, e, cred, runID, stateDir, runDir, rp, journal)
		}
		var s *tools.Session
		if err == nil {
			s, err = tools.Connect(cctx, e.Name, t)
		}
		cancel()
		if err != nil {
			ts.stop()
			return nil, nil, &RefusedError{Msg: fmt.Sprintf("tool server %q could not be started: %v", e.Name, err)}
		}
		ts.mu.Lock()
		ts.sessions = append(ts.sessions, s)
		ts.mu.Unlock()
		ups[e.Name] = s
		log.Debug("moat.tools server ready", "server", e.Name)
	}
	return ts, ups, nil
}

// startCommand prepares the server's sandbox, confirms it by measurement
// (confirmServer) and starts its command with stdin and stdout on pipes
// to moat.
func (ts *toolServers) startCommand(ctx context.Context, be boundary.Backend, pol *policy.Policy, e *policy.MCPServer, cred, runID, stateDir, runDir string, rp *reaper.Reaper, journal func(audit.Record) error) (sdk.Transport, error) {
	spol := pol.ServerPolicy(e)
	if spol == nil {
		return nil, errors.New("BUG: a command server without a sandbox policy")
	}
	dir := filepath.Join(stateDir, "mcp-"+e.Name)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, err
	}
	sb, err := be.Prepare(ctx, boundary.Spec{RunID: runID + "-mcp-" + e.Name, Policy: spol, StateDir: dir, Reaper: rp})
	if err != nil {
		return nil, fmt.Errorf("backend %s could not prepare its sandbox: %w", be.Name(), err)
	}
	ts.mu.Lock()
	ts.sandboxes = append(ts.sandboxes, sb)
	ts.mu.Unlock()
	if err := confirmServer(ctx, sb, e.Name, spol, dir, rp, journal); err != nil {
		return nil, err
	}
	env := serverEnv(spol.Process.Env, e.CredentialEnv, cred)
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return nil, err
	}
	errLog, err := toolStderr(runDir, e.Name)
	if err != nil {
		for _, f := range []*os.File{inR, inW, outR, outW} {
			f.Close()
		}
		return nil, err
	}
	ts.mu.Lock()
	ts.files = append(ts.files, inW, outR)
	ts.mu.Unlock()
	_, err = sb.Start(ctx, boundary.Process{Argv: e.Command, Env: env, Dir: spol.Process.Workdir,
		Stdin: inR, Stdout: outW, Stderr: errLog, Last: true})
	inR.Close()
	outW.Close()
	if err != nil {
		return nil, fmt.Errorf("starting %q: %w", e.Command[0], err)
	}
	return &sdk.IOTransport{Reader: outR, Writer: inW}, nil
}

// confirmServer measures a command server's sandbox from inside, as the
// workload's is measured (boundary/measure: its network, its filesystem
// against its own grants and the host's secrets, its process
// confinement), and journals tool.server_confirmed before the server
// starts. A sandbox that is not Ready (e.g. it reaches a network beyond
// its loopback, or a file outside its grants) is journaled not ready and
// the run is refused: the server never starts.
func confirmServer(ctx context.Context, sb boundary.Sandbox, name string, spol *policy.Policy, stateDir string, rp *reaper.Reaper, journal func(audit.Record) error) error {
	li, err := sb.Listener()
	if err != nil {
		return fmt.Errorf("its sandbox gave no loopback listener to measure with: %w", err)
	}
	secrets, err := hostSecrets(stateDir, spol)
	if err != nil {
		return err
	}
	props, rep, err := measure.Confirm(ctx, sb, measure.Config{
		BrokerPort: li.Port, ReadWrite: spol.Filesystem.ReadWrite, ReadOnly: spol.Filesystem.ReadOnly,
		HostSecrets: secrets, Reaper: rp,
	})
	if err == nil {
		err = boundary.Ready(props, boundary.Requirements{})
	}
	rec := audit.ToolServerConfirmed{Server: name, Ready: err == nil, Properties: props, Checks: checksOf(rep)}
	if err != nil {
		rec.Reason = err.Error()
	}
	if jerr := journal(rec); jerr != nil {
		return fmt.Errorf("journal: %w", jerr)
	}
	if err != nil {
		return fmt.Errorf("its sandbox is not Ready, so it was not started: %w", err)
	}
	return nil
}

// serverEnv is the server's whole environment: its policy env and its
// credential, sorted.
func serverEnv(m map[string]string, credEnv, cred string) []string {
	env := make([]string, 0, len(m)+1)
	for k, v := range m {
		env = append(env, k+"="+v)
	}
	if credEnv != "" {
		env = append(env, credEnv+"="+cred)
	}
	sort.Strings(env)
	return env
}

// toolStderr opens tools/<name>.stderr in the run directory, capped.
func toolStderr(runDir, name string) (io.Writer, error) {
	dir := filepath.Join(runDir, "tools")
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(dir, name+".stderr"), os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, err
	}
	return &cappedWriter{f: f, left: maxToolStderr}, nil
}

// cappedWriter writes at most left bytes to f and drops the rest, always
// reporting success so that the server is never blocked or failed by it.
type cappedWriter struct {
	mu   sync.Mutex
	f    *os.File
	left int
}

func (c *cappedWriter) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n := min(len(p), c.left); n > 0 {
		c.f.Write(p[:n])
		c.left -= n
	}
	return len(p), nil
}

// stop ends every session and terminates every server sandbox (which
// kills the server and all its descendants). Idempotent.
func (ts *toolServers) stop() {
	if ts == nil {
		return
	}
	ts.mu.Lock()
	sessions, sandboxes, files := ts.sessions, ts.sandboxes, ts.files
	ts.sessions, ts.sandboxes, ts.files = nil, nil, nil
	ts.mu.Unlock()
	for _, sb := range sandboxes {
		sb.Terminate()
	}
	for _, s := range sessions {
		s.Close()
	}
	for _, f := range files {
		f.Close()
	}
}

// toolEnv is the workload's tool variables: MOAT_MCP_<NAME>_URL for
// each server, at the broker's loopback port, and MOAT_MCP_CONFIG.
func toolEnv(port int, pol *policy.Policy) []string {
	var env []string
	for i := range pol.Tools.MCP {
		e := &pol.Tools.MCP[i]
		env = append(env, e.EnvName()+"=http://127.0.0.1:"+strconv.Itoa(port)+tools.PathPrefix+e.Name)
	}
	if len(env) > 0 {
		env = append(env, MCPConfigEnv+"="+MCPConfigPath)
	}
	return env
}

// openTools starts the policy's tool servers and returns the gateway the
// broker serves at /mcp/<name>, and what stops the servers: nil (no
// gateway, /mcp/ refused like any unknown path) when the policy names
// none. Their credentials, with the providers', feed the reflection guard
// of tool results.
func (s *Session) openTools(ctx context.Context, be boundary.Backend, providerCreds map[string]string) (http.Handler, *toolServers, error) {
	if len(s.pol.Tools.MCP) == 0 {
		return nil, nil, nil
	}
	journal := func(r audit.Record) error { _, err := s.w.Append(r); return err }
	ts, ups, err := startToolServers(ctx, be, s.pol, s.RunID, s.stateDir, filepath.Dir(s.w.JournalPath()), s.reaper, s.log, journal)
	if err != nil {
		return nil, nil, err
	}
	if err := writeMCPConfig(ctx, s.sb, s.BrokerPort, s.pol); err != nil {
		ts.stop()
		return nil, nil, &RefusedError{Msg: err.Error()}
	}
	h, err := tools.New(tools.Config{Policy: s.pol, Journal: s.w, Servers: ups,
		Reflects: broker.NewReflectionGuard(toolCredentials(s.pol, providerCreds)),
		Attribute: func(r *http.Request) audit.Attribution {
			if a, ok := broker.AttributionFrom(r.Context()); ok {
				return a
			}
			return audit.Attribution{Status: boundary.AttributionUnavailable, Reason: "no attribution from the broker"}
		},
		OnFatal: func(reason string, err error) {
			select {
			case s.fatal <- Fatal{Reason: reason, Msg: err.Error()}:
			default:
			}
		},
		Log: s.log})
	if err != nil {
		ts.stop()
		return nil, nil, err
	}
	return h, ts, nil
}

// toolCredentials lists every credential moat holds for the run: the
// providers' and the tool servers'.
func toolCredentials(pol *policy.Policy, providerCreds map[string]string) []string {
	var out []string
	for _, c := range providerCreds {
		out = append(out, c)
	}
	for _, e := range pol.Tools.MCP {
		if e.CredentialEnv != "" {
			out = append(out, os.Getenv(e.CredentialEnv))
		}
	}
	return out
}
