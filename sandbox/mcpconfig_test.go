package sandbox

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/policy"
)

// TestMCPConfig: the generated configuration names every server at the
// broker's port, and the workload's variables point at it; the helper
// writes a new file and refuses to follow a symlink or replace a file
// (the control writes where nothing is).
func TestMCPConfig(t *testing.T) {
	pol := policy.Default()
	pol.Tools.MCP = []policy.MCPServer{{Name: "calc"}, {Name: "web-search"}}
	b, err := mcpConfig(4242, pol)
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		MCPServers map[string]struct{ Type, URL string } `json:"mcpServers"`
	}
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	if got := cfg.MCPServers["web-search"]; got.Type != "http" || got.URL != "http://127.0.0.1:4242/mcp/web-search" || len(cfg.MCPServers) != 2 {
		t.Errorf("config: got %s", b)
	}
	env := toolEnv(4242, pol)
	for _, want := range []string{"MOAT_MCP_CALC_URL=http://127.0.0.1:4242/mcp/calc", "MOAT_MCP_WEB_SEARCH_URL=http://127.0.0.1:4242/mcp/web-search", MCPConfigEnv + "=" + MCPConfigPath} {
		if !slices.Contains(env, want) {
			t.Errorf("env %v lacks %s", env, want)
		}
	}
	if env := toolEnv(4242, policy.Default()); len(env) != 0 {
		t.Errorf("no servers: got env %v", env)
	}

	dir := t.TempDir()
	p := filepath.Join(dir, ".moat", "mcp.json")
	if err := writeNew(p, strings.NewReader("{}")); err != nil {
		t.Fatalf("control: %v", err)
	}
	if got, _ := os.ReadFile(p); string(got) != "{}" {
		t.Errorf("control wrote %q", got)
	}
	if err := writeNew(p, strings.NewReader("x")); err == nil {
		t.Error("an existing file was replaced")
	}
	link := filepath.Join(dir, ".moat", "link.json")
	target := filepath.Join(dir, "target")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if err := writeNew(link, strings.NewReader("x")); err == nil {
		t.Error("a symlink was followed")
	}
	if _, err := os.Lstat(target); err == nil {
		t.Error("the symlink's target was created")
	}
}
