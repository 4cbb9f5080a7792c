// Package tools is the broker's road to tool servers: MCP over streamable
// HTTP at /mcp/<name> on the sandbox's loopback, one route per
// tools.mcp entry of the policy (issue 12).
//
// What the workload sends is parsed here, with internal/strictjson
// (duplicate member names, invalid UTF-8, trailing data, numbers out of
// double range refused), never by the MCP SDK. Each POST body is one
// JSON-RPC 2.0 message; batches, responses and every method other than
// initialize, notifications/initialized, notifications/cancelled,
// tools/list and tools/call are refused with a JSON-RPC error whose
// message says what to do instead (and data.reason, the code journaled).
// GET and DELETE are answered 405, as the streamable HTTP transport
// allows: no server-initiated stream and no session are offered, so
// every request stands alone. Those two and server/discover (answered
// "method not found", so that SDK clients fall back to initialize) are
// the transport's and protocol's own probes: they are answered but not
// journaled, since they ask nothing of a server.
//
//   - initialize is answered by the broker itself (server info
//     "moat/<name>", the tools capability only): nothing reaches a
//     server.
//   - tools/list asks the server and answers with the tools the
//     policy's allowlist names.
//   - tools/call is admitted in this order: the run has not failed; the
//     tool is on the allowlist; arguments are a JSON object whose RFC
//     8785 canonical form is within max_argument_bytes; the caller is
//     attributed when the policy requires it; one unit of max_calls is
//     reserved (never returned). Then tool.requested (server, tool,
//     sha256 of the canonical arguments, attribution) is appended and
//     fsynced, and only once it is durable is the call sent, with exactly
//     those canonical bytes as params.arguments. tool.completed (sha256
//     and size of the result given to the workload, the server's
//     isError) or tool.failed (server error, timeout after the entry's
//     timeout, credential reflected) closes it.
//   - Every refusal is journaled as tool.refused with its reason and
//     answered; past the policy's inference.max_refusals (counted here,
//     apart from the inference broker's) the run is ended.
//
// Results and tool lists from a server pass the credential reflection
// guard (Config.Reflects, the inference broker's scanner): one that
// carries a credential moat holds is withheld and the run is ended.
//
// A url server gets each call's tool.requested line, base64, in the
// Moat-Pre-Effect header (URLTransport), as a provider gets its
// inference.requested. URLTransport dials through URLOptions.Dial, which
// moat sets to the run's egress guard (internal/netguard) for every url
// whose host is not a loopback address; its default dial connects to
// loopback addresses only. Redirects are refused (ErrRedirect), never
// followed.
//
// The official Go SDK (github.com/modelcontextprotocol/go-sdk) is the
// client towards the servers (Connect), over any of its transports: a
// command server's stdio, in the sandbox moat builds for it, or a url
// server's streamable HTTP. Responses to the workload are built here as
// canonical JSON from the SDK's decoded result.
package tools
