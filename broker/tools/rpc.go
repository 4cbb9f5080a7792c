package tools

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/moat-sandbox/moat/internal/strictjson"
	"github.com/moat-sandbox/moat/policy"
)

// Methods the broker admits.
const (
	MethodInitialize  = "initialize"
	MethodInitialized = "notifications/initialized"
	MethodCancelled   = "notifications/cancelled"
	MethodToolsList   = "tools/list"
	MethodToolsCall   = "tools/call"
)

// Reason codes of tool.refused and tool.failed records.
const (
	ReasonBadJSON            = "bad_json"            // not strict JSON
	ReasonBadRequest         = "bad_request"         // not a JSON-RPC 2.0 request or notification
	ReasonBatch              = "batch_not_supported" // a JSON array
	ReasonMethodNotAllowed   = "method_not_allowed"  // a method the broker does not admit
	ReasonBadParams          = "bad_params"          // params of the wrong shape
	ReasonToolNotAllowed     = "tool_not_allowed"    // not on the server's allowlist
	ReasonArgumentsTooLarge  = "arguments_too_large" // canonical arguments over max_argument_bytes
	ReasonAllowanceExhausted = "allowance_exhausted" // max_calls used up
	ReasonUnattributed       = "unattributed"        // require_attribution and the caller is unknown
	ReasonServerNotFound     = "server_not_found"    // /mcp/<name> names no server
	ReasonHTTPMethod         = "http_method_not_allowed"
	ReasonContentType        = "content_type"
	ReasonMoatHeader         = "moat_header"
	ReasonBodyTooLarge       = "body_too_large"
	ReasonRunFailed          = "run_failed"
	ReasonServerError        = "server_error"
	ReasonTimeout            = "timeout"
	ReasonReflected          = "credential_reflected"
	ReasonRefusalLimit       = "refusal_limit"
	ReasonAuditFailure       = "audit_failure"
)

// JSON-RPC error codes (JSON-RPC 2.0 §5.1; -32001 is moat's "refused by
// policy", in the range left to implementations).
const (
	CodeParseError     = -32700
	CodeInvalidRequest = -32600
	CodeMethodNotFound = -32601
	CodeInvalidParams  = -32602
	CodeInternal       = -32603
	CodeRefused        = -32001
)

// Limits of what a workload may send.
const (
	// MaxBodyBytes caps one POST body: the largest max_argument_bytes
	// plus room for the envelope.
	MaxBodyBytes = int(policy.MaxArgumentBytesLimit) + 64<<10
	// maxIDBytes caps a request id's canonical form.
	maxIDBytes = 256
	// maxQuoted caps a client value quoted in a message.
	maxQuoted = 64
)

// Message is an admitted JSON-RPC message from the workload.
type Message struct {
	// ID is the canonical JSON of the request id (a string or an
	// integer); nil for a notification.
	ID     []byte
	Method string
	// Params is the decoded params object (nil when absent).
	Params map[string]any
}

// Call is an admitted tools/call: the tool and the canonical bytes of its
// arguments, which are what is hashed and sent.
type Call struct {
	Tool      string
	Arguments []byte
}

// Refusal is why a message was not admitted: a reason code for the
// journal and a message for the workload (or its model).
type Refusal struct {
	Reason  string
	Code    int // JSON-RPC error code
	Message string
	// Method and Tool are what the message named, when it did validly.
	Method, Tool string
}

func (r *Refusal) Error() string { return r.Message }

func refused(reason string, code int, format string, a ...any) *Refusal {
	return &Refusal{Reason: reason, Code: code, Message: "moat: refused: " + fmt.Sprintf(format, a...)}
}

// quote shows a client value safely: quoted, cut to maxQuoted bytes.
func quote(s string) string {
	if len(s) <= maxQuoted {
		return strconv.Quote(s)
	}
	cut := maxQuoted
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return strconv.Quote(s[:cut]) + fmt.Sprintf("… (%d bytes)", len(s))
}

// ParseMessage admits the envelope of one JSON-RPC 2.0 message: strict
// JSON, one object (no batch), "jsonrpc":"2.0", a string method, an id
// that is a string or an integer (absent for a notification), params an
// object when present, and no other member. A message carrying result or
// error (a response) is refused: the broker never asks the workload
// anything.
func ParseMessage(body []byte) (*Message, *Refusal) {
	v, err := strictjson.Decode(body)
	if err != nil {
		var se *strictjson.Error
		msg := err.Error()
		if errors.As(err, &se) {
			msg = se.Error()
		}
		return nil, refused(ReasonBadJSON, CodeParseError, "the body is not strict JSON (%s); send one JSON-RPC 2.0 object without duplicate member names", strings.TrimPrefix(msg, "strictjson: "))
	}
	obj, ok := v.(map[string]any)
	if !ok {
		if _, arr := v.([]any); arr {
			return nil, refused(ReasonBatch, CodeInvalidRequest, "JSON-RPC batches are not accepted; send one request per POST")
		}
		return nil, refused(ReasonBadRequest, CodeInvalidRequest, "the body must be a JSON-RPC 2.0 object")
	}
	m := &Message{}
	for k, val := range obj {
		switch k {
		case "jsonrpc":
			if s, ok := val.(string); !ok || s != "2.0" {
				return nil, refused(ReasonBadRequest, CodeInvalidRequest, `"jsonrpc" must be "2.0"`)
			}
		case "method":
			s, ok := val.(string)
			if !ok || s == "" {
				return nil, refused(ReasonBadRequest, CodeInvalidRequest, `"method" must be a non-empty string`)
			}
			m.Method = s
		case "id":
			id, r := parseID(val)
			if r != nil {
				return nil, r
			}
			m.ID = id
		case "params":
			p, ok := val.(map[string]any)
			if !ok {
				return nil, refused(ReasonBadRequest, CodeInvalidRequest, `"params" must be an object`)
			}
			m.Params = p
		case "result", "error":
			return nil, refused(ReasonBadRequest, CodeInvalidRequest, "the broker sends no requests to the client, so it accepts no responses")
		default:
			return nil, refused(ReasonBadRequest, CodeInvalidRequest, "unknown member %s in a JSON-RPC message (allowed: jsonrpc, id, method, params)", quote(k))
		}
	}
	if _, ok := obj["jsonrpc"]; !ok {
		return nil, refused(ReasonBadRequest, CodeInvalidRequest, `missing "jsonrpc":"2.0"`)
	}
	if m.Method == "" {
		return nil, refused(ReasonBadRequest, CodeInvalidRequest, `missing "method"`)
	}
	return m, nil
}

func parseID(v any) ([]byte, *Refusal) {
	switch id := v.(type) {
	case string:
	case strictjson.Number:
		n, err := id.Int64()
		if err != nil || n > 1<<53-1 || n < -(1<<53-1) {
			return nil, refused(ReasonBadRequest, CodeInvalidRequest, `"id" must be a string or an integer within ±(2^53-1), got %s`, quote(string(id)))
		}
	default:
		return nil, refused(ReasonBadRequest, CodeInvalidRequest, `"id" must be a string or an integer (null is not allowed)`)
	}
	b, err := strictjson.Encode(v)
	if err != nil || len(b) > maxIDBytes {
		return nil, refused(ReasonBadRequest, CodeInvalidRequest, `"id" must be at most %d bytes of JSON`, maxIDBytes)
	}
	return b, nil
}

// checkMethod admits the methods the broker serves: requests with an id,
// notifications without.
func checkMethod(m *Message) *Refusal {
	switch m.Method {
	case MethodInitialize, MethodToolsList, MethodToolsCall:
		if m.ID == nil {
			r := refused(ReasonBadRequest, CodeInvalidRequest, "%s is a request and needs an id", m.Method)
			r.Method = m.Method
			return r
		}
		return nil
	case MethodInitialized, MethodCancelled:
		if m.ID != nil {
			r := refused(ReasonBadRequest, CodeInvalidRequest, "%s is a notification and must not carry an id", m.Method)
			r.Method = m.Method
			return r
		}
		return nil
	}
	return refused(ReasonMethodNotAllowed, CodeMethodNotFound, "method %s is not served by moat's tool gateway: it serves initialize, tools/list and tools/call (and the notifications initialized and cancelled); use tools/call to call one of the tools tools/list shows", quote(m.Method))
}

// ParseCall admits the params of a tools/call against the server's
// entry: name on the allowlist, arguments a JSON object (absent means {})
// whose canonical form is within max_argument_bytes, and only _meta
// besides (dropped: it is not forwarded).
func ParseCall(params map[string]any, s *policy.MCPServer) (*Call, *Refusal) {
	bad := func(format string, a ...any) *Refusal {
		r := refused(ReasonBadParams, CodeInvalidParams, format, a...)
		r.Method = MethodToolsCall
		return r
	}
	var args any = map[string]any{}
	name, haveName := "", false
	for k, v := range params {
		switch k {
		case "name":
			n, ok := v.(string)
			if !ok {
				return nil, bad(`params.name must be a string`)
			}
			name, haveName = n, true
		case "arguments":
			if _, ok := v.(map[string]any); !ok {
				return nil, bad(`params.arguments must be a JSON object`)
			}
			args = v
		case "_meta":
			if _, ok := v.(map[string]any); !ok {
				return nil, bad(`params._meta must be an object`)
			}
		default:
			return nil, bad("unknown member %s in tools/call params (allowed: name, arguments, _meta)", quote(k))
		}
	}
	if !haveName {
		return nil, bad("tools/call needs params.name, the tool to call")
	}
	if !policy.ValidToolName(name) {
		return nil, bad("tool name %s is not a valid MCP tool name", quote(name))
	}
	if !s.AllowsTool(name) {
		r := refused(ReasonToolNotAllowed, CodeRefused, "tool %s is not allowed on server %q by the policy (allowed: %s); call one of those", quote(name), s.Name, strings.Join(s.Tools, ", "))
		r.Method, r.Tool = MethodToolsCall, name
		return nil, r
	}
	canon, err := strictjson.Encode(args)
	if err != nil {
		return nil, bad("params.arguments cannot be canonicalized: %v", err)
	}
	if int64(len(canon)) > int64(s.MaxArgumentBytes) {
		r := refused(ReasonArgumentsTooLarge, CodeRefused, "the arguments of %s are %d bytes (canonical JSON), more than the %d the policy allows for server %q; send smaller arguments",
			quote(name), len(canon), int64(s.MaxArgumentBytes), s.Name)
		r.Method, r.Tool = MethodToolsCall, name
		return nil, r
	}
	return &Call{Tool: name, Arguments: canon}, nil
}

// supportedVersions are the MCP protocol versions the broker answers
// initialize with, newest first: the ones whose streamable HTTP transport
// allows a server that issues no session and offers no stream.
var supportedVersions = []string{"2025-11-25", "2025-06-18", "2025-03-26"}

// negotiate returns the client's version when supported, else the newest.
func negotiate(params map[string]any) string {
	if v, ok := params["protocolVersion"].(string); ok && slices.Contains(supportedVersions, v) {
		return v
	}
	return supportedVersions[0]
}
