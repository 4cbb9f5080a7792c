package audit

import "github.com/moat-sandbox/moat/confirmation"

// Tool call records (MCP, issue 12). A tools/call that the broker admits
// is journaled as tool.requested, durable before the call reaches the
// server, and then closed by exactly one tool.completed or tool.failed
// with the same call_id. A JSON-RPC request the broker does not admit
// (a method or tool the policy does not name, bad arguments, no allowance
// left) is journaled as tool.refused and never reaches a server.
const (
	TypeToolRequested = "tool.requested"
	TypeToolCompleted = "tool.completed"
	TypeToolRefused   = "tool.refused"
	TypeToolFailed    = "tool.failed"
	// TypeToolServerConfirmed is the measurement of a command server's
	// own sandbox, journaled before the server starts.
	TypeToolServerConfirmed = "tool.server_confirmed"
)

// ToolRequested is the pre-effect record of one tools/call.
type ToolRequested struct {
	CallID string `json:"call_id"` // "moatcall_" and 24 hex digits, unique in the run
	Server string `json:"server"`  // the policy's tools.mcp name
	Tool   string `json:"tool"`
	// ArgumentsSHA256 is the SHA-256 of the RFC 8785 canonical form of
	// the call's arguments: the exact bytes sent to the server as the
	// value of params.arguments. ArgumentsBytes is their length.
	ArgumentsSHA256 string      `json:"arguments_sha256"`
	ArgumentsBytes  int64       `json:"arguments_bytes"`
	Attribution     Attribution `json:"attribution"`
}

// ToolCompleted records a tools/call result passed to the workload.
type ToolCompleted struct {
	CallID string `json:"call_id"`
	// ResultSHA256 is the SHA-256 of the exact bytes of the JSON-RPC
	// result object given to the workload; ResultBytes their length.
	ResultSHA256 string `json:"result_sha256"`
	ResultBytes  int64  `json:"result_bytes"`
	IsError      bool   `json:"is_error"` // the server's own isError: the tool ran and reported a failure
}

// ToolRefused records a JSON-RPC request to a tool server that the broker
// refused; it never reached the server.
type ToolRefused struct {
	CallID      string      `json:"call_id"`
	Server      string      `json:"server"`
	Method      string      `json:"method,omitempty"` // the JSON-RPC method, when the request had a valid one
	Tool        string      `json:"tool,omitempty"`   // for tools/call
	Reason      string      `json:"reason"`           // a reason code, e.g. "tool_not_allowed"
	Detail      string      `json:"detail"`           // the message the workload was given
	Attribution Attribution `json:"attribution"`
}

// ToolFailed closes a tool.requested whose call did not produce a result
// for the workload: the server failed or timed out, or its result was
// withheld (a reflected credential).
type ToolFailed struct {
	CallID string `json:"call_id"`
	Reason string `json:"reason"`
	Detail string `json:"detail"`
}

// ToolServerConfirmed is the measurement of a command tool server's own
// sandbox, made from inside it as boundary.confirmed is of the workload's,
// before the server starts: ready only when the measured properties are
// Ready (no network beyond its loopback, the filesystem only its grants,
// the process confined). A server whose sandbox is not ready is not
// started, and the run is refused.
type ToolServerConfirmed struct {
	Server     string                  `json:"server"`
	Ready      bool                    `json:"ready"`
	Properties confirmation.Properties `json:"properties"`
	Reason     string                  `json:"reason,omitempty"` // why not ready
	Checks     []Check                 `json:"checks,omitempty"`
}

func (ToolServerConfirmed) RecordType() string { return TypeToolServerConfirmed }

func init() { recordTypes[TypeToolServerConfirmed] = decodeAs[ToolServerConfirmed] }

func (ToolRequested) RecordType() string { return TypeToolRequested }
func (ToolCompleted) RecordType() string { return TypeToolCompleted }
func (ToolRefused) RecordType() string   { return TypeToolRefused }
func (ToolFailed) RecordType() string    { return TypeToolFailed }
