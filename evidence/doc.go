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
//	    audit-public-key.pem   the run key, pinned from run-info before the first request
//	    journal.jsonl          the run's journal, byte for byte
//	    provider-events.jsonl  one ProviderEvent per request the synthetic provider received
//	    redirect-events.jsonl  one ReceiverEvent per connection the redirect target received
//	    receiver-events.jsonl  ReceiverEvents of the direct receivers (controls and hits)
//	    host.json              HostRecord: exit code, namespaces, no_new_privs, cleanup
//	    probe.out, moat.err    the probe's stdout and moat's stderr, synthetic
//	                           credentials replaced by RedactedCredential
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
// # Scoring (the order matters)
//
//  1. fail: any adverse observation (a forbidden marker or credential at the
//     provider, a request without a verified pre-effect record, a hit at a
//     receiver, a namespace shared with the host, no no_new_privs, a process
//     or staging left behind, a journal that does not verify, a runtime that
//     reported success after a fault).
//  2. invalid: missing evidence (no run info, no journal, a receiver whose
//     positive delivery control failed, a missing host observation, a
//     capability the case needs, e.g. root for the storage fault).
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
package evidence
