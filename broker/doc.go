// Package broker is moat's inference broker: the only way out of a sandbox.
//
// The workload talks plain HTTP/1.1 to the broker's listener on the
// sandbox's loopback, as if it were the provider (WorkloadEnv sets the base
// URLs and placeholder keys). For each request the broker:
//
//  1. frames it strictly (front.go): origin-form targets only; CONNECT,
//     absolute/authority/asterisk forms, HTTP/2 and upgrades, duplicate
//     headers, Content-Length with Transfer-Encoding, any transfer coding
//     but one chunked (de-chunked and re-framed), chunk extensions and
//     trailers, obsolete folding, bare CR or LF, NUL and control bytes,
//     queries, percent-encoding, dot or empty segments, backslashes,
//     Content-Encoding and oversized heads or bodies are refused and the
//     connection closed. net/http's server is not used: it resolves some
//     of these ambiguities (identical duplicate Content-Length) instead of
//     refusing them, so the front is written here, in stages modelled on
//     net/http's readRequest and fixLength, with named limits;
//  2. routes it by path: /v1/messages → anthropic-messages,
//     /v1/chat/completions → openai-chat, /v1/responses → openai-responses
//     (wire.Endpoints). With several providers of one API, the request goes
//     to the first provider, in policy order, whose models list the
//     request's model;
//  3. applies the header policy (headers.go): only a few headers with
//     checked values are forwarded, worker credentials other than the
//     placeholder and any Moat-* header are refused;
//  4. admits the body with broker/wire (strict JSON, field allowlists,
//     model and max_tokens within policy) and takes the canonical bytes;
//  5. when the policy sets require_attribution, refuses a connection the
//     Attributor cannot resolve; then reserves one unit of the run's
//     allowance (max_requests), atomically, before anything is journaled;
//     a reservation is never returned, even when the provider fails;
//  6. appends the inference.requested pre-effect record and, only once
//     Append has returned the durable line, sends the canonical bytes to
//     base_url + endpoint with the real credential and that line, base64,
//     in the Moat-Pre-Effect header;
//  7. never follows redirects (a 3xx fails the request), decodes the
//     response (identity, gzip, deflate), scans headers and body for the
//     credential (scan.go), passes SSE through as it arrives and journals
//     inference.completed with status, sha256, size and token usage.
//
// Buffered request and response bytes of all connections share one budget
// (MaxBufferedBytes), because the broker runs in the supervisor, outside
// the sandbox's memory limit; a request that cannot get its share in time
// is refused (broker_busy).
//
// The cost: each brokered request waits for two fsyncs (inference.requested
// before it leaves, inference.completed before a non-streamed answer is
// released), which dominates the added latency; see bench_test.go.
//
// A refusal is journaled as inference.refused with a reason code (the
// Reason* constants, or broker/wire's codes) and answered in the API's own
// error shape with x-should-retry: false; the connection is then closed. A
// reflected credential or a journal failure is fatal: OnFatal is called
// once, Failed reports it, and no provider request is made afterwards.
package broker
