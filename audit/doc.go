// Package audit writes and verifies moat's signed, hash-chained run journal.
//
// # Files
//
// Create makes a run directory (mode 0700) holding two files:
//
//	pubkey.pem     the run's Ed25519 public key: one PEM block of type
//	               "PUBLIC KEY" holding its PKIX DER (RFC 8410), as
//	               `openssl pkey -pubin` reads it
//	journal.jsonl  the journal, mode 0600
//
// The private key is generated per run by Create, lives only in the Writer's
// memory, and is never written anywhere.
//
// # Journal
//
// The journal is a sequence of lines. Each line is one envelope followed by
// one LF (0x0A). No other byte separates lines: no CR, no blank line, no
// byte after the last LF. Line n (1-based) carries seq n.
//
// # Envelope
//
// An envelope is a DSSE envelope (https://github.com/secure-systems-lab/dsse,
// protocol v1.0) in exactly this byte form, with no whitespace and no other
// member order:
//
//	{"payloadType":"application/vnd.moat.audit.v1+json","payload":"P","signatures":[{"keyid":"K","sig":"S"}]}
//
// where
//
//   - P is the payload in standard base64 with padding (RFC 4648 §4), with
//     zero padding bits, so each payload has exactly one encoding;
//   - K is the keyid: the 64 lowercase hex digits of the SHA-256 (FIPS 180-4)
//     of the raw 32-byte Ed25519 public key (RFC 8032 §5.1.5);
//   - S is the 64-byte Ed25519 signature (RFC 8032 §5.1.6; pure Ed25519, no
//     prehash, no context) in standard padded base64: 88 characters;
//   - exactly one signature is present.
//
// The signed message is DSSE's pre-authentication encoding (PAE):
//
//	"DSSEv1" SP LEN(type) SP type SP LEN(payload) SP payload
//
// with SP a single 0x20 byte, type the payloadType string above, payload the
// decoded payload bytes, and LEN a byte length in ASCII decimal without
// leading zeros. For a payload of 300 bytes the message begins
// "DSSEv1 34 application/vnd.moat.audit.v1+json 300 {". Because the message
// is plain bytes, `openssl pkeyutl -verify -pubin -inkey pubkey.pem -rawin
// -in pae.bin -sigfile sig.bin` checks a line without moat.
//
// # Payload
//
// The payload is one JSON object (RFC 8259) in the canonical form of the
// JSON Canonicalization Scheme (RFC 8785): members sorted by their UTF-16
// code units, no whitespace, ECMAScript number form, minimal string
// escaping. It is the common header merged with the record's own members:
//
//	"v"     the number 1
//	"run"   the run id: 1 to 128 bytes of [A-Za-z0-9._:-], the same on every line
//	"seq"   the line number: 1, 2, 3, … without gaps
//	"prev"  64 lowercase hex digits: the SHA-256 of the exact bytes of the
//	        previous line, without its LF; for seq 1, 64 "0" digits
//	"time"  when the writer appended the record, RFC 3339 in UTC ("Z"),
//	        with Go's RFC3339Nano fraction (trailing zeros dropped)
//	"type"  the record type
//
// The record's own members are those of its Go type in this package
// (RunStarted, InferenceRequested, …) under their json tags, members tagged
// omitempty absent when empty (omitzero: when zero), and nothing else. The verifier decodes the
// record and re-encodes it; a payload that is not byte-for-byte what the
// writer would make is refused.
//
// # Numbers
//
// RFC 8785 prints numbers as IEEE 754 doubles, which carry integers exactly
// only up to 2^53-1 (MaxExactInt). So every JSON number in a payload is an
// integer in [-MaxExactInt, MaxExactInt]: the writer refuses to sign a
// record with any other number (rather than sign a rounded value), and
// the verifier rejects one. The only integers a provider chooses are the
// token counts of inference.completed, usage.input_tokens and
// usage.output_tokens; each is a JSON number when it lies in
// [0, MaxExactInt] and otherwise a JSON string of its decimal digits
// (e.g. "9223372036854775807", "-1"). No other member is ever a string
// standing for a number. Strings are Unicode text: a byte of invalid UTF-8
// in a record's string is journaled as U+FFFD.
//
// # Limits shared by the writer and the verifier
//
// A line is at most MaxLineBytes (without its LF), a journal at most
// MaxJournalBytes and MaxRecords lines. The writer applies the same
// constants before it writes, so it never produces a line or a journal
// that its verifier rejects: Append refuses (without writing, and without
// poisoning the writer) a record whose line is too long, or that would
// leave less than 64 KiB of the size limit for run.terminated
// (ErrJournalFull).
//
// # Record order
//
// Line 1 is run.started; its public_key is the PEM of pubkey.pem. Its
// lockfiles member (absent when the policy grants no package registry)
// lists each lockfile of egress.packages as moat read it before the
// workload started: kind, path, pins, sha256 (of the bytes read), trust
// (see Package registries). Line 2,
// when present, is boundary.confirmed, or run.terminated if the run ended
// before its boundary was confirmed. run.started and boundary.confirmed
// appear nowhere else. run.terminated is the terminal record: it is last,
// and its counts equal the numbers of inference.requested,
// inference.completed, inference.refused, inference.failed and
// process.started records before it (members requested, completed,
// refused, failed, processes), and, when any tool record precedes it, its
// counts.tools is an object of the numbers of tool.requested,
// tool.completed, tool.refused and tool.failed records (members
// requested, completed, refused, failed, all four present); without tool
// records counts has no tools member (a journal of a run without tools
// is byte for byte what it was before tools existed). The writer fills in
// those counts.
// process.exited says oom_killed when the kernel killed the process for
// going over the sandbox's memory limit; process.failed records a command
// that could not be started (argv, the exit code moat gave: 127 not found,
// 126 not executable, 125 not confinable; and the reason).
//
// # The pre-effect record
//
// inference.requested is written, and durable, before its request leaves
// for the provider; the broker sends that exact line, in standard base64,
// as the request's Moat-Pre-Effect header, so a provider holding the
// pinned key can check what it receives against it. Its body_sha256 is
// the SHA-256 of the exact body bytes forwarded. Its "headers" member is
// an object mapping the lower-case name of each workload-influenced header
// that is forwarded to the exact value sent, in the canonical form the
// broker forwards (e.g. {"anthropic-beta":"interleaved-thinking-2025-05-14,output-128k-2025-02-19","anthropic-version":"2023-06-01"}):
// the broker forwards a worker header only when it is on its list and
// only in that form (see broker/headers.go), so nothing the workload
// chooses reaches the provider outside the signed record. The headers the
// broker sets itself (Content-Type, Accept, Accept-Encoding, User-Agent,
// the credential, Moat-Pre-Effect) are not listed. The member is absent
// when no worker header was forwarded; it is never an empty object.
//
// # Tool calls
//
// A tool server named in the policy's tools.mcp is reached only through
// the broker (MCP JSON-RPC at /mcp/<name>). Five record types cover it;
// their members, in payload (RFC 8785) order:
//
//	tool.requested         arguments_bytes, arguments_sha256, attribution, call_id, server, tool
//	tool.completed         call_id, is_error, result_bytes, result_sha256
//	tool.refused           attribution, call_id, detail, method (omitempty), reason, server, tool (omitempty)
//	tool.failed            call_id, detail, reason
//	tool.server_confirmed  checks (omitempty), properties, ready, reason (omitempty), server
//
// tool.server_confirmed is the measurement of a command server's own
// sandbox (its members as boundary.confirmed's, with the server's name),
// journaled once per command server after boundary.confirmed and before
// the server starts; ready false means the server was not started and the
// run was refused. It is not counted in run.terminated's counts.
//
// call_id is "moatcall_" followed by 24 lowercase hex digits, fresh per
// JSON-RPC request. tool.requested is the pre-effect record of a
// tools/call: it is appended and fsynced before the call is sent, and
// arguments_sha256 is the SHA-256 (64 lowercase hex digits) of the RFC
// 8785 canonical form of params.arguments, which is exactly the byte
// string the server receives as that member (arguments_bytes its
// length). attribution is the calling process, as in inference.requested.
// A url server receives that exact line, in standard base64, as the
// call's Moat-Pre-Effect header.
// One tool.completed or tool.failed with the same call_id follows it:
// result_sha256 and result_bytes cover the exact JSON bytes of the
// JSON-RPC result object given to the workload, and is_error is the
// server's own isError (the tool ran and reported a failure). tool.failed
// says why no result was given (reason: server_error, timeout,
// credential_reflected, run_failed). tool.refused records a request that
// never reached a server: reason is one of the broker's codes (e.g.
// method_not_allowed, tool_not_allowed, bad_arguments,
// arguments_too_large, allowance_exhausted, bad_json), detail the message
// the workload was given; method and tool are present when the request
// named them validly. For example, with the key and clock pinned:
//
//	{"arguments_bytes":13,"arguments_sha256":"dd…dd","attribution":{"executable":"/usr/bin/python3","pid":4242,"sha256":"cc…cc","status":"resolved"},"call_id":"moatcall_000000000000000000000002","prev":"5589…e49b","run":"run-1","seq":3,"server":"calc","time":"2026-12-01T02:00:00Z","tool":"add","type":"tool.requested","v":1}
//	{"call_id":"moatcall_000000000000000000000002","is_error":false,"prev":"89da…baf3","result_bytes":52,"result_sha256":"ee…ee","run":"run-1","seq":4,"time":"2026-12-01T02:00:00Z","type":"tool.completed","v":1}
//
// (Example_toolRequested prints them in full.) run.terminated's
// counts.tools counts the tool records, for example
// "counts":{"completed":1,"failed":0,"processes":1,"refused":0,"requested":1,"tools":{"completed":1,"failed":0,"refused":1,"requested":1}}.
//
// # Brokered services
//
// A service named in the policy's egress.services is reached only
// through the broker (plain HTTP at /svc/<name>/<path>; the broker adds
// the credential and sends the request over TLS). Four record types cover
// it; their members, in payload (RFC 8785) order:
//
//	service.requested  attribution, body_bytes, body_sha256, content_encoding (omitempty), encoded_bytes (omitempty), encoded_sha256 (omitempty), headers_sha256, method, path, query (omitempty), request_id, service
//	service.completed  body_bytes, body_sha256, request_id, status
//	service.refused    attribution, detail, method, reason, request_id, service (omitempty)
//	service.failed     detail, reason, request_id, status (omitempty)
//
// request_id is "moatreq_" followed by 24 lowercase hex digits, fresh per
// request. service.requested is the pre-effect record: it is appended and
// fsynced before the request leaves, and the service receives that exact
// line, in standard base64, as the request's Moat-Pre-Effect header.
// path is the path sent below the service's base_url path (after
// /svc/<name>), query the exact query string sent (every parameter one
// the grant lists; absent when there is none). headers_sha256 is the
// SHA-256 of the workload-influenced headers forwarded, each as the
// bytes "name: value" and an LF, with lower-case names, the lines sorted
// bytewise and concatenated (the SHA-256 of the empty string when none
// is forwarded); the headers the broker sets itself (the credential,
// Accept-Encoding, Moat-Pre-Effect, framing) are not in it. body_sha256
// and body_bytes cover the exact body bytes sent. When the workload sent
// its body with Content-Encoding: gzip, the broker decodes it and sends
// the decoded bytes: content_encoding is "gzip" and encoded_sha256 and
// encoded_bytes cover the bytes as the workload sent them (after
// de-chunking); otherwise the three members are absent.
// One service.completed or service.failed with the same request_id
// follows it: service.completed's status is the service's, and
// body_sha256 and body_bytes cover the exact (content-decoded) body given
// to the workload. service.failed says why no answer was given (reason:
// upstream_error, upstream_encoding, response_too_large,
// service_redirect, credential_reflected, audit_failure, run_failed);
// status is the service's when it answered. service.refused records a
// request that never reached a service: reason is one of the broker's
// codes (service_unknown, method_not_allowed, service_path_not_allowed,
// service_query_not_allowed, service_header_refused,
// service_body_encoding, service_unconfigured, allowance_exhausted,
// unattributed, run_failed), detail the message the workload was given,
// method the request's method (at most wire.MaxQuotedBytes of it, as
// the broker quotes client values), service the granted name, absent
// when the path names none. A request refused by the front before it is
// routed (a path with dot or empty segments, percent-encoding, CONNECT)
// is an inference.refused, as before. Service records count in no member
// of run.terminated's counts. For example, with the key and clock pinned:
//
//	{"attribution":{"executable":"/usr/bin/git","pid":4242,"sha256":"cc…cc","status":"resolved"},"body_bytes":4100,"body_sha256":"22…22","content_encoding":"gzip","encoded_bytes":720,"encoded_sha256":"33…33","headers_sha256":"11…11","method":"POST","path":"/owner/repo.git/git-upload-pack","prev":"5409…9506","request_id":"moatreq_000000000000000000000003","run":"run-1","seq":5,"service":"github","time":"2026-12-01T02:00:00Z","type":"service.requested","v":1}
//	{"detail":"moat: service_redirect: service \"github\" answered with a redirect (HTTP 302); moat neither follows nor passes on redirects","prev":"9322…2038","reason":"service_redirect","request_id":"moatreq_000000000000000000000003","run":"run-1","seq":6,"status":302,"time":"2026-12-01T02:00:00Z","type":"service.failed","v":1}
//
// (Example_serviceRequested prints them in full.)
//
// # Egress tunnels
//
// A host named in the policy's egress.hosts is reached only through the
// broker's egress port (CONNECT host:port, then TLS end to end; moat does
// not intercept it). Three record types cover it; their members, in
// payload (RFC 8785) order:
//
//	egress.opened   address, attribution, grant, host, port, sni, tunnel_id
//	egress.closed   bytes_to_host, bytes_to_workload, detail (omitempty), duration_ms, reason, tunnel_id
//	egress.refused  address (omitempty), attribution, detail, host (omitempty), port (omitempty), reason, sni (omitempty), tunnel_id
//
// tunnel_id is "moattun_" followed by 24 lowercase hex digits, fresh per
// CONNECT. egress.opened is the pre-effect record: it is appended and
// fsynced before the broker dials. host is the CONNECT host in canonical
// form (a name lower case, an IPv6 literal in brackets), port a JSON
// number, grant the egress.hosts entry that admitted it as "host:port"
// (e.g. "*.pythonhosted.org:443"), address the one address the name
// resolved to and that was checked and dialled (netip text, no port),
// and sni the server name of the workload's TLS ClientHello, which the
// broker requires to equal host (for a tunnel to a granted IP address,
// whose ClientHello carries no server name, sni is ""). One egress.closed with the same
// tunnel_id follows it: bytes_to_host and bytes_to_workload are the bytes
// relayed each way (the ClientHello counted in bytes_to_host), JSON
// numbers; duration_ms runs from the opened record to the close; reason
// is closed (either side ended it), idle_timeout, max_duration,
// byte_budget (the grant's max_bytes was reached), dial_failed (detail
// says why; nothing was relayed), run_ended (the broker stopped) or
// audit_failure. egress.refused records a CONNECT that was never
// dialled: reason is one of egress_bad_request (not a strict CONNECT:
// another method, a bad authority, bytes after the head before the
// answer), egress_not_granted, egress_tls_required (the first bytes are
// not a TLS ClientHello, or it has no server name), egress_sni_mismatch,
// egress_connection_budget (the grant's max_connections), egress_tunnel_cap
// (egress.max_tunnels), unattributed, run_failed, or one of the guard's
// resolve_failed, resolve_no_address, address_loopback, address_private,
// address_cgnat, address_link_local, address_metadata, address_multicast,
// address_unspecified, address_embeds_ipv4, address_not_global,
// address_zone and address_host_own (internal/netguard); host, port and
// sni are what the workload sent, quoted and cut as the broker quotes
// client values, absent when it sent none; address is the refused
// address for the guard's address_* reasons; detail is the body of the
// 403 answer, which names the grant to add when the host is not granted.
// Egress records count in no member of run.terminated's counts. For
// example:
//
//	{"address":"151.101.0.223","attribution":{"executable":"/usr/bin/pip","pid":4242,"sha256":"cc…cc","status":"resolved"},"grant":"pypi.org:443","host":"pypi.org","port":443,"prev":"…","run":"run-1","seq":7,"sni":"pypi.org","time":"2026-12-01T02:00:00Z","tunnel_id":"moattun_000000000000000000000001","type":"egress.opened","v":1}
//	{"bytes_to_host":1893,"bytes_to_workload":40213,"duration_ms":412,"prev":"…","reason":"closed","run":"run-1","seq":8,"time":"2026-12-01T02:00:01Z","tunnel_id":"moattun_000000000000000000000001","type":"egress.closed","v":1}
//
// # Package registries
//
// A registry named in the policy's egress.packages is reached only
// through the broker (plain HTTP at /pkg/<kind>/...; the broker fetches
// from the upstream over TLS and serves only what the lockfiles pin).
// Five record types cover it; their members, in payload (RFC 8785) order:
//
//	package.reload     detail (omitempty), lockfiles, outcome, reason (omitempty), requester
//	package.requested  artifact, attribution, expected (omitempty), kind, lockfile (omitempty), name, path, request_id, version (omitempty)
//	package.completed  body_bytes, body_sha256, request_id, status
//	package.refused    attribution, detail, kind (omitempty), method, name (omitempty), reason, request_id
//	package.failed     detail, got (omitempty), reason, request_id, status (omitempty)
//
// request_id is "moatreq_" followed by 24 lowercase hex digits, fresh per
// request. package.requested is the pre-effect record: it is appended and
// fsynced before anything is fetched. artifact is "tarball" (npm),
// "zip" or "go.mod" (the Go module proxy), each with name, version, the
// lockfile's expected digest in its own form (npm's "sha512-<base64>",
// go.sum's "h1:<base64>", the dirhash of the zip's files or of the
// go.mod) and the lockfile that pins it; or "metadata" (an npm packument,
// served filtered to the pinned versions, or a PyPI index page served
// with only the pinned files' links); or "file" (a PyPI distribution,
// expected "sha256:<hex>", path its full URL, which may be on the
// grant's files_upstream). The Go proxy's @v/list and
// .info answers are made by moat from go.sum, fetch nothing and are not
// journaled. path is the
// path fetched below the upstream. A tarball whose bytes do not match
// expected is not served: package.failed, reason package_digest_mismatch,
// got the digest of the bytes received. package.refused: nothing was
// fetched (a name or version no lockfile pins, a publish, a method other
// than GET). These records count in no member of run.terminated.
// The lockfiles moat admits from are read once, before the workload
// runs, and listed in run.started's lockfiles: the sha256 of the bytes
// moat read, how many artifacts they pin, and the trust ("pinned":
// outside every writable grant or pinned by lockfile_sha256;
// "workspace": the policy accepted a lockfile the workload may have
// written). A lockfile changed later changes nothing, until an operator
// asks a sandbox to read them again (moat sandbox reload-lockfiles):
// package.reload, durable before the new pins take effect, names who
// asked (requester, "uid U pid P" from the control socket's peer
// credentials) and, for every lockfile in force, its kind, path, trust,
// old_sha256 (the digest in force: run.started's or the last applied
// reload's) and sha256 (of the bytes read now; absent when they could
// not be read) and pins (absent when refused). outcome "applied": the
// new digests are in force from the next request on; "refused": a
// lockfile could not be read without following a symlink
// (reason lockfile_unreadable), failed the trust rule or its pinned
// sha256 (lockfile_untrusted) or did not parse (lockfile_invalid), and
// the set in force is unchanged. The writer and the verifier follow the
// set in force: a package.reload must list exactly its lockfiles with
// their old_sha256 (else ErrBadRecord). Journals written before
// run.started carried the lockfiles hold one package.lockfile record
// (kind, path, pins, sha256, trust) per lockfile after
// boundary.confirmed; moat reads them and no longer writes them.
//
// # Approvals
//
// A request matching one of the policy's approvals.rules is held until an
// operator decides it (moat approvals). Three record types cover it;
// their members, in payload (RFC 8785) order:
//
//	approval.requested     approval_id, name, principal, request_bytes, request_id, request_sha256, road, target, timeout_ms
//	approval.decided       approval_id, approver (omitempty), decision, detail (omitempty), request_id, request_sha256
//	approval.substitution  approval_id, approver (omitempty), detail, presented_sha256 (omitempty), reason, request_sha256
//
// approval_id is "moatapr_" followed by 24 lowercase hex digits, fresh
// per held request; request_id is the held request's (its later
// inference.requested or inference.refused carries the same). road is
// inference, tool or service; target the provider, server or service;
// name the model, tool or path. request_sha256 and request_bytes cover
// the exact canonical request bytes that leave if it is approved: for
// inference the body (its inference.requested's body_sha256), for a tool
// call the canonical arguments (tool.requested's arguments_sha256), for
// a service the method, a space, the path (with "?" and the query when
// there is one), an LF, "headers_sha256: " and service.requested's
// headers_sha256, two LFs and the body (broker.ServiceApprovalBytes).
// request_id is the tool call's call_id on the tool road. principal is
// {"attribution":…,"run":…,"sandbox":…}: the run id, the sandbox's name
// (absent for moat run) and the process that made the request.
// timeout_ms is how long it is held at most. approval.requested is
// durable before the approval can be listed or decided. approval.decided
// ends it: decision is approved, denied, timed_out, substituted or
// cancelled (the run ended); approver is the control socket's peer
// ("uid U pid P"), absent for timed_out and cancelled. It is durable
// before an approved request's own pre-effect record is written, and so
// before the request leaves; any other decision is followed by the
// request's refusal (reasons approval_denied, approval_timeout,
// approval_substituted, run_failed). approval.substitution records an
// attempt to decide that was refused: reason digest_mismatch (the
// digest given is not the held request's), principal_mismatch,
// run_mismatch, replay (the approval was decided already: an approval is
// single use) or bytes_changed (the bytes about to leave are not those
// approved); presented_sha256 is the digest given, or for bytes_changed
// the digest of the bytes that were about to leave. A mismatch on a held
// request also decides it substituted: the request never leaves. None of
// them counts in run.terminated's counts. For example, with the key and
// clock pinned:
//
//	{"approval_id":"moatapr_000000000000000000000001","name":"claude-x","prev":"5589…e49b","principal":{"attribution":{"executable":"/usr/bin/python3","pid":4242,"sha256":"cc…cc","status":"resolved"},"run":"run-1","sandbox":"dev"},"request_bytes":120,"request_id":"moatreq_000000000000000000000002","request_sha256":"dd…dd","road":"inference","run":"run-1","seq":3,"target":"anthropic","time":"2026-12-01T02:00:00Z","timeout_ms":300000,"type":"approval.requested","v":1}
//	{"approval_id":"moatapr_000000000000000000000001","approver":"uid 1000 pid 77","decision":"substituted","prev":"c388…e666","request_id":"moatreq_000000000000000000000002","request_sha256":"dd…dd","run":"run-1","seq":5,"time":"2026-12-01T02:00:00Z","type":"approval.decided","v":1}
//
// (Example_approvalRequested prints them in full, with the substitution
// between them.)
//
// # Shared budgets
//
// A sandbox created with `moat sandbox create --parent` draws its
// requests and output tokens from a ledger shared with its ancestors
// (internal/ledger). The broker reserves one request and the request's
// max_tokens against every account of the chain before the pre-effect
// record, and writes one budget.updated before the request's
// inference.completed or inference.failed:
//
//	budget.updated  accounts, charged_tokens, outcome, request_id, reserved_tokens
//
// outcome is "settled" (completed: charged_tokens is the provider's
// reported usage.output_tokens, replacing the reservation) or "kept" (the
// request failed after its reservation, so it may have been served:
// charged_tokens is the reservation, kept as spent). accounts lists, the
// sandbox's own first and then each ancestor's, {account, requests,
// max_requests, tokens, max_tokens} after the charge (usage includes the
// descendants'; a cap of 0 is none of its own). A request whose
// reservation is never closed (the supervisor died) has no budget.updated
// and stays charged in the ledger. Budget records count in no member of
// run.terminated's counts.
//
// # Receipts
//
// A receipt proves that one request was made and answered. It is derived
// from two signed lines of the journal, the request's pre-effect record
// (inference.requested, tool.requested, service.requested) and its
// completion record (inference.completed, tool.completed,
// service.completed, same request_id or call_id), and adds nothing they
// do not say. MakeReceipt (`moat audit receipt JOURNAL SEQ -o json`)
// prints it as one JSON object in RFC 8785 form; ParseReceipt accepts any
// JSON layout of exactly these members (no unknown or duplicate member,
// at most MaxReceiptBytes):
//
//	format       "moat.receipt.v1"
//	run          the run id
//	keyid        the run key's keyid (64 hex digits)
//	road         "inference", "tool" or "service"
//	id           the request_id or call_id
//	target       the provider, tool server or service name
//	name         the model, the tool, or the service's method, SP, path
//	request      {seq, type, line_sha256, sha256}: the pre-effect line's
//	             seq, record type and LineHash, and the request digest
//	             (body_sha256, arguments_sha256, body_sha256)
//	response     the same for the completion line, with the response
//	             digest (response_sha256, result_sha256, body_sha256)
//	status       the provider's or service's HTTP status (absent for tools)
//	usage        inference only: the completion's usage, as journaled
//	approval_id  the approval that let the request leave: the
//	             approval_id of the approval.decided (decision approved)
//	             for the same request id before its pre-effect record;
//	             absent when there is none
//
// VerifyReceipt (`moat audit verify-receipt RECEIPT --journal J --key PUB
// | --key-fingerprint F`) checks it offline: keyid is the pinned key's;
// the journal verifies with that key through line response.seq (what
// follows that line is not looked at, so a receipt stays checkable while
// the run goes on); the lines at request.seq and response.seq hash to the
// receipt's line_sha256s; and the receipt derived from those lines equals
// it member for member. The errors wrap ErrReceiptMalformed,
// ErrWrongKey, ErrReceiptJournal (the journal ends before the lines or
// does not verify up to them) or ErrReceiptMismatch (a member differs).
//
// # Terminal reasons
//
// run.terminated's reason says how the run ended; exit_code is what the
// moat command exited with:
//
//	completed      the workload exited on its own; exit_code is its code
//	exec_failed    the command could not be started (126 or 127)
//	refused        moat refused before the workload started: the backend
//	               could not prepare, confirmation failed, the boundary
//	               is not Ready (125)
//	failed         moat itself failed (125)
//	cancelled      the broker stopped all effects: a reflected
//	               credential, a journal failure (125)
//	refusal_limit  the broker refused more requests than the policy's
//	               inference.max_refusals; the refusal past the cap is
//	               the last one journaled, later ones are only answered
//	               (125)
//	journal_limit  the broker's records reached the policy's
//	               audit.max_bytes; no request or refusal is journaled
//	               after that, only the records that close requests
//	               already in flight (125)
//	deleted        a `moat sandbox` was deleted (0)
//	terminated     a `moat sandbox` supervisor got SIGTERM, SIGINT or
//	               SIGHUP (0)
//	sandbox_lost   the sandbox ended from outside moat while the run
//	               went on: the kubernetes backend's Pod was deleted,
//	               evicted or failed (125)
//
// These are the TerminalReason constants (ReasonCompleted, …). The
// verifier checks the record's form and counts, not which reason it
// names.
//
// # Verification
//
// Verify works on the exact bytes of each line and never re-serialises what
// it hashes or checks a signature over. It returns
//
//   - Complete (exit 0): every line is valid, the chain is unbroken, and the
//     terminal record is the last line;
//   - Incomplete (exit 2): every line is valid but there is no terminal
//     record; the journal may also end in a torn line (bytes with no final
//     LF that begin like an envelope, or are NUL bytes), which a write cut
//     short by a crash leaves; or the journal is empty. A run directory
//     holding pubkey.pem but no journal.jsonl (a kill between Create's two
//     files) is incomplete too: `moat audit verify` says so;
//   - Invalid (exit 1): anything else, with the first bad line and a
//     *LineError wrapping one of ErrMalformed, ErrWrongKey, ErrBadSignature,
//     ErrNonCanonical, ErrBadHeader, ErrWrongRun, ErrSequence,
//     ErrBrokenLink, ErrDuplicate, ErrUnknownType, ErrBadRecord,
//     ErrRecordOrder, ErrAfterTerminal, ErrCounts or ErrTooManyRecords.
//
// # Pinning the key
//
// Verify establishes that the journal is intact under the key it is given,
// not whose key that is: anyone can sign a journal of their own with a
// fresh key and put that key in pubkey.pem. Authenticity needs the key to
// be pinned from a source other than the run directory: the run prints its
// keyid (KeyID, the sha256 of the raw 32-byte Ed25519 key, 64 hex digits)
// on stderr when it starts, and `moat audit verify --key-fingerprint HEX`
// checks it. A mismatch is invalid (exit 1). Without a pin, `moat audit
// verify` still exits 0, 2 or 1 on the journal's own state but prints
// "UNPINNED: authenticity not established" on stderr and "pinned": false
// with -o json; --require-pin turns an unpinned success (0 or 2) into
// exit 3.
//
// Per line the checks run in this order: envelope form, keyid, signature,
// payload canonical, header, record type and members, duplicate, run,
// seq, prev, place, counts.
//
// # Durability
//
// Writer.Append returns a line only after write(2) and fsync(2) of it have
// returned. Concurrent appenders are totally ordered by one mutex held while
// the line is built, signed and written; they then share fsyncs (group
// commit): one caller's fsync covers every line written before it, and
// runs without the lock that waiting callers take, so a caller whose line
// an earlier fsync covered returns at once. After any
// write or fsync error the writer is poisoned and refuses everything, since
// after a failed fsync Linux may report a later fsync as successful without
// the data being on disk. Create writes pubkey.pem and the empty journal and
// syncs the key file and the run directory in the background (moat prepares
// its sandbox meanwhile); the first fsync of the journal waits for them, so
// a durable line implies a durable key and directory entry, and their
// failure poisons the writer as a failed fsync does.
//
// # Why by hand
//
// The envelope is parsed by matching its fixed bytes rather than by a JSON
// decoder, so that exactly one byte form is accepted; the payload is parsed
// by internal/strictjson (jsontext), which refuses duplicate members and
// invalid UTF-8. No DSSE library is used: the whole signing path is PAE plus
// crypto/ed25519, a few lines that are easier to audit than a dependency.
//
// # Dependencies
//
// The format and its verifier are a leaf, as x/mod's note is: this package
// imports the standard library, internal/strictjson (and the jsontext it
// wraps) and package confirmation, nothing else. The measured properties,
// checks, limits status and attribution that boundary.confirmed and the
// inference records carry are confirmation's types (Check and Attribution
// are aliases here), shared with the backend contract (package boundary)
// without this package linking that contract, the policy or YAML; the
// dependency test at the module root (deps_test.go) fails if it does.
package audit
