package broker

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"net/http"
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

// Workload keys. A broker listener on the sandbox's own loopback can be
// reached only by the sandbox, and its workload holds Placeholder. A
// listener outside the sandbox's network (boundary.ListenerInfo.Host, the
// Kubernetes backend's host address) admits a connection by its source
// address, which is not authentication: a neighbour that can forge that
// address (a Pod with CAP_NET_RAW on the same node) could otherwise speak
// as the sandbox. There the workload holds a random per-sandbox key
// (NewWorkloadKey) in place of Placeholder, and the broker (Config.
// WorkloadKey) refuses every request, on every road, that does not carry
// it, before any effect. The key is never journaled.

// workloadKeyPrefix starts every per-sandbox key, so that it reads as
// moat's and never as a provider's.
const workloadKeyPrefix = "moat-"

// minWorkloadKeyBytes bounds a configured key from below: a key shorter
// than this could be guessed.
const minWorkloadKeyBytes = 32

// NewWorkloadKey returns a fresh per-sandbox key: "moat-" and 32 random
// bytes (crypto/rand), base64url without padding.
func NewWorkloadKey() string {
	var r [32]byte
	rand.Read(r[:]) // never fails (crypto/rand)
	return workloadKeyPrefix + base64.RawURLEncoding.EncodeToString(r[:])
}

// checkWorkloadKeyConfig applies to a configured Config.WorkloadKey the
// rule New enforces: "" (Placeholder), Placeholder itself, or at least
// minWorkloadKeyBytes of printable ASCII without spaces.
func checkWorkloadKeyConfig(key string) error {
	if key == "" || key == Placeholder {
		return nil
	}
	if len(key) < minWorkloadKeyBytes {
		return fmt.Errorf("moat: broker: workload key of %d bytes, want at least %d (NewWorkloadKey)", len(key), minWorkloadKeyBytes)
	}
	for i := 0; i < len(key); i++ {
		if key[i] <= ' ' || key[i] > '~' {
			return fmt.Errorf("moat: broker: workload key has a byte 0x%02x at %d, want printable ASCII without spaces", key[i], i)
		}
	}
	return nil
}

// workloadKey is the key the workload must send: Config.WorkloadKey, or
// Placeholder when none is set.
func (b *Broker) workloadKey() string {
	if b.cfg.WorkloadKey == "" {
		return Placeholder
	}
	return b.cfg.WorkloadKey
}

// credentialValue is the key a credential header carries: the value with
// an optional "Bearer " and surrounding spaces removed.
func credentialValue(v string) string {
	return strings.TrimSpace(strings.TrimPrefix(v, "Bearer "))
}

// sameKey compares a sent key with the expected one in constant time.
func sameKey(got, want string) bool {
	return subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

// checkWorkloadKey is the first check of every request (Broker.handle),
// whatever its road (inference, tools, services, packages), when the
// workload holds a per-sandbox key: some credential header must carry
// it, and every credential header must carry exactly it. With Placeholder
// it admits everything (checkHeaders still refuses other keys on the
// inference road).
func checkWorkloadKey(key string, r *request) *frontError {
	if key == Placeholder {
		return nil
	}
	carried := false
	for _, f := range r.header {
		if !slices.Contains(credentialHeaders, f.name) {
			continue
		}
		if !sameKey(credentialValue(f.value), key) {
			return refuse(ReasonCredentialHeader, 403, "the request did not carry this sandbox's broker key: header %s holds another value; send the key moat put in the workload's ANTHROPIC_API_KEY or OPENAI_API_KEY, unchanged", quote(f.name))
		}
		carried = true
	}
	if !carried {
		return refuse(ReasonCredentialHeader, 403, "the request did not carry this sandbox's broker key: send the key moat put in the workload's ANTHROPIC_API_KEY or OPENAI_API_KEY as x-api-key or Authorization: Bearer (the SDKs do this when left to their defaults)")
	}
	return nil
}

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

// canonicalNames are the forwarded headers' names as net/http spells
// them (http.CanonicalHeaderKey), computed once.
var canonicalNames = func() map[string]string {
	m := map[string]string{}
	for _, hs := range forwardedHeaders {
		for name := range hs {
			m[name] = http.CanonicalHeaderKey(name)
		}
	}
	return m
}()

// canonicalHeaderName is http.CanonicalHeaderKey(name) for a forwarded
// header's lower-case name.
func canonicalHeaderName(name string) string {
	if c, ok := canonicalNames[name]; ok {
		return c
	}
	return http.CanonicalHeaderKey(name)
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
// the key it was given, the placeholder or its per-sandbox key (as the
// SDKs do); anything else is refused, so a worker never believes it is
// using a key of its own.
var credentialHeaders = []string{"authorization", "x-api-key", "api-key"}

// Refusal reasons of the header stage.
const (
	ReasonCredentialHeader Reason = "credential_header" // a credential that is not the workload's key (placeholder or per-sandbox), or a per-sandbox key missing
	ReasonMoatHeader       Reason = "moat_header"       // a Moat-* header from the worker
	ReasonBetaNotAllowed   Reason = "beta_not_allowed"  // an anthropic-beta value not in allowedBetas
	ReasonBadHeaderValue   Reason = "header_value"      // a forwarded header with a value that fails its check
	ReasonContentType      Reason = "content_type"      // a body that does not claim to be JSON
)

// checkHeaders applies the header policy to a request bound for api and
// returns the worker headers to forward, each in its canonical form: the
// lower-case name and the value sent, which the pre-effect record carries.
// key is the workload's key (Broker.workloadKey); a credential header
// must hold exactly it.
func checkHeaders(api, key string, r *request) (map[string]string, *frontError) {
	out := map[string]string{}
	allowed := forwardedHeaders[api]
	for _, f := range r.header {
		switch {
		case strings.HasPrefix(f.name, "moat-"):
			return nil, refuse(ReasonMoatHeader, 400, "header %s is reserved for moat and may not be sent by the client", quote(f.name))
		case slices.Contains(credentialHeaders, f.name):
			if sameKey(credentialValue(f.value), key) {
				break
			}
			if key == Placeholder {
				return nil, refuse(ReasonCredentialHeader, 403, "header %q must hold the placeholder %q: moat adds the real credential itself; do not send keys of your own", f.name, Placeholder)
			}
			// The key itself is never in a message: messages are journaled.
			return nil, refuse(ReasonCredentialHeader, 403, "header %q must hold the key moat put in the workload's ANTHROPIC_API_KEY or OPENAI_API_KEY: moat adds the real credential itself; do not send keys of your own", f.name)
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
