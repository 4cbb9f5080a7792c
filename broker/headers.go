package broker

import (
	"slices"
	"strings"

	"github.com/moat-sandbox/moat/broker/wire"
)

// Header policy, as data.
//
// The signed pre-effect record covers the request body (body_sha256) and
// every worker header that is forwarded (headers: name → value). No header
// whose value the worker chooses freely reaches the provider: that would be
// a channel outside the evidence. A worker header is forwarded only when it
// is listed below, and then only in its canonical form, which its check
// computes: a value with another spelling of the same meaning (whitespace,
// order, case, repetition) is either rewritten to the canonical form or
// refused, so the bytes the provider gets carry nothing the record does not
// show. Every other worker header is dropped. The broker then sets its own
// Content-Type, Accept, Accept-Encoding, User-Agent, the credential and
// Moat-Pre-Effect.

// Placeholder is the API key the workload holds (WorkloadEnv). The SDKs
// send it; the broker drops it and adds the real credential.
const Placeholder = "moat-placeholder"

// canonicalizer turns a header value into the one form that is forwarded,
// or refuses it.
type canonicalizer func(name, value string) (string, *frontError)

// forwardedHeaders: worker header → its canonical form, per API family.
var forwardedHeaders = map[string]map[string]canonicalizer{
	wire.APIAnthropicMessages: {
		// Selects the API version: one of anthropicVersions, exactly.
		"anthropic-version": canonicalVersion,
		// Betas from allowedBetas (refused, not dropped, when unknown, so
		// the agent learns why its feature is missing).
		"anthropic-beta": canonicalBetas,
	},
	// openai-beta (assistants=v2: server-held state), openai-organization
	// and openai-project (billing selectors that belong to the operator's
	// credential) are deliberately absent.
	wire.APIOpenAIChat:      {},
	wire.APIOpenAIResponses: {},
}

// anthropicVersions are the anthropic-version values the broker forwards:
// the versions Anthropic has published. Older SDKs send 2023-06-01; the
// official Go SDK v2.15 (this module's test client) sends 2026-10-21.
var anthropicVersions = []string{"2026-10-21", "2023-06-01", "2023-01-01"}

// allowedBetas are the anthropic-beta values the broker forwards. Each
// changes only how the model answers, never what the provider does on its
// own: no server tools (code execution, web fetch/search, MCP connector),
// no server-held state (files API, skills containers), no server-side
// context management or compaction. Those betas are refused; their
// request fields are also refused by broker/wire.
var allowedBetas = []string{
	"interleaved-thinking-2025-05-14",        // thinking between tool calls
	"fine-grained-tool-streaming-2025-05-14", // tool input streamed in smaller deltas
	"token-efficient-tools-2025-02-19",       // shorter tool-use encoding
	"output-128k-2025-02-19",                 // longer outputs; max_tokens stays capped by policy
	"prompt-caching-2024-07-31",              // cache_control blocks (GA, harmless)
	"context-1m-2025-08-07",                  // larger context window
}

// credentialHeaders carry a client credential. The worker may send only
// the placeholder (as the SDKs do); anything else is refused, so a worker
// never believes it is using a key of its own.
var credentialHeaders = []string{"authorization", "x-api-key", "api-key"}

// Refusal reasons of the header stage.
const (
	ReasonCredentialHeader Reason = "credential_header" // a credential that is not the placeholder
	ReasonMoatHeader       Reason = "moat_header"       // a Moat-* header from the worker
	ReasonBetaNotAllowed   Reason = "beta_not_allowed"  // an anthropic-beta value not in allowedBetas
	ReasonBadHeaderValue   Reason = "header_value"      // a forwarded header with a value that fails its check
	ReasonContentType      Reason = "content_type"      // a body that does not claim to be JSON
)

// checkHeaders applies the header policy to a request bound for api and
// returns the worker headers to forward, each in its canonical form: the
// lower-case name and the value sent, which the pre-effect record carries.
func checkHeaders(api string, r *request) (map[string]string, *frontError) {
	out := map[string]string{}
	allowed := forwardedHeaders[api]
	for _, f := range r.header {
		switch {
		case strings.HasPrefix(f.name, "moat-"):
			return nil, refuse(ReasonMoatHeader, 400, "header %s is reserved for moat and may not be sent by the client", quote(f.name))
		case slices.Contains(credentialHeaders, f.name):
			v := strings.TrimSpace(strings.TrimPrefix(f.value, "Bearer "))
			if v != Placeholder {
				return nil, refuse(ReasonCredentialHeader, 403, "header %q must hold the placeholder %q: moat adds the real credential itself; do not send keys of your own", f.name, Placeholder)
			}
		case f.name == "content-type":
			mt := strings.ToLower(strings.TrimSpace(strings.Split(f.value, ";")[0]))
			if mt != "application/json" {
				return nil, refuse(ReasonContentType, 415, "Content-Type must be application/json, got %s", quote(f.value))
			}
		default:
			if canon, ok := allowed[f.name]; ok {
				v, fe := canon(f.name, f.value)
				if fe != nil {
					return nil, fe
				}
				out[f.name] = v
			}
		}
	}
	return out, nil
}

// canonicalVersion accepts exactly one of anthropicVersions.
func canonicalVersion(name, v string) (string, *frontError) {
	if !slices.Contains(anthropicVersions, v) {
		return "", refuse(ReasonBadHeaderValue, 400, "header %s: version %s is not one moat forwards (allowed: %s)", name, quote(v), strings.Join(anthropicVersions, ", "))
	}
	return v, nil
}

// canonicalBetas accepts a comma-separated list of allowed betas, with
// optional spaces or tabs around each comma as RFC 9110 lists allow, each
// beta at most once, and forwards them joined by "," alone, in the order
// of allowedBetas: neither spacing nor order reaches the provider.
func canonicalBetas(name, v string) (string, *frontError) {
	var got []string
	for _, b := range strings.Split(v, ",") {
		b = strings.Trim(b, " \t")
		switch {
		case b == "":
			return "", refuse(ReasonBadHeaderValue, 400, "header %s holds an empty list element; send the betas separated by single commas", name)
		case !slices.Contains(allowedBetas, b):
			return "", refuse(ReasonBetaNotAllowed, 400, "anthropic-beta %s is not allowed (allowed: %s); betas that enable server-side tools, files or context management are refused", quote(b), strings.Join(allowedBetas, ", "))
		case slices.Contains(got, b):
			return "", refuse(ReasonBadHeaderValue, 400, "header %s names beta %s twice; send it once", name, quote(b))
		}
		got = append(got, b)
	}
	var canon []string
	for _, b := range allowedBetas {
		if slices.Contains(got, b) {
			canon = append(canon, b)
		}
	}
	return strings.Join(canon, ","), nil
}

// Response headers passed back to the worker (after the reflection scan).
// Everything else the provider sends is dropped.
var returnedHeaders = []string{
	"content-type",
	"request-id",   // Anthropic's request id
	"x-request-id", // OpenAI's request id
	"retry-after",
	"x-should-retry",
}
