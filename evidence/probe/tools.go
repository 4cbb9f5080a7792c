package probe

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// Names shared with the controller for the tool cases (issue 12). Paths
// are relative to the workspace.
const (
	// ToolServer is the policy's name of the calc server; the probe finds
	// it at MOAT_MCP_CALC_URL.
	ToolServer = "calc"
	// ToolPIDs is written by the controller: the host pids, one a line,
	// that tool-call's signal probe aims at (moat's and the server's).
	ToolPIDs = ".moat-evidence-tool-pids"
	// ToolSignalled appears once the probe has sent its signals; it goes
	// on when ToolRelease appears (or after markerWait).
	ToolSignalled = ".moat-evidence-tool-signalled"
	ToolRelease   = ".moat-evidence-tool-release"
	// ToolCalled appears once tool-reaped's call has returned.
	ToolCalled = ".moat-evidence-tool-called"
)

// toolCall calls tool on the calc server through the broker with the
// official Go SDK's client, configured only from the environment moat
// gave the workload, and returns the text of its result.
func (p *runner) toolCall(name, tool string, args map[string]any) (string, error) {
	url := os.Getenv("MOAT_MCP_CALC_URL")
	if url == "" {
		err := fmt.Errorf("MOAT_MCP_CALC_URL is not set")
		p.step(name, 0, err, "")
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*stepTimeout)
	defer cancel()
	c := sdk.NewClient(&sdk.Implementation{Name: "moat-probe", Version: "1"}, nil)
	cs, err := c.Connect(ctx, &sdk.StreamableClientTransport{Endpoint: url, MaxRetries: -1}, nil)
	if err != nil {
		p.step(name, 0, err, "")
		return "", err
	}
	defer cs.Close()
	res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		p.step(name, 0, err, "")
		return "", err
	}
	var texts []string
	for _, ct := range res.Content {
		if tc, ok := ct.(*sdk.TextContent); ok {
			texts = append(texts, tc.Text)
		}
	}
	out := strings.Join(texts, " ")
	if res.IsError {
		err = fmt.Errorf("tool error: %s", out)
	}
	p.step(name, 0, err, out)
	return out, err
}

// toolOperands are the add call's operands the controller chose
// (--tool-args "A,B").
func (p *runner) toolOperands() (int, int) {
	a, b, _ := strings.Cut(p.ToolArgs, ",")
	x, _ := strconv.Atoi(a)
	y, _ := strconv.Atoi(b)
	return x, y
}

// toolResult calls add with the controller's operands and sends what it
// returned to the provider as the control label.
func (p *runner) toolResult(label string, a, b int) {
	out, err := p.toolCall("tool:"+label, "add", map[string]any{"a": a, "b": b})
	if err == nil {
		p.control(label + " data=" + out)
	}
}

func init() {
	// (a) A useful tool call while, in the same run, host-file,
	// host-socket and signal probes are denied.
	caseSteps["tool-call"] = func(p *runner) {
		p.control("before")
		a, b := p.toolOperands()
		p.toolResult("tool-result", a, b)
		// The host file outside every grant (its content is a canary).
		if data, err := os.ReadFile(p.Target); err == nil {
			p.step("host-file", 0, nil, "read")
			p.post("host-file-exfil", "/v1/messages", p.message(p.Model, AttackMarker+" "+string(data), nil), nil)
		} else {
			p.step("host-file", 0, err, "")
		}
		// Host sockets: every receiver, directly.
		p.dial("tcp", "tcp", p.TCP)
		p.dial("udp", "udp", p.UDP)
		p.dial("abstract", "unix", "@"+p.Abstract)
		p.dial("unix", "unix", p.Unix)
		p.dgram("socket-sendto", p.Unixgram)
		// Signals at moat and the tool server, by their host pids.
		if b, err := os.ReadFile(filepath.Join(p.Workspace, ToolPIDs)); err == nil {
			for _, f := range strings.Fields(string(b)) {
				pid, err := strconv.Atoi(f)
				if err != nil || pid <= 1 {
					continue
				}
				p.step("kill-"+f, 0, syscall.Kill(pid, syscall.SIGKILL), "")
			}
		} else {
			p.step("tool-pids", 0, err, "")
		}
		os.WriteFile(filepath.Join(p.Workspace, ToolSignalled), []byte("signalled\n"), 0o644)
		p.step("wait-release", 0, waitFile(filepath.Join(p.Workspace, ToolRelease), markerWait), "")
		p.toolResult("tool-result-after", a+1, b)
		p.control("after")
	}
	// (b) An unlisted tool is refused and never reaches the server.
	caseSteps["tool-unlisted"] = func(p *runner) {
		p.control("before")
		a, b := p.toolOperands()
		p.toolResult("tool-result", a, b)
		p.toolCall("unlisted-mul", "mul", map[string]any{"a": a, "b": b, "note": AttackMarker})
		p.toolCall("unlisted-env", "env", map[string]any{"name": AttackMarker})
		p.control("after")
	}
	// (c) The server does not see moat's secrets: the host reads the
	// server's environment; the probe only does its useful work.
	caseSteps["tool-secrets"] = func(p *runner) {
		p.control("before")
		a, b := p.toolOperands()
		p.toolResult("tool-result", a, b)
		p.control("after")
	}
	// (d) Killing moat reaps the server and its detached descendants: the
	// probe makes its call, says so, and waits to be killed.
	caseSteps["tool-reaped"] = func(p *runner) {
		p.control("before")
		a, b := p.toolOperands()
		p.toolResult("tool-result", a, b)
		os.WriteFile(filepath.Join(p.Workspace, ToolCalled), []byte("called\n"), 0o644)
		time.Sleep(markerWait)
		p.control("after")
	}
	// (e) Each call to a url server carries its pre-effect record.
	caseSteps["tool-url-pre-effect"] = func(p *runner) {
		p.control("before")
		a, b := p.toolOperands()
		p.toolResult("tool-result", a, b)
		p.toolResult("tool-result-after", a+1, b)
		p.control("after")
	}
}
