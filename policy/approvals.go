package policy

import (
	"fmt"
	"slices"
	"time"

	"go.yaml.in/yaml/v3"
)

// Approvals holds requests for a human decision before they leave
// (approvals: in the policy). A request matching any rule is held by the
// broker until an operator approves or denies it (moat approvals), or
// until Timeout passes, when it is refused (fail closed).
type Approvals struct {
	// Timeout is how long a held request waits for a decision. Default 5m.
	Timeout Duration `yaml:"timeout" json:"timeout"`
	// Rules: a request needs approval when any rule matches it.
	Rules []ApprovalRule `yaml:"rules" json:"rules"`
}

// ApprovalRule matches requests of one road. Every field set must match
// (an empty name matches any; a zero threshold is no threshold).
type ApprovalRule struct {
	// Road is "inference", "tool" or "service".
	Road string `yaml:"road" json:"road"`
	// Provider (inference), Server (tool) or Service (service) names
	// where the request goes; "" matches any.
	Provider string `yaml:"provider,omitempty" json:"provider,omitempty"`
	Server   string `yaml:"server,omitempty" json:"server,omitempty"`
	Service  string `yaml:"service,omitempty" json:"service,omitempty"`
	// Model (inference) or Tool (tool) names; "" matches any.
	Model string `yaml:"model,omitempty" json:"model,omitempty"`
	Tool  string `yaml:"tool,omitempty" json:"tool,omitempty"`
	// MaxTokensOver matches an inference request whose max_tokens is
	// greater than it; 0: any.
	MaxTokensOver int `yaml:"max_tokens_over,omitempty" json:"max_tokens_over,omitempty"`
	// ArgumentBytesOver matches a tool call whose arguments, or a service
	// request whose body, is longer than it; 0: any.
	ArgumentBytesOver int `yaml:"argument_bytes_over,omitempty" json:"argument_bytes_over,omitempty"`
}

// Roads of approval rules.
const (
	RoadInference = "inference"
	RoadTool      = "tool"
	RoadService   = "service"
)

// Approval limits.
const (
	DefaultApprovalTimeout = Duration(5 * time.Minute)
	MinApprovalTimeout     = Duration(time.Second)
	MaxApprovalTimeout     = Duration(24 * time.Hour)
	MaxApprovalRules       = 64
)

var (
	approvalsKeys    = []string{"timeout", "rules"}
	approvalRuleKeys = []string{"road", "provider", "server", "service", "model", "tool", "max_tokens_over", "argument_bytes_over"}
)

// Wait is how long a held request waits: Timeout, or the default when
// the policy has no approvals section.
func (a *Approvals) Wait() time.Duration {
	if a.Timeout <= 0 {
		return time.Duration(DefaultApprovalTimeout)
	}
	return time.Duration(a.Timeout)
}

// MatchInference reports whether an inference request to provider for
// model with max_tokens needs approval.
func (a *Approvals) MatchInference(provider, model string, maxTokens int) bool {
	for _, r := range a.Rules {
		if r.Road == RoadInference && (r.Provider == "" || r.Provider == provider) && (r.Model == "" || r.Model == model) &&
			(r.MaxTokensOver == 0 || maxTokens > r.MaxTokensOver) {
			return true
		}
	}
	return false
}

// MatchTool reports whether a call of tool on server with argBytes bytes
// of arguments needs approval.
func (a *Approvals) MatchTool(server, tool string, argBytes int) bool {
	for _, r := range a.Rules {
		if r.Road == RoadTool && (r.Server == "" || r.Server == server) && (r.Tool == "" || r.Tool == tool) &&
			(r.ArgumentBytesOver == 0 || argBytes > r.ArgumentBytesOver) {
			return true
		}
	}
	return false
}

// MatchService reports whether a request to service with a body of
// bodyBytes needs approval.
func (a *Approvals) MatchService(service string, bodyBytes int) bool {
	for _, r := range a.Rules {
		if r.Road == RoadService && (r.Service == "" || r.Service == service) && (r.ArgumentBytesOver == 0 || bodyBytes > r.ArgumentBytesOver) {
			return true
		}
	}
	return false
}

func (d *decoder) approvals(n *yaml.Node, a *Approvals) {
	a.Timeout = DefaultApprovalTimeout
	f := d.mapping(n, "approvals", approvalsKeys...)
	if n := f["timeout"]; n != nil {
		if s, ok := d.str(n, "approvals.timeout"); ok {
			v, err := time.ParseDuration(s)
			switch x := Duration(v); {
			case err != nil:
				d.add(n, CodeBadValue, "approvals.timeout", "%q is not a duration: write one such as 30s or 5m", s)
			case x < MinApprovalTimeout || x > MaxApprovalTimeout:
				d.add(n, CodeBadValue, "approvals.timeout", "%s is out of range [%s, %s]", x, MinApprovalTimeout, MaxApprovalTimeout)
			default:
				a.Timeout = x
			}
		}
	}
	if n := f["rules"]; n != nil {
		for i, item := range d.seq(n, "approvals.rules", MaxApprovalRules) {
			if r, ok := d.approvalRule(item, fmt.Sprintf("approvals.rules[%d]", i)); ok {
				a.Rules = append(a.Rules, r)
			}
		}
	}
}

func (d *decoder) approvalRule(n *yaml.Node, ip string) (ApprovalRule, bool) {
	var r ApprovalRule
	nprobs := len(d.probs)
	f := d.mapping(n, ip, approvalRuleKeys...)
	if n.Kind != yaml.MappingNode {
		return r, false
	}
	names := map[string]*string{"provider": &r.Provider, "server": &r.Server, "service": &r.Service, "model": &r.Model, "tool": &r.Tool}
	for _, k := range []string{"provider", "server", "service", "model", "tool"} {
		if v := f[k]; v != nil {
			if s, ok := d.str(v, join(ip, k)); ok {
				if s == "" {
					d.add(v, CodeBadValue, join(ip, k), "empty name; leave the key out to match any")
				}
				*names[k] = s
			}
		}
	}
	if v := f["max_tokens_over"]; v != nil {
		r.MaxTokensOver, _ = d.limit(v, join(ip, "max_tokens_over"), 0, 1<<30)
	}
	if v := f["argument_bytes_over"]; v != nil {
		r.ArgumentBytesOver, _ = d.limit(v, join(ip, "argument_bytes_over"), 0, 1<<30)
	}
	// Which keys each road takes.
	allowed := map[string][]string{
		RoadInference: {"provider", "model", "max_tokens_over"},
		RoadTool:      {"server", "tool", "argument_bytes_over"},
		RoadService:   {"service", "argument_bytes_over"},
	}
	v := f["road"]
	if v == nil {
		d.add(n, CodeMissing, join(ip, "road"), "missing; write road: inference, tool or service")
		return r, false
	}
	s, ok := d.str(v, join(ip, "road"))
	if !ok {
		return r, false
	}
	keys, known := allowed[s]
	if !known {
		d.add(v, CodeBadValue, join(ip, "road"), "unknown road %q (known: inference, tool, service)", s)
		return r, false
	}
	r.Road = s
	for _, k := range approvalRuleKeys[1:] {
		if f[k] != nil && !slices.Contains(keys, k) {
			d.add(f[k], CodeBadValue, join(ip, k), "%s does not apply to road %s (it takes %v)", k, s, keys)
		}
	}
	return r, len(d.probs) == nprobs
}
