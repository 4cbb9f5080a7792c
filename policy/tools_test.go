package policy

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestToolsEffective: defaults fill an entry, the printed policy carries
// it and loads back to the same, and the server's own policy holds only
// its grants and environment.
func TestToolsEffective(t *testing.T) {
	f := newFixture(t)
	p, pe := f.parse(t, `version: 1
filesystem: {read_write: [./workspace]}
tools:
  mcp:
    - name: my-calc
      command: [./data/calc]
      env: {LANG: C}
      tools: [add]
      filesystem: {read_only: [./data]}
    - name: web
      url: http://127.0.0.1:9/mcp
      tools: ["*"]
`)
	if pe != nil {
		t.Fatal(pe)
	}
	s := p.Tools.MCP[0]
	if s.MaxCalls != DefaultMaxToolCalls || s.MaxArgumentBytes != DefaultMaxArgumentBytes || s.Timeout != Duration(30*time.Second) {
		t.Errorf("defaults: got %+v", s)
	}
	if got, want := s.EnvName(), "MOAT_MCP_MY_CALC_URL"; got != want {
		t.Errorf("EnvName: got %s, want %s", got, want)
	}
	if !s.AllowsTool("add") || s.AllowsTool("mul") {
		t.Errorf("AllowsTool: add allowed %v (want true), mul allowed %v (want false)", s.AllowsTool("add"), s.AllowsTool("mul"))
	}
	if !p.Tools.MCP[1].AllowsTool("anything") || p.Tools.MCP[1].Filesystem != nil || p.Tools.MCP[1].Env != nil {
		t.Errorf("url server: got %+v", p.Tools.MCP[1])
	}
	y, err := p.YAML()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(y), "timeout: 30s") || !strings.Contains(string(y), "max_argument_bytes: 64Ki") {
		t.Errorf("printed policy lacks the effective entry:\n%s", y)
	}
	q, err := Parse(y, "")
	if err != nil {
		t.Fatalf("printed policy does not load: %v\n%s", err, y)
	}
	if !reflect.DeepEqual(p.Tools, q.Tools) {
		t.Errorf("round trip: got %+v, want %+v", q.Tools, p.Tools)
	}
	j, err := p.JSON()
	if err != nil || !strings.Contains(string(j), `"timeout": "30s"`) {
		t.Errorf("JSON: %v\n%s", err, j)
	}
	sp := p.ServerPolicy(&s)
	if !reflect.DeepEqual(sp.Filesystem.ReadOnly, []string{f.data}) || len(sp.Filesystem.ReadWrite) != 0 ||
		!reflect.DeepEqual(sp.Process.Env, map[string]string{"LANG": "C"}) || len(sp.Inference.Providers) != 0 || sp.Process.Workdir != "/tmp" {
		t.Errorf("server policy: got fs %+v env %v workdir %s", sp.Filesystem, sp.Process.Env, sp.Process.Workdir)
	}
	if p.ServerPolicy(&p.Tools.MCP[1]) != nil {
		t.Error("a url server got a sandbox policy")
	}
	// A policy without tools keeps its identity: no "tools" member.
	np, pe := f.parse(t, "version: 1\n")
	if pe != nil {
		t.Fatal(pe)
	}
	if b, _ := np.JSON(); strings.Contains(string(b), `"tools"`) {
		t.Errorf("a policy without tools prints a tools member:\n%s", b)
	}
}
