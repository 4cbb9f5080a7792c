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
//     connection closed (under /svc/ a checked query and a gzip body are
//     accepted: see Brokered services). net/http's server is not used: it resolves some
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
// # The egress port
//
// The port above (the inference port) keeps refusing CONNECT and the
// absolute form. Tunnels to the policy's egress.hosts are served on a
// second listener, the egress port, also on the sandbox's loopback
// (ServeEgress, egress.go): it takes only a strict "CONNECT host:port"
// for a granted host (no byte after the head before the answer, so no
// smuggled data and no pipelined CONNECT), resolves the name once through
// the guard (internal/netguard: global unicast addresses only), answers
// 200, requires the TLS ClientHello's server name to equal the CONNECT
// host, journals egress.opened durably and only then dials exactly the
// checked address and relays TLS end to end (moat does not intercept it),
// within the grant's connection and byte budgets, the run's tunnel cap and
// its idle and total timeouts; egress.closed records the bytes each way.
// A refusal is journaled as egress.refused with a reason code and, before
// the 200, answered 403 with a body that names the grant to add.
//
// # Brokered services
//
// The policy's egress.services are served on the inference port under
// ServicesPathPrefix, /svc/<name>/<path> (service.go, Config.Services),
// through the same front with two additions: a query string, each
// parameter checked against the grant's allowlist byte for byte, and a
// Content-Encoding: gzip body, decoded whole under MaxBodyBytes. The
// method and path are checked against the grant; only a few workload
// headers are forwarded, and credential headers from the workload are
// refused; service.requested (headers and body digests, both for a gzip
// body) is durable before the broker sends the request with the grant's
// credential over TLS through the guard's dialer; a redirect is refused,
// never followed or passed back; the answer is buffered, scanned for
// every credential the run holds (a reflection ends the run) and
// journaled as service.completed. Refusals are service.refused and count
// in inference.max_refusals; each grant has its own max_requests.
//
// Buffered request and response bytes of all connections share one budget
// (MaxBufferedBytes), because the broker runs in the supervisor, outside
// the sandbox's memory limit; a request that cannot get its share in time
// is refused (broker_busy).
//
// # Package registries
//
// The policy's egress.packages are served on the inference port under
// PackagesPathPrefix, /pkg/<kind>/ (packages*.go, Config.Packages): GET
// only, no query, and only what the grant's lockfiles pin (read once at
// start). An admitted fetch appends package.requested durably, then sends
// a GET built by moat alone (no workload header, path or query byte is
// forwarded) with four headers: Accept, Accept-Encoding: identity,
// User-Agent: moat and Moat-Pre-Effect-SHA256, the lowercase hex SHA-256
// of that package.requested line as written, without its LF (the value
// the next line's prev holds, audit.LineHash). The line itself is not
// sent, unlike Moat-Pre-Effect on the other roads: registries are
// usually public and the line names the executable and the lockfile's
// host path. The digest binds the fetch to its record for whoever holds
// the journal (hash each line and find it) and reveals nothing without
// it: the line includes a signature only the run's key makes. The
// artifact is served only if its digest matches the lockfile's.
//
// # Approvals
//
// When the policy has approvals.rules (approval.go), a request that
// matches one (an inference request after admission and its allowance
// reservation, a tools/call after its call reservation, a service
// request after its own) is held before its pre-effect record:
// approval.requested (the approval id, the SHA-256 of the exact bytes
// that would leave, the principal: run, sandbox, attribution) is
// durable, then the connection waits for a decision through
// ApprovalDesk (the run's or the sandbox's control socket, moat
// approvals) or for approvals.timeout. Only an approval that names the
// held request's id and digest (and its principal and run, when given)
// lets it go: approval.decided is durable before the pre-effect record,
// and the bytes about to leave are hashed again against the approved
// digest. A mismatch, a second decision on one id, or changed bytes are
// journaled as approval.substitution and the held request is refused
// (approval_substituted); a denial, a timeout and the broker's Close
// refuse it too (approval_denied, approval_timeout, run_failed). A
// decision is single use: the same bytes sent again are held again.
// Each step has one log line: "moat.approval held" (Warn, so that the
// operator sees it at the default level), "moat.approval decided" (Info
// when approved, else Warn) and "moat.approval substitution" (Warn).
//
// # Durability and its cost
//
// A request leaves only once its inference.requested record is durable
// (written and fsynced): that is the promise every other record rests on,
// and the one fsync on a request's path. The inference.completed record is
// written in its place in the journal before the answer (or the stream's
// last chunk) is released; the request is then done and its connection
// read again at once, and the record is made durable off that path
// (syncSoon): 2 ms later its wait finds it covered by a later record's
// fsync (the next request's pre-effect record, when requests come back to
// back: one fsync per request instead of two) or syncs it itself.
// Concurrent requests share fsyncs (the writer's group commit).
//
// Why the completion record may be synced after the answer is released:
// the answer is an effect on the sandbox, not one that leaves it. Anything
// the workload does with the answer that reaches outside goes through the
// broker again, and that next request's pre-effect record is written after
// the completion line and made durable by an fsync of the same file,
// which covers every line written before it. So no journal can show an
// effect caused by an answer without that answer's completion record. If
// the sync fails, the run ends (audit_failure), as on any journal failure.
// The same holds for the 2 ms a completion record may wait for another
// record's fsync: no record of a new request, refusal or tunnel can be
// durable in that time without covering it. (Bytes on an egress tunnel
// opened before are not records: the tunnel's egress.closed, written and
// synced after, covers the completion line; a failed sync stops the relay
// within a chunk, as it did while the sync ran on the request's path.)
// The request's canonical log line says completed once its answer is
// released; a sync that fails afterwards is the run's fatal event and its
// own log line. A crash between the release and the sync leaves the durable
// pre-effect record followed by none, part or all of the completion line
// (or zeros);
// the verifier reports such a journal incomplete, with every complete line
// still verified (TestCrashBeforeCompletionSync). This is what a crash in
// the middle of a stream left already.
//
// # Decisions
//
// Each request is one value (exchange, in broker.go) made when it begins
// to arrive: its id, API, endpoint, provider, model and attribution (looked
// up once). Its records, its log line and its answer are made from it. A
// refusal is journaled as inference.refused with a reason code (Reason:
// the Reason* constants here and broker/wire's, one type) and answered in
// the API's own error shape with x-should-retry: false; the connection is
// then closed. A bug in moat is reported as internal_error, never under a
// code that blames the client. Messages inside moat carry no prefix; where
// a decision leaves moat (answer, record, log) it says "moat: refused: "
// or "moat: <reason>: " once.
//
// Each request gets one canonical log line when it ends (smokescreen's
// CANONICAL-PROXY-DECISION is the model): "moat.broker completed" (Info),
// "moat.broker refused" or "moat.broker failed" (Warn), always with the
// fields request_id, reason, api, endpoint, provider, model, stream,
// status, attribution, pid, duration_ms and detail, in that order; an
// admitted request also gets "moat.broker admitted" (Debug) with the same
// fields before it is sent. moat's --log-level / MOAT_LOG picks the level.
//
// A reflected credential or a journal failure is fatal: OnFatal is called
// once, "moat.broker fatal" is logged (Error), Failed reports it, and no
// provider request is made afterwards.
package broker
