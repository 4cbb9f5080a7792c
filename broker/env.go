package broker

import (
	"strconv"

	"github.com/moat-sandbox/moat/policy"
)

// WorkloadEnv is the environment that points unmodified SDKs at the broker
// listening on 127.0.0.1:port inside the sandbox. Both families are always
// set, whatever the policy configures: an SDK for an API without a provider
// then reaches the broker and gets a refusal that names the problem,
// instead of trying the real provider and failing with no route.
//
// The Anthropic SDKs append /v1/messages to ANTHROPIC_BASE_URL; the OpenAI
// SDKs append /chat/completions or /responses to OPENAI_BASE_URL, which
// therefore ends in /v1. The keys are placeholders (Placeholder): the real
// credentials never enter the sandbox.
func WorkloadEnv(port int, pol *policy.Policy) []string {
	_ = pol // routing is by endpoint and model; the variables do not depend on the policy
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	return []string{
		"ANTHROPIC_BASE_URL=" + base,
		"ANTHROPIC_API_KEY=" + Placeholder,
		"OPENAI_BASE_URL=" + base + "/v1",
		"OPENAI_API_KEY=" + Placeholder,
	}
}
