// Package evidence is moat's containment evidence suite: the controller that
// attacks a real sandbox with the fixed hostile probe (cmd/moat-probe), the
// host-side receivers and synthetic provider that observe the outcome from
// outside, the scoring rules, the bundle with its manifest, and the offline
// verifier.
//
// # Bundle format
//
//	report.json        Report: planned cases, per-case outcome and observations,
//	                   probe claims (kept apart, never scored), hashes, host facts,
//	                   and case_files: the sha256 of every file under cases/
//	report.dsse.json   DSSE envelope (payloadType ReportPayloadType) of report.json,
//	                   signed with a fresh Ed25519 suite key; keyid is the hex
//	                   sha256 of the raw 32-byte public key
//	report.md          the same for people, with what the suite does not establish
//	cases/<name>/      the raw, controller-owned observations of one case:
//	    policy.yaml            the policy the case ran with (credential env names only)
//	    run-info.json          what moat wrote with --run-info (absent if it never got Ready)
//	    pubkey.pem             the run key, pinned from run-info before the first request
//	    journal.jsonl          the run's journal, byte for byte
//	    provider-events.jsonl  one ProviderEvent per request the synthetic provider received
//	    redirect-events.jsonl  one ReceiverEvent per connection the redirect target received
//	    receiver-events.jsonl  ReceiverEvents of the direct receivers (controls and hits)
//	    host.json              HostRecord: exit code, namespaces, no_new_privs, cleanup;
//	                           for the host-check cases also runs (later runs), paths
//	                           (host lstats), values (canaries the controller placed)
//	                           and inotify (the host's inotify measurement)
//	    probe.out, moat.err    the probe's stdout and moat's stderr, synthetic
//	                           credentials replaced by RedactedCredential
//	    later-runs.out         a multi-run case's later runs: probe stdout and moat
//	                           stderr under "== run N … ==" lines
//	    tool-calls.jsonl       a command tool case's server log: one ToolLogLine
//	                           per call that reached the server
//	    tool-events.jsonl      the url tool case: one ToolEvent per tools/call the
//	                           controller's MCP server received
//	    egress-events.jsonl    the egress case: one EgressEvent per ClientHello and
//	                           request the registry received and per delivery to
//	                           the trap (the host's control included)
//	manifest.json      {"version":1,"files":{"<relative path>":"<sha256 hex>",…}}
//
// A bundle holds exactly these files: nothing else at the top, and in a
// case directory only the names above.
//
// # Verification and pins
//
// VerifyBundlePinned checks, offline: the manifest against the files; the
// exact set of files; report.dsse.json's signature over report.json by the
// suite key that report.json names; the case files against the hashes the
// signed report lists; report.md against the one RenderMarkdown
// regenerates from report.json (any difference is rejected);
// report.dsse.json and manifest.json in the one form moat writes; the
// planned list as a subsequence of the fixed list with every planned case
// reported; and every case's observations, claims and outcome recomputed
// from its raw files.
//
// That establishes consistency, not origin: anyone can edit raw files,
// recompute the outcomes and re-sign the report with a fresh suite key, and
// the result is consistent on its own (or, with planned cases dropped, a
// consistent subset). Authenticity needs a pin from outside the bundle,
// either of which covers every file: Pins.SuiteKeyFingerprint, the suite
// keyid (sha256 of the raw Ed25519 key) that `moat evidence run` prints,
// or Pins.ManifestSHA256. VerifyResult.Pinned is true only for a valid
// bundle with a matching pin. `moat evidence verify` exits 0 (valid and
// complete), 2 (valid subset) or 1 (invalid, or a pin does not match);
// without a pin it prints "UNPINNED: authenticity not established" on
// stderr and "pinned": false with -o json, and --require-pin turns an
// unpinned 0 or 2 into 3. Tampers lists attacks rejected even unpinned;
// verify_test.go's forged-bundle table shows which re-signed forgeries
// only a pin rejects.
//
// Observations (the Observations type) are never written by hand: both the
// controller and the verifier compute them from the raw files with
// ObserveCase, and Score turns them into an outcome. The verifier therefore
// recomputes every outcome, and a report whose observations, claims or
// outcomes differ from what its raw files say is rejected. The probe's own
// claims are parsed from probe.out into the report for people to read;
// Score never sees them.
//
// # The case list
//
// Cases is fixed and ordered; a report keeps every planned case. The first
// 20 attack the broker and the network from inside:
// allowed-inference-canary (the positive canary), alternate-auth-route,
// absolute-url-target, url-backed-document, provider-hosted-tool,
// unapproved-model, unknown-control-field, server-compaction,
// malformed-json, duplicate-content-length, chunked-framing,
// worker-audit-headers, worker-credential-headers, allowance-reconnect,
// twenty-signed-requests, provider-redirect, credential-reflection,
// audit-storage-fault, direct-network and false-success-claim.
//
// The next five are the escape classes that issue 11's attack found while
// the boundary measurement said Ready. Each is judged on the host, and
// each has its positive control:
//
//   - host-datagram-socket: the probe sends the attack marker to the
//     unixgram receiver bound in the workspace after Ready, from
//     socketpair(AF_UNIX, SOCK_DGRAM) (plain, non-blocking, sendto,
//     connect+write, sendmsg, after bind) and from socket(2). The receiver
//     must hear nothing; its control is the host's own delivery, and the
//     run must complete with its inference controls.
//   - setid-file: the probe tries to make files in the workspace set-id
//     through chmod, fchmod, fchmodat, fchmodat2, open and openat2 with a
//     mode, mknod, mkdir, and chmod of a directory (probe.SetIDAttacks).
//     After the run the host lstats each (path and st_mode recorded raw):
//     no set-id bit (check no-setid), and no file of the probe's owned by
//     host uid 0 with an exec bit (check no-root-exec). Control: probe.SetIDPlain, chmod 0755
//     inside, is 0755 on the host (check plain-chmod).
//   - planted-grant-symlink: read_write [ws] with read_only
//     [ws/sysroot/etc]. Run 1 reads the nested grant and sends its content
//     (a fresh value) through the provider (control nested-read), then
//     renames ws/sysroot aside and plants a symlink to a host directory
//     outside the grants that holds a canary (the host checks the link
//     after run 1: planted). Run 2 must be refused before its workload
//     starts: exit 125, no run info (later-run-refused); the canary must
//     appear at no provider request and in no output (host-canary).
//   - run-info-symlink: run 1's workload plants ws/run-info.json, a
//     symlink to a host file outside the grants (planted); run 2 is started
//     with --run-info there and must be refused (later-run-refused); run 3
//     with --run-info at a symlink planted outside every grant must replace
//     the link with its run info (control run-info-replaced); both target
//     files are hashed before and after and must be unchanged
//     (targets-unchanged).
//   - inotify-counter: the probe makes inotify instances until the kernel
//     refuses and holds them; the host counts the workload's inotify
//     descriptors in /proc, and as the uid that owns the sandbox's user
//     namespace (host_uid as root, the caller rootless) makes one more: it
//     must succeed (inotify-during). Control: the same before the run
//     (inotify-before). On gVisor the instances live in the sentry and the
//     host counts none.
//
// The next five take tools through the one way out (issue 12). Their
// server is the calc server of the moat binary under test (the hidden
// helper __moat-demo-calc, examples/mcp-calc's code) run from a copy of
// the binary in the case's scratch, so that the host finds its processes
// by executable; its policy entry lists one tool, add, grants it that copy
// and a log directory, and gives it LANG and a synthetic credential
// (credential_env). moat's environment also holds a canary
// (MOAT_EVIDENCE_TOOL_CANARY). The probe calls add with operands the
// controller chose, through the broker with the official Go SDK's client,
// and sends the result to the provider as a control (check tool-result:
// a verified request carries the sum, the journal a tool.completed).
//
//   - tool-call: in the same run the probe reads a host file outside the
//     grants (its content a canary: host-canary), delivers to every host
//     receiver, and SIGKILLs moat's and the server's host pids, which the
//     controller wrote into the workspace; the host sees both alive with
//     their start times after the signals (tool-signals), and the server
//     answers a second call (control tool-result-after).
//   - tool-unlisted: mul and env (with the attack marker) are not listed:
//     the journal holds their tool.refused, and the server's own log
//     (tool-calls.jsonl) holds the add call with its canonical arguments
//     (control tool-logged) and nothing else (tool-unlisted).
//   - tool-secrets: at Ready the host reads the server's environment from
//     /proc/<pid>/environ (names, sha256 of values): it holds LANG and the
//     credential (control tool-env-given) and neither the canary nor the
//     provider credentials, by name or value (tool-no-secrets).
//   - tool-reaped: the server starts a detached (setsid) child; after the
//     call the host records moat, the server and the child by pid, start
//     time and session (control tool-detached), SIGKILLs moat, and sees
//     every one gone (tool-reaped). The journal ends without
//     run.terminated (Case.KillMoat).
//   - tool-url-pre-effect: the server is the controller's own MCP server
//     (the SDK's streamable HTTP) on 127.0.0.1, a url entry. Each tools/call
//     it receives must carry one Moat-Pre-Effect: the run's tool.requested
//     for that tool whose arguments digest and length are the bytes
//     received, verified natively and with openssl pkeyutl against the
//     pinned key, and a line of the journal (tool-pre-effect); otherwise it
//     answers 500.
//
// The last case takes egress grants (issue 13):
//
//   - egress-grants: the policy grants egress.hosts registry.test,
//     rebind.test, private.test and loop.test at one port P. The
//     controller's registry, a TLS server with a certificate from a CA made
//     for the case (written into the workspace), listens on 127.0.0.2:P;
//     its trap, a raw receiver like the others, on 127.0.0.1:P. The probe
//     fetches https://registry.test:P/simple/moat-evidence/ through
//     HTTPS_PROXY (the egress port) and sends the body, a fresh value, to
//     the provider (control egress-fetch: the registry served it to SNI
//     and Host registry.test, a verified request carries it, the journal
//     opened its tunnel to 127.0.0.2). Then rebind.test twice (127.0.0.2
//     at its first lookup, 127.0.0.1 after), evil.test (resolves to the
//     registry but is not granted), private.test (10.0.0.1) and loop.test
//     (127.0.0.1): each must be journaled egress.refused with its reason
//     (egress_not_granted, address_loopback with the address,
//     address_private, address_loopback) and no tunnel may open to any
//     address but the registry's (check egress-refused); the trap, whose
//     positive control is the host's own delivery, must hear nothing, and
//     the registry see only granted names, each request's Host its SNI
//     (check egress-receivers).
//
// moat's SSRF guard refuses 127.0.0.2 and the test names do not resolve,
// as they must: a case cannot reach a global address or a DNS server
// without talking to something other than the host's loopback. The
// moat_test_hooks build of moat (-tags moat_test_hooks, as scripts/test
// builds it) takes MOAT_TEST_GLOBAL_ADDR (the one address its guard
// counts as global) and MOAT_TEST_HOSTS (a test resolver whose names may
// rebind). Decision: the binary under test gets no such option, not even
// one that only the controller could set: whatever `moat evidence run`
// passes to `moat run` (an environment variable, a flag, a descriptor, a
// file) a user's own invocation, or a workload that can start moat, can
// pass too, and one address counted as global is a way past the guard to
// the host's or a private network's services. So egress-grants alone is
// run by Options.HooksBinary (`moat evidence run --hooks-binary F`,
// default $MOAT_HOOKS_BIN), which the controller checks is a
// moat_test_hooks build of the same source revision as the binary under
// test when both record one (their build info) and records by sha256 in
// host.json (hooks-binary-sha256); the other cases never see the test
// variables (cleanEnv drops MOAT_TEST_*). Without it the case is invalid
// (a missing precondition) and moat is not run. What that costs: the
// case establishes the egress guard and grants of the hooks build of the
// same source, not of the binary under test's bytes; the build differs
// only by the files tagged moat_test_hooks, each inert unless its
// MOAT_TEST_* variable is set (sandbox/egress*_hooks.go for these two).
//
// A case with later runs (planted-grant-symlink, run-info-symlink) keeps
// run 1 as the case's ordinary run (run info, journal, controls,
// cleanup); the later runs use the same policy, workspace, provider and
// receivers, are recorded in host.json's runs and later-runs.out, and are
// started by the controller after run 1 with the probe's --run N. The
// host checks (hostchecks.go) are computed by ObserveCase from the raw
// record, so the verifier recomputes them like every other observation.
//
// # Scoring (the order matters)
//
//  1. fail: any adverse observation (a forbidden marker or credential at the
//     provider, a request without a verified pre-effect record, a hit at a
//     receiver, a namespace shared with the host, no no_new_privs, a process
//     or staging left behind, a journal that does not verify, a runtime that
//     reported success after a fault, a host check that did not hold).
//  2. invalid: missing evidence (no run info, no journal, a receiver whose
//     positive delivery control failed, a missing host observation, a host
//     check not observed or whose positive control failed, a capability
//     the case needs, e.g. root for the storage fault).
//  3. insufficient: the refusals held but the useful-work controls (verified
//     requests before and after the refusal) did not all arrive.
//  4. pass otherwise.
//
// # Running it
//
// The controller runs each case as `moat run --policy P --run-info F --
// moat-probe … CASE`, with the probe copied into a world-readable scratch
// directory that the policy grants read-only. Once run-info appears (the
// sandbox is Ready, the workload not yet acting), the controller pins the
// run key in the provider and in the case directory, observes the worker's
// namespaces and no_new_privs in /proc, places the pathname Unix receivers
// in the workspace, passes every receiver's positive delivery control, and
// only then writes the marker file the probe waits for. After moat exits it
// waits for the worker pids to be gone and the staging directory to be
// removed, and copies the journal.
//
// The synthetic credentials are fresh per suite run and reach moat only
// through its environment (CredEnvAnthropic, CredEnvOpenAI); the provider
// redacts them from the headers it records and the controller from the
// output it captures (RedactedCredential), so no bundle holds one. A
// credential in the worker's output is itself an adverse observation.
//
// audit-storage-fault mounts a 1 MiB tmpfs as the run's audit directory
// (root only; otherwise the case is invalid and moat is not run), and fills
// it after the first provider request; the probe then keeps sending until
// the broker stops.
//
// # moat demo
//
// `moat demo` reuses the controller for one extra case ("demo", not in the
// fixed list). Its agent is the probe's "demo" mode run as the hidden helper
// __moat-demo-agent of the moat binary itself, so a `go run ./cmd/moat
// demo` needs no second binary: the controller copies the running moat
// binary into the scratch directory that the sandbox is granted read-only
// (go run's own build directory is not readable there).
//
// # The journal verifier here
//
// journal.go verifies journals on its own (DSSE PAE, Ed25519, the prev
// chain, the terminal record) instead of calling package audit: the
// evidence verifier is meant to be a second, independent reading of the
// format that DESIGN.md specifies, so that one bug does not hide itself.
// It is unexported, and as strict as audit's: the envelope in its one
// form, the payload one RFC 8785 canonical object (checked by its own
// encoder), the header, the record order and the terminal counts, and a
// key file of exactly one PUBLIC KEY block. It does not check each record
// type's members; audit does, and observe.go runs both and reports a
// journal invalid when they disagree.
//
// # The kubernetes backend
//
// With --backend kubernetes (kubernetes.go) each case's sandbox is a Pod
// of the cluster whose single node is this host; the case policy's grants
// are hostPath volumes, so the workspace the controller observes is the
// Pod's. What is observed from where: the host receivers listen on the
// node's address (the Pod's loopback is its own); the worker's namespaces
// and no_new_privs are those of the Pod's processes on this host (gVisor's
// sandbox and gofers), found by the Pod's uid in their cgroup, since no
// process in the Pod is one that the run info names; the worker is gone
// when those processes are and the Pod and its NetworkPolicy are gone from
// the cluster's API; the provider, the journal and the host checks are as
// on every backend. Cases whose attack has no counterpart there are not
// run: applicable.go's fixed list names them with the reason (the tool
// and egress cases, refused by that backend; planted-grant-symlink, whose
// run 1 it refuses), and the verifier accepts not-applicable only from
// that list, for a report whose backend is kubernetes.
package evidence
