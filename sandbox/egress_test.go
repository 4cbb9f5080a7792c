package sandbox

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/policy"
)

func TestEgressEnv(t *testing.T) {
	pol := &policy.Policy{Process: policy.Process{Env: map[string]string{"PATH": "/bin"}}}
	if env := egressEnv(0, pol); len(env) != 0 {
		t.Errorf("no egress port, no NO_PROXY in the policy: %v", env)
	}
	env := egressEnv(4242, pol)
	want := []string{"HTTPS_PROXY=http://127.0.0.1:4242", "https_proxy=http://127.0.0.1:4242", "npm_config_https_proxy=http://127.0.0.1:4242",
		"PIP_PROXY=http://127.0.0.1:4242", "NO_PROXY=127.0.0.1,localhost,::1", "no_proxy=127.0.0.1,localhost,::1"}
	if !slices.Equal(env, want) {
		t.Errorf("egressEnv = %v\nwant %v", env, want)
	}
	for _, kv := range env {
		if strings.HasPrefix(strings.ToUpper(kv), "HTTP_PROXY=") {
			t.Errorf("HTTP_PROXY set: %s (plain-http egress is not served)", kv)
		}
	}
	// The policy's own NO_PROXY is kept and completed, with or without
	// an egress port; the workload's variables win over the policy's.
	pol.Process.Env["NO_PROXY"] = "internal.example, localhost"
	if env := egressEnv(0, pol); !slices.Equal(env, []string{"NO_PROXY=internal.example,localhost,127.0.0.1,::1"}) {
		t.Errorf("policy NO_PROXY: %v", env)
	}
	pol.Process.Env["HTTPS_PROXY"] = "http://evil.example:3128"
	got := workloadEnv(pol, egressEnv(4242, pol))
	if !slices.Contains(got, "HTTPS_PROXY=http://127.0.0.1:4242") || !slices.Contains(got, "no_proxy=127.0.0.1,localhost,::1") {
		t.Errorf("workload env %v", got)
	}
}

func TestExplainEgress(t *testing.T) {
	var b bytes.Buffer
	explainEgress(&b, &policy.Policy{})
	if b.Len() != 0 {
		t.Errorf("without egress: %q", b.String())
	}
	pol := &policy.Policy{Egress: policy.Egress{Hosts: []policy.EgressHost{{Host: "pypi.org", Port: 443, MaxConnections: 64, MaxBytes: 1 << 30}}, MaxTunnels: 256}}
	explainEgress(&b, pol)
	if got := b.String(); !strings.HasPrefix(got, "  egress.hosts pypi.org:443: TLS tunnels") || strings.Count(got, "\n") != 2 {
		t.Errorf("explain: %q", got)
	}
}
