// Package wire decides which inference requests the broker forwards. For
// each provider API (anthropic-messages, openai-chat, openai-responses) it
// holds a field allowlist at every level of the request body, written as
// commented data from the providers' public API references and the
// official SDKs' request types, and a few rules that the allowlist alone
// cannot express.
//
// Admit parses the body with internal/strictjson (duplicate names, invalid
// UTF-8, lone surrogates and trailing data refused), re-encodes it
// canonically (RFC 8785), and checks the canonical form, so what is checked
// is byte for byte what is hashed, signed and forwarded. The check walks
// those bytes without building a decoded tree (raw.go); a tree-based
// oracle in the tests holds it to the same answers.
//
// Refused, each with a stable Code and a message that tells a model what to
// change:
//   - unknown fields and unknown content/tool/item types (unknown_field,
//     unknown_type), wrong JSON types and values (invalid_value), missing
//     required fields (missing_field), bodies that are not strict JSON
//     (invalid_json), paths the API does not admit (wrong_endpoint);
//   - models not in Limits.Models (model_not_allowed);
//   - output tokens above Limits.MaxOutputTokens (max_tokens_exceeded);
//   - content the provider would fetch from a URL (url_source) or from its
//     own file store (file_reference), also nested in tool results;
//   - provider-hosted tools and the content blocks and items they produce
//     (server_tool), remote MCP servers (mcp_server);
//   - server-side compaction (server_compaction) and context management
//     (context_management);
//   - server-held state moat cannot see (server_state): stored responses,
//     conversations, stored prompts, background mode, item references,
//     containers, provider-held audio.
//
// Decisions made here:
//   - Reserved output tokens. When the request names no output limit, the
//     broker writes Limits.MaxOutputTokens into the canonical body
//     (anthropic-messages: max_tokens; openai-chat: max_completion_tokens;
//     openai-responses: max_output_tokens), so that the provider can never
//     generate more than policy allows, even where absence means
//     "unlimited". A null limit counts as absent. openai-chat requests that
//     set both max_tokens and max_completion_tokens are refused as
//     ambiguous, and n must be 1 (n copies would multiply the output).
//     count_tokens requests reserve 0 output tokens.
//   - store. openai-responses stores responses by default; the broker writes
//     "store": false when the request does not say, and refuses
//     "store": true. openai-chat refuses "store": true (absence means false).
//   - Nulls. A null optional field is accepted as absent, as the providers
//     treat it; a null required field is refused. A field refused by name
//     (mcp_servers, container, previous_response_id, …) is refused even
//     as null. "stream": null is normalised: the member is removed from the
//     canonical body, so the provider and the broker both read it as a
//     non-streaming request.
//   - Numbers are canonical RFC 8785 numbers (see strictjson); output limits
//     must be integers in that form.
//   - Only these endpoints are admitted; message batches, files, stored
//     responses and every other path are refused (wrong_endpoint).
//
// What this package does not see: HTTP headers. Features that a provider
// enables by header alone (e.g. Anthropic's anthropic-beta) are the
// broker's header allowlist to decide.
//
// Why a hand-written schema language (schema.go) rather than a JSON Schema
// validator: it is about 350 lines, adds no dependency, denies by default
// (JSON Schema's additionalProperties defaults to allow), and gives every
// refusal a stable code and the JSON path of the offending value, which a
// model needs in order to fix its request.
package wire

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/moat-sandbox/moat/internal/strictjson"
)

// The provider APIs this package admits requests for.
const (
	APIAnthropicMessages = "anthropic-messages"
	APIOpenAIChat        = "openai-chat"
	APIOpenAIResponses   = "openai-responses"
)

// Limits are the policy limits a request is checked against. The zero
// value admits nothing.
type Limits struct {
	Models          []string // allowed model names, compared exactly
	MaxOutputTokens int      // per-request output token ceiling; <= 0 admits nothing
}

// Request is an admitted request.
type Request struct {
	Canonical []byte // RFC 8785 bytes: what the broker hashes, signs and forwards
	Model     string
	MaxTokens int // reserved output tokens, as written in Canonical (0 for count_tokens)
	Stream    bool
}

// Reason is the stable code of a refusal: the reason of the journal's
// inference.refused and inference.failed records, the Moat-Reason header
// and the API error's code. The broker's own codes (framing, headers,
// upstream) have this type too, so one type names every decision.
type Reason string

// The codes of this package (see the package doc). ReasonInternal is a
// bug in moat: it is never reported under a code that blames the client.
const (
	ReasonInvalidJSON       Reason = "invalid_json"
	ReasonInvalidValue      Reason = "invalid_value"
	ReasonMissingField      Reason = "missing_field"
	ReasonUnknownField      Reason = "unknown_field"
	ReasonUnknownType       Reason = "unknown_type"
	ReasonWrongEndpoint     Reason = "wrong_endpoint"
	ReasonModelNotAllowed   Reason = "model_not_allowed"
	ReasonMaxTokensExceeded Reason = "max_tokens_exceeded"
	ReasonURLSource         Reason = "url_source"
	ReasonFileReference     Reason = "file_reference"
	ReasonServerTool        Reason = "server_tool"
	ReasonMCPServer         Reason = "mcp_server"
	ReasonServerCompaction  Reason = "server_compaction"
	ReasonContextManagement Reason = "context_management"
	ReasonServerState       Reason = "server_state"
	ReasonInternal          Reason = "internal_error"
)

// Refusal says why a request was not admitted.
type Refusal struct {
	Code Reason // stable reason code
	// Message is actionable by a human and a model: it says what to
	// change. It carries no "moat: refused:" prefix; the broker adds that
	// once, where the message leaves moat (Error adds it too).
	Message string
}

func (r *Refusal) Error() string { return "moat: refused: " + r.Message }

// endpoint is one admitted POST path of an API.
type endpoint struct {
	schema *node
	// tokenFields are the output-limit fields, in order of preference;
	// none means the endpoint generates no output (count_tokens).
	tokenFields []string
	// forceFalse are boolean fields written as false when absent or null.
	forceFalse []string
}

type apiSpec struct {
	endpoints map[string]*endpoint
}

// apis is built on first use: the trees are some 900 allocations, which
// every moat process (the CLI, each re-executed helper, each sandbox's
// init and stage) would otherwise pay in its start-up, admitting a body
// or not.
var apis = sync.OnceValue(func() map[string]*apiSpec {
	anthropicMessages, anthropicCountTokens := anthropicSchemas()
	return map[string]*apiSpec{
		APIAnthropicMessages: {endpoints: map[string]*endpoint{
			"/v1/messages":              {schema: anthropicMessages, tokenFields: []string{"max_tokens"}},
			"/v1/messages/count_tokens": {schema: anthropicCountTokens},
		}},
		APIOpenAIChat: {endpoints: map[string]*endpoint{
			"/v1/chat/completions": {schema: openaiChatSchema(), tokenFields: []string{"max_completion_tokens", "max_tokens"}},
		}},
		APIOpenAIResponses: {endpoints: map[string]*endpoint{
			"/v1/responses": {schema: openaiResponsesSchema(), tokenFields: []string{"max_output_tokens"}, forceFalse: []string{"store"}},
		}},
	}
})

// Endpoints returns the POST paths that api admits, sorted; nil for an
// unknown API.
func Endpoints(api string) []string {
	spec, ok := apis()[api]
	if !ok {
		return nil
	}
	var eps []string
	for p := range spec.endpoints {
		eps = append(eps, p)
	}
	slices.Sort(eps)
	return eps
}

// Admit checks body, sent by POST to endpoint (a path, without query) of
// api, against the API's allowlist and lim. It returns the request to
// forward, or a refusal.
func Admit(api, endpointPath string, body []byte, lim Limits) (*Request, *Refusal) {
	spec, ok := apis()[api]
	if !ok {
		return nil, refuse(ReasonWrongEndpoint, "", "API %q is not supported (supported: %s, %s, %s)", api, APIAnthropicMessages, APIOpenAIChat, APIOpenAIResponses)
	}
	ep, ok := spec.endpoints[endpointPath]
	if !ok {
		return nil, refuse(ReasonWrongEndpoint, "", "POST %s is not an endpoint moat forwards for %s (allowed: %s)", quotePath(endpointPath), api, strings.Join(Endpoints(api), ", "))
	}
	canon, err := strictjson.Canonicalize(body)
	if err != nil {
		return nil, invalidJSON(err)
	}
	return admitCanonical(ep, canon, lim)
}

func invalidJSON(err error) *Refusal {
	why := err.Error()
	var se *strictjson.Error
	if errors.As(err, &se) {
		why = strings.TrimPrefix(strings.TrimPrefix(why, "strictjson: "), "jsontext: ")
	}
	return refuse(ReasonInvalidJSON, "", "the request body is not strict JSON (%s); send one JSON object with unique member names and valid UTF-8", Bound(why))
}

// quotePath quotes a client-supplied path for a message, bounded.
func quotePath(p string) string { return Quote(p) }

// MaxQuotedBytes caps how many bytes of one client-supplied value a
// refusal quotes. A longer value is quoted as its first MaxQuotedBytes
// (cut on a UTF-8 boundary) followed by its length and sha256, so that a
// refusal, its journal record and its log line stay small whatever the
// client sent, and the value can still be matched against what the
// client kept.
const MaxQuotedBytes = 256

// Quote quotes a client-supplied value for a refusal message: %q of the
// whole value when it is at most MaxQuotedBytes long, else %q of a prefix,
// "…", and "(N bytes, sha256 HEX)" of the whole value.
func Quote(s string) string {
	if len(s) <= MaxQuotedBytes {
		return strconv.Quote(s)
	}
	return strconv.Quote(prefix(s, MaxQuotedBytes)) + "…" + digest(s)
}

// Bound shortens a text that embeds client-supplied bytes (a parser's
// error, say) in the same way as Quote, without quoting it: a text of at
// most MaxQuotedBytes is returned as valid UTF-8, a longer one as a prefix,
// "…", and its length and sha256.
func Bound(s string) string { return BoundTo(s, MaxQuotedBytes) }

// BoundTo is Bound with a limit of n bytes instead of MaxQuotedBytes.
func BoundTo(s string, n int) string {
	if len(s) <= n {
		return strings.ToValidUTF8(s, "\uFFFD")
	}
	return strings.ToValidUTF8(prefix(s, n), "\uFFFD") + "…" + digest(s)
}

// prefix is s cut to at most n bytes, not inside a UTF-8 sequence.
func prefix(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > n-utf8.UTFMax && cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

func digest(s string) string {
	sum := sha256.Sum256([]byte(s))
	return " (" + strconv.Itoa(len(s)) + " bytes, sha256 " + hex.EncodeToString(sum[:]) + ")"
}
