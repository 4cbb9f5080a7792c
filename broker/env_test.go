package broker

import (
	"slices"
	"testing"

	"github.com/moat-sandbox/moat/policy"
)

// TestWorkloadEnvAt: a broker outside the sandbox's network is named by
// its host address in every variable; "" keeps the loopback.
func TestWorkloadEnvAt(t *testing.T) {
	pol := &policy.Policy{}
	pol.Inference.Providers = []policy.Provider{{Name: "a", API: "anthropic-messages"}}
	key := NewWorkloadKey()
	for _, tt := range []struct {
		host, key string
		want      []string
	}{
		{"", "", []string{"ANTHROPIC_BASE_URL=http://127.0.0.1:9", "ANTHROPIC_API_KEY=" + Placeholder, "MOAT_BROKER_URL=http://127.0.0.1:9"}},
		{"10.244.0.1", "", []string{"ANTHROPIC_BASE_URL=http://10.244.0.1:9", "ANTHROPIC_API_KEY=" + Placeholder, "MOAT_BROKER_URL=http://10.244.0.1:9"}},
		{"fd00::1", "", []string{"ANTHROPIC_BASE_URL=http://[fd00::1]:9", "ANTHROPIC_API_KEY=" + Placeholder, "MOAT_BROKER_URL=http://[fd00::1]:9"}},
		{"10.244.0.1", key, []string{"ANTHROPIC_BASE_URL=http://10.244.0.1:9", "ANTHROPIC_API_KEY=" + key, "MOAT_BROKER_URL=http://10.244.0.1:9"}},
	} {
		if got := WorkloadEnvAt(tt.host, 9, tt.key, pol); !slices.Equal(got, tt.want) {
			t.Errorf("WorkloadEnvAt(%q, %q) = %v, want %v", tt.host, tt.key, got, tt.want)
		}
	}
	if got, want := WorkloadEnv(9, pol), WorkloadEnvAt("", 9, "", pol); !slices.Equal(got, want) {
		t.Errorf("WorkloadEnv = %v, want WorkloadEnvAt(\"\") = %v", got, want)
	}
}
