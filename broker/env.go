package broker

import (
	"net"
	"strconv"
	"strings"

	"github.com/moat-sandbox/moat/policy"
)

// BrokerURLEnv names the variable that always tells the workload where the
// broker listens (http://127.0.0.1:port), whatever providers the policy has.
const BrokerURLEnv = "MOAT_BROKER_URL"

// WorkloadEnv is the environment that points unmodified SDKs at the broker
// listening on 127.0.0.1:port inside the sandbox. Each provider family's
// variables are set only when the policy has a provider of that family:
// ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY for an anthropic-* API,
// OPENAI_BASE_URL and OPENAI_API_KEY for an openai-* API. A family
// without a provider gets none, so that neither an SDK nor an agent that
// probes its environment takes that API for configured. MOAT_BROKER_URL
// is always set. A nil policy has no providers.
//
// The Anthropic SDKs append /v1/messages to ANTHROPIC_BASE_URL; the OpenAI
// SDKs append /chat/completions or /responses to OPENAI_BASE_URL, which
// therefore ends in /v1. The keys are placeholders (Placeholder): the real
// credentials never enter the sandbox.
func WorkloadEnv(port int, pol *policy.Policy) []string {
	return WorkloadEnvAt("", port, "", pol)
}

// WorkloadEnvAt is WorkloadEnv for a broker that the workload reaches at
// host:port ("" is 127.0.0.1) and that requires key ("" is Placeholder,
// Config.WorkloadKey): a backend whose broker listens outside the
// sandbox's network (boundary.ListenerInfo.Host, the Kubernetes backend's
// host address) points the same variables there, and the SDK keys are the
// sandbox's own key (NewWorkloadKey), which the broker requires.
func WorkloadEnvAt(host string, port int, key string, pol *policy.Policy) []string {
	if host == "" {
		host = "127.0.0.1"
	}
	if key == "" {
		key = Placeholder
	}
	base := "http://" + net.JoinHostPort(host, strconv.Itoa(port))
	var anthropic, openai bool
	if pol != nil {
		for _, p := range pol.Inference.Providers {
			anthropic = anthropic || strings.HasPrefix(p.API, "anthropic-")
			openai = openai || strings.HasPrefix(p.API, "openai-")
		}
	}
	var env []string
	if anthropic {
		env = append(env, "ANTHROPIC_BASE_URL="+base, "ANTHROPIC_API_KEY="+key)
	}
	if openai {
		env = append(env, "OPENAI_BASE_URL="+base+"/v1", "OPENAI_API_KEY="+key)
	}
	return append(env, BrokerURLEnv+"="+base)
}

// CheckCredential applies to cred the rule that New applies to a
// provider's credential (printable ASCII without spaces, MinCredentialBytes
// to MaxCredentialBytes long), so that a run can refuse a bad one before
// it starts instead of failing at New or at request time.
func CheckCredential(provider, cred string) error { return checkCredential(provider, cred) }
