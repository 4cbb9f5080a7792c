package policy

import (
	"strings"
	"testing"
	"time"
)

// TestApprovals: a valid section decodes, with its default timeout and
// its matches; each mistake is reported at its key path, beside a valid
// control.
func TestApprovals(t *testing.T) {
	f := newFixture(t)
	p, pe := f.parse(t, `version: 1
approvals:
  rules:
    - {road: inference, provider: anthropic, max_tokens_over: 1000}
    - {road: tool, server: calc, tool: add, argument_bytes_over: 10}
    - {road: service, service: github}
`)
	if pe != nil {
		t.Fatal(pe)
	}
	a := &p.Approvals
	if a.Wait() != 5*time.Minute || len(a.Rules) != 3 {
		t.Fatalf("got %+v", a)
	}
	for _, c := range []struct {
		got, want bool
		what      string
	}{
		{a.MatchInference("anthropic", "m", 1001), true, "over the threshold"},
		{a.MatchInference("anthropic", "m", 1000), false, "at the threshold"},
		{a.MatchInference("openai", "m", 5000), false, "other provider"},
		{a.MatchTool("calc", "add", 11), true, "tool over"},
		{a.MatchTool("calc", "mul", 11), false, "other tool"},
		{a.MatchTool("calc", "add", 10), false, "tool at"},
		{a.MatchService("github", 0), true, "service"},
		{a.MatchService("gitlab", 100), false, "other service"},
	} {
		if c.got != c.want {
			t.Errorf("%s: got %v, want %v", c.what, c.got, c.want)
		}
	}
	if p, pe := f.parse(t, "version: 1\n"); pe != nil || p.Approvals.Wait() != 5*time.Minute || p.Approvals.MatchInference("a", "b", 1<<20) {
		t.Errorf("no section: %v %+v", pe, p)
	}
	if p, pe := f.parse(t, "version: 1\napprovals: {timeout: 30s}\n"); pe != nil || p.Approvals.Wait() != 30*time.Second {
		t.Errorf("timeout 30s: %v", pe)
	}
	for _, c := range []struct{ y, want string }{
		{"approvals: {timeout: 5}", "approvals.timeout: want a string"},
		{"approvals: {timeout: 0s}", "approvals.timeout: 0s is out of range"},
		{"approvals: {timeout: soon}", `approvals.timeout: "soon" is not a duration`},
		{"approvals: {rules: [{road: inference, tool: x}]}", "approvals.rules[0].tool: tool does not apply to road inference"},
		{"approvals: {rules: [{road: bus}]}", `approvals.rules[0].road: unknown road "bus"`},
		{"approvals: {rules: [{model: m}]}", "approvals.rules[0].road: missing"},
		{"approvals: {rules: [{road: tool, color: red}]}", `approvals.rules[0].color: unknown key "color"`},
		{"approvals: {rules: [{road: inference, max_tokens_over: -1}]}", "approvals.rules[0].max_tokens_over: negative limit"},
		{"approvals: {rules: [{road: inference, model: ''}]}", "approvals.rules[0].model: empty name"},
		{"approvals: {rules: [{road: inference}, {road: tool, provider: p}]}", "approvals.rules[1].provider: provider does not apply to road tool"},
		{"approvals: {wait: 5m}", `approvals.wait: unknown key "wait"`},
	} {
		_, pe := f.parse(t, "version: 1\n"+c.y+"\n")
		if pe == nil || !strings.Contains(pe.Error(), c.want) {
			t.Errorf("%s: got %v, want %q", c.y, pe, c.want)
		}
	}
}
