package broker

import (
	"net/http"
	"regexp"
	"slices"
	"strings"

	"github.com/moat-sandbox/moat/broker/wire"
)

// Header policy, as data.
//
// The signed pre-effect record covers the request body (body_sha256), not
// its headers. So no header whose value the worker chooses freely reaches
// the provider: that would be a channel outside the evidence. A worker
// header is forwarded only when it is listed below AND its value passes the
// listed check; every other worker header is dropped. The broker then sets
// its own Content-Type, Accept-Encoding, User-Agent, the credential and
// Moat-Pre-Effect.

// Placeholder is the API key the workload holds (WorkloadEnv). The SDKs
// send it; the broker drops it and adds the real credential.
const Placeholder = "moat-placeholder"

// forwardedHeaders: worker header → check of its value, per API family.
var forwardedHeaders = map[string]map[string]func(string) bool{
	wire.APIAnthropicMessages: {
		// Selects the API version; a date, nothing else.
		"anthropic-version": regexp.MustCompile(`^[0-9]{4}-[0-9]{2}-[0-9]{2}$`).MatchString,
		// Betas are checked by betaAllowed (refused, not dropped, when
		// unknown, so the agent learns why its feature is missing).
		"anthropic-beta": func(string) bool { return true },
	},
	// openai-beta (assistants=v2: server-held state), openai-organization
	// and openai-project (billing selectors that belong to the operator's
	// credential) are deliberately absent.
	wire.APIOpenAIChat:      {},
	wire.APIOpenAIResponses: {},
}

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
	ReasonCredentialHeader = "credential_header" // a credential that is not the placeholder
	ReasonMoatHeader       = "moat_header"       // a Moat-* header from the worker
	ReasonBetaNotAllowed   = "beta_not_allowed"  // an anthropic-beta value not in allowedBetas
	ReasonBadHeaderValue   = "header_value"      // a forwarded header with a value that fails its check
	ReasonContentType      = "content_type"      // a body that does not claim to be JSON
)

// checkHeaders applies the header policy to a request bound for api and
// returns the worker headers to forward.
func checkHeaders(api string, r *request) (http.Header, *frontError) {
	out := http.Header{}
	allowed := forwardedHeaders[api]
	for _, f := range r.header {
		switch {
		case strings.HasPrefix(f.name, "moat-"):
			return nil, refuse(ReasonMoatHeader, 400, "header %q is reserved for moat and may not be sent by the client", f.name)
		case slices.Contains(credentialHeaders, f.name):
			v := strings.TrimSpace(strings.TrimPrefix(f.value, "Bearer "))
			if v != Placeholder {
				return nil, refuse(ReasonCredentialHeader, 403, "header %q must hold the placeholder %q: moat adds the real credential itself; do not send keys of your own", f.name, Placeholder)
			}
		case f.name == "content-type":
			mt := strings.ToLower(strings.TrimSpace(strings.Split(f.value, ";")[0]))
			if mt != "application/json" {
				return nil, refuse(ReasonContentType, 415, "Content-Type must be application/json, got %q", clip(f.value))
			}
		case f.name == "anthropic-beta" && api == wire.APIAnthropicMessages:
			for _, b := range strings.Split(f.value, ",") {
				b = strings.TrimSpace(b)
				if !slices.Contains(allowedBetas, b) {
					return nil, refuse(ReasonBetaNotAllowed, 400, "anthropic-beta %q is not allowed (allowed: %s); betas that enable server-side tools, files or context management are refused", clip(b), strings.Join(allowedBetas, ", "))
				}
			}
			out.Set(f.name, f.value)
		default:
			if check, ok := allowed[f.name]; ok {
				if !check(f.value) {
					return nil, refuse(ReasonBadHeaderValue, 400, "header %q has a malformed value %q", f.name, clip(f.value))
				}
				out.Set(f.name, f.value)
			}
		}
	}
	return out, nil
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
