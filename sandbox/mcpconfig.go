package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/broker/tools"
	"github.com/moat-sandbox/moat/internal/reexec"
	"github.com/moat-sandbox/moat/policy"
)

// The MCP client configuration (MOAT_MCP_CONFIG): a JSON file inside the
// sandbox, in the shape common agents read,
//
//	{"mcpServers":{"calc":{"type":"http","url":"http://127.0.0.1:PORT/mcp/calc"}}}
//
// It is written into the sandbox's private /tmp by moat's own binary run
// as a helper under the workload's full confinement (StartHelper), once
// the tool servers are up and before the workload starts: the file then
// exists only inside, and no host path is granted for it.
const (
	// MCPConfigPath is where the file is, inside the sandbox.
	MCPConfigPath = "/tmp/.moat/mcp.json"
	// MCPConfigHelper writes it: argv[1] the path, the content on stdin.
	MCPConfigHelper = reexec.Prefix + "mcp-config"
	// maxMCPConfigBytes caps what the helper reads.
	maxMCPConfigBytes = 64 << 10
)

// mcpConfig is the file's content for the broker at port.
func mcpConfig(port int, pol *policy.Policy) ([]byte, error) {
	type server struct {
		Type string `json:"type"`
		URL  string `json:"url"`
	}
	servers := map[string]server{}
	for i := range pol.Tools.MCP {
		e := &pol.Tools.MCP[i]
		servers[e.Name] = server{Type: "http", URL: "http://127.0.0.1:" + strconv.Itoa(port) + tools.PathPrefix + e.Name}
	}
	b, err := json.MarshalIndent(map[string]any{"mcpServers": servers}, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// writeMCPConfig runs the helper in sb and waits for it.
func writeMCPConfig(ctx context.Context, sb boundary.Sandbox, port int, pol *policy.Policy) error {
	b, err := mcpConfig(port, pol)
	if err != nil {
		return err
	}
	var out bytes.Buffer
	p, err := sb.StartHelper(ctx, []string{MCPConfigHelper, MCPConfigPath}, boundary.Process{
		Env: []string{"PATH=/nonexistent"}, Dir: "/tmp", Stdin: bytes.NewReader(b), Stdout: &out, Stderr: &out})
	if err != nil {
		return fmt.Errorf("writing %s in the sandbox: %w", MCPConfigPath, err)
	}
	if code, err := p.Wait(); err != nil || code != 0 {
		return fmt.Errorf("writing %s in the sandbox: exit %d %v: %s", MCPConfigPath, code, err, bytes.TrimSpace(out.Bytes()))
	}
	return nil
}

// MCPConfigMain is the helper: it creates the file (and its directory)
// without following symlinks, refusing one that exists.
func MCPConfigMain(args []string) int {
	if len(args) != 1 || !filepath.IsAbs(args[0]) {
		fmt.Fprintln(os.Stderr, "usage: "+MCPConfigHelper+" /absolute/path < content")
		return 2
	}
	if err := writeNew(args[0], io.LimitReader(os.Stdin, maxMCPConfigBytes)); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

func writeNew(path string, r io.Reader) error {
	if err := os.Mkdir(filepath.Dir(path), 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
