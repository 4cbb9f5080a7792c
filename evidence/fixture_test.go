package evidence

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/confirmation"
	"github.com/moat-sandbox/moat/evidence/probe"
)

// fakeJournal writes a journal in DESIGN.md's format with a test key: the
// verifier under test must accept what a correct writer produces.
type fakeJournal struct {
	priv ed25519.PrivateKey
	run  string
	seq  int
	prev string
	data []byte
	// counts are run.terminated's counts of the records so far, which
	// add fills in unless the fields give them.
	counts map[string]int
	// toolCounts are counts.tools, nil until a tool record is added.
	toolCounts map[string]int
}

func newFakeJournal(t *testing.T, run string) *fakeJournal {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return &fakeJournal{priv: priv, run: run, prev: zeroPrev}
}

func (j *fakeJournal) pub() ed25519.PublicKey { return j.priv.Public().(ed25519.PublicKey) }

func (j *fakeJournal) add(typ string, fields map[string]any) string {
	j.seq++
	m := map[string]any{"v": 1, "run": j.run, "seq": j.seq, "prev": j.prev, "time": "2026-11-29T08:00:00Z", "type": typ}
	if j.counts == nil {
		j.counts = map[string]int{"requested": 0, "completed": 0, "refused": 0, "failed": 0, "processes": 0}
	}
	if typ == "run.terminated" {
		c := map[string]any{}
		for k, v := range j.counts {
			c[k] = v
		}
		if j.toolCounts != nil {
			c["tools"] = j.toolCounts
		}
		m["counts"] = c
	}
	for name, counted := range countedTypes {
		if typ == counted {
			j.counts[name]++
		}
	}
	for name, counted := range toolCountedTypes {
		if typ == counted {
			if j.toolCounts == nil {
				j.toolCounts = map[string]int{"requested": 0, "completed": 0, "refused": 0, "failed": 0}
			}
			j.toolCounts[name]++
		}
	}
	for k, v := range fields {
		m[k] = v
	}
	payload, _ := json.Marshal(m)
	env := envelope{PayloadType: auditPayloadType, Payload: base64.StdEncoding.EncodeToString(payload),
		Signatures: []signature{{KeyID: keyIDOf(j.pub()), Sig: base64.StdEncoding.EncodeToString(ed25519.Sign(j.priv, dssePAE(auditPayloadType, payload)))}}}
	line, _ := json.Marshal(env)
	h := sha256.Sum256(line)
	j.prev = hex.EncodeToString(h[:])
	j.data = append(append(j.data, line...), '\n')
	return string(line)
}

func sha(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

// writeFakeCase writes raw files for c as a correct runtime and a clean
// sandbox would produce them: every control arrives verified, nothing else.
func writeFakeCase(t *testing.T, dir string, c Case) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	run := "20261129T080000Z-" + c.Name
	w, err := audit.Create(filepath.Join(t.TempDir(), "audit"), run)
	if err != nil {
		t.Fatal(err)
	}
	app := func(r audit.Record) string {
		line, err := w.Append(r)
		if err != nil {
			t.Fatal(err)
		}
		return string(line)
	}
	app(audit.RunStarted{Backend: "native", PolicySHA256: sha(nil), BinarySHA256: sha(nil), PublicKey: string(w.PublicKeyPEM())})
	app(audit.BoundaryConfirmed{Ready: true})
	var events []byte
	n := 0
	labels := append([]string{}, c.Controls...)
	if c.Canary {
		labels = append(labels, "canary")
	}
	for _, l := range labels {
		body := []byte(`{"model":"claude-synthetic-1","messages":[{"role":"user","content":"` + ControlPrefix + l + `"}]}`)
		if l == "canary" {
			body = []byte(`{"messages":[{"content":"` + ControlPrefix + "canary data=" + Canary + `"}]}`)
		}
		if l == "nested-read" {
			body = []byte(`{"messages":[{"content":"` + ControlPrefix + "nested-read data=" + fakeGranted + `"}]}`)
		}
		if l == "tool-result" {
			body = []byte(`{"messages":[{"content":"` + ControlPrefix + "tool-result data=" + fakeToolSum + `"}]}`)
		}
		if l == "egress-fetch" {
			body = []byte(`{"messages":[{"content":"` + ControlPrefix + "egress-fetch data=" + fakeEgressBody + `"}]}`)
		}
		n++
		id := "req-" + l
		line := app(audit.InferenceRequested{RequestID: id, Provider: "anthropic", API: "anthropic-messages", Endpoint: "/v1/messages",
			Model: ModelAnthropic, BodySHA256: sha(body), ReservedTokens: 64,
			Attribution: audit.Attribution{Status: confirmation.AttributionUnavailable, Reason: "test"}})
		app(audit.InferenceCompleted{RequestID: id, Status: 200, ResponseSHA256: sha(nil)})
		ev := ProviderEvent{N: n, Time: time.Now().UTC().Format(time.RFC3339Nano), Method: "POST", Path: "/v1/messages",
			Headers: map[string]string{"moat-pre-effect": base64.StdEncoding.EncodeToString([]byte(line)), "x-api-key": RedactedCredential},
			Body:    body, BodySHA256: sha(body), PreEffect: line, NativeVerified: true, OpenSSLVerified: true, CredentialOK: true, Response: "normal"}
		b, _ := json.Marshal(ev)
		events = append(append(events, b...), '\n')
	}
	toolFiles := map[string][]byte{}
	for name, b := range fakeToolCase(c, app) {
		toolFiles[name] = b
	}
	for name, b := range fakeEgressCase(c, app) {
		toolFiles[name] = b
	}
	host := HostRecord{RunInfo: true, ExitCode: 0, RunID: run, HostPID: 100, WorkloadPID: 101,
		NetNSPrivate: boolp(true), MntNSPrivate: boolp(true), NoNewPrivs: boolp(true), WorkerGone: boolp(true), StagingRemoved: boolp(true),
		Missing: []string{}, Notes: []string{}}
	switch {
	case c.StorageFault:
		host.ExitCode, host.FaultInjected = 125, true
	case c.Cancel:
		host.ExitCode = 125
		app(audit.RunTerminated{Reason: audit.ReasonCancelled, ExitCode: 125})
	case c.KillMoat:
		host.ExitCode = -1 // SIGKILLed: no run.terminated
	default:
		app(audit.RunTerminated{Reason: audit.ReasonCompleted, ExitCode: 0})
	}
	later := fakeHostCase(c, &host)
	w.Close()
	jdata, err := os.ReadFile(w.JournalPath())
	if err != nil {
		t.Fatal(err)
	}
	var recv []byte
	for _, r := range DirectReceivers {
		b, _ := json.Marshal(ReceiverEvent{Receiver: r, Kind: "control", Time: "t", Bytes: 40, SHA256: sha([]byte(r))})
		recv = append(append(recv, b...), '\n')
	}
	hb, _ := json.Marshal(host)
	files := map[string][]byte{
		FileJournal: jdata, FilePublicKey: w.PublicKeyPEM(), FileProviderEvents: events, FileReceiverEvents: recv,
		FileHost: hb, FileProbeOut: []byte(`{"step":"control:before","status":200}` + "\n" + `{"claims":{"passed":true,"escape_success":true,"audit_verified":true}}` + "\n"),
		FileMoatErr: nil, FilePolicy: []byte("version: 1\n"), FileRunInfo: runInfoJSON(run, w.PublicKeyPEM()),
	}
	if later != nil {
		files[FileLaterRuns] = later
	}
	for name, b := range toolFiles {
		files[name] = b
	}
	if c.Provider == ProviderRedirect {
		b, _ := json.Marshal(ReceiverEvent{Receiver: RecvRedirect, Kind: "control", Time: "t", Bytes: 40, SHA256: sha(nil)})
		files[FileRedirectEvents] = append(b, '\n')
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// fakeBundle writes a complete, passing bundle for the named cases (all when
// none) the way the controller assembles one, and returns its directory.
func fakeBundle(t *testing.T, names ...string) string {
	t.Helper()
	out := t.TempDir()
	planned, err := plan(names)
	if err != nil {
		t.Fatal(err)
	}
	rep := &Report{Suite: SuiteName, Version: ReportVersion, Planned: planned, Complete: len(names) == 0,
		Fixture: FileInfo{SHA256: FixtureSHA256()}, Backend: "native", Kernel: "test", Arch: "amd64",
		Binary: BinaryInfo{Path: "/moat", SHA256: sha([]byte("moat")), SHA256End: sha([]byte("moat")), Unchanged: true}}
	for _, n := range planned {
		c, _ := CaseByName(n)
		dir := filepath.Join(out, CasesDir, n)
		writeFakeCase(t, dir, c)
		rep.Cases = append(rep.Cases, mustCaseReport(t, dir, c))
	}
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	if _, err := FinishBundle(out, rep, priv); err != nil {
		t.Fatal(err)
	}
	return out
}

func mustCaseReport(t *testing.T, dir string, c Case) CaseReport {
	t.Helper()
	o, err := ObserveCase(dir, c)
	if err != nil {
		t.Fatal(err)
	}
	outcome, reasons := Score(c, o)
	out, _ := os.ReadFile(filepath.Join(dir, FileProbeOut))
	pb, _ := os.ReadFile(filepath.Join(dir, FilePublicKey))
	pub, _ := parsePublicKeyPEM(pb)
	return CaseReport{Name: c.Name, Outcome: outcome, Reasons: reasons, Observations: o, ProbeClaims: ParseClaims(out), AuditKeyID: keyIDOf(pub)}
}

var (
	templateMu  sync.Mutex
	templateDir string
)

// TestMain removes the shared template bundle.
func TestMain(m *testing.M) {
	code := m.Run()
	if templateDir != "" {
		os.RemoveAll(filepath.Dir(templateDir))
	}
	os.Exit(code)
}

// fullBundle returns a fresh copy of a complete passing bundle, built once.
func fullBundle(t *testing.T) string {
	t.Helper()
	templateMu.Lock()
	if templateDir == "" {
		parent, err := os.MkdirTemp("", "moat-evidence-template-")
		if err != nil {
			t.Fatal(err)
		}
		src := fakeBundle(t)
		templateDir = filepath.Join(parent, "bundle")
		if err := os.CopyFS(templateDir, os.DirFS(src)); err != nil {
			t.Fatal(err)
		}
	}
	templateMu.Unlock()
	out := filepath.Join(t.TempDir(), "bundle")
	if err := os.CopyFS(out, os.DirFS(templateDir)); err != nil {
		t.Fatal(err)
	}
	return out
}

// fakeGranted is the nested grant's content in fake planted-grant-symlink cases.
const fakeGranted = "granted-0123456789abcdef"

// fakeHostCase adds the raw host observations of a clean run of a case
// with host checks, and returns later-runs.out (nil if none).
func fakeHostCase(c Case, h *HostRecord) []byte {
	const target = "/tmp/moat-evidence-x/case/outside"
	reg := func(when, path string, mode uint32, sum string) PathRecord {
		return PathRecord{When: when, Path: path, Exists: true, Mode: modeRegular | mode, UID: 65534, GID: 65534, SHA256: sum}
	}
	switch c.Name {
	case "setid-file":
		for _, n := range probe.SetIDAttacks {
			p := PathRecord{When: WhenAfter, Path: wsPath(n)}
			if strings.Contains(n, "chmod") {
				p = reg(WhenAfter, wsPath(n), 0o644, sha([]byte(n)))
			}
			h.Paths = append(h.Paths, p)
		}
		h.Paths = append(h.Paths, reg(WhenAfter, wsPath(probe.SetIDPlain), 0o755, sha(nil)))
	case "planted-grant-symlink":
		h.Values = map[string]string{ValueCanary: "MOAT-HOST-CANARY-fake", ValueGranted: fakeGranted, ValuePlanted: wsPath(probe.NestedGrantParent), ValueTarget: target}
		h.Paths = []PathRecord{{When: WhenRun1, Path: wsPath(probe.NestedGrantParent), Exists: true, Mode: modeSymlink | 0o777, UID: 65534, GID: 65534, Link: target}}
		h.Runs = []RunRecord{{Run: 2, RunInfoPath: "run-info-2.json", ExitCode: 125}}
		return []byte("== run 2: probe stdout ==\n== run 2: moat stderr ==\nmoat: refused: a symlink in the grant path\n")
	case "run-info-symlink":
		h.Values = map[string]string{ValuePlanted: wsPath(probe.PlantedRunInfo), ValueTarget: target + "/ri-target-1", ValueRILink: "planted/run-info.json"}
		for _, w := range []string{WhenBefore, WhenAfter} {
			h.Paths = append(h.Paths, reg(w, "outside/ri-target-1", 0o644, sha([]byte(hostFileText))), reg(w, "outside/ri-target-2", 0o644, sha([]byte(hostFileText))))
		}
		h.Paths = append(h.Paths, PathRecord{When: WhenRun1, Path: wsPath(probe.PlantedRunInfo), Exists: true, Mode: modeSymlink | 0o777, UID: 65534, GID: 65534, Link: target + "/ri-target-1"},
			reg(WhenAfter, "planted/run-info.json", 0o600, sha([]byte("{}"))))
		h.Runs = []RunRecord{{Run: 2, RunInfoPath: "workspace/run-info.json", ExitCode: 125},
			{Run: 3, RunInfoPath: "planted/run-info.json", RunInfo: true, RunID: "20261129T080000Z-3", ExitCode: 0}}
		return []byte("== run 2: probe stdout ==\n== run 2: moat stderr ==\n== run 3: probe stdout ==\n== run 3: moat stderr ==\n")
	case "inotify-counter":
		h.Inotify = &InotifyRecord{Owner: 65534, Before: "ok", Held: true, During: "ok", WorkloadFDs: 16}
	}
	if c.Egress {
		h.Values = map[string]string{ValueEgressBody: fakeEgressBody, ValueEgressPort: fakeEgressPort, ValueHooksSHA: sha(nil)}
	}
	if c.Tool != "" {
		h.Values = map[string]string{ValueToolArgs: fakeToolArgs, ValueToolSum: fakeToolSum,
			ValueToolEnvSHA: "LANG=" + sha([]byte(toolServerLang)) + "," + ToolCredEnv + "=" + sha([]byte("tool-cred")),
			ValueSecretsSHA: ToolCanaryEnv + "=" + sha([]byte("canary")) + "," + CredEnvAnthropic + "=" + sha([]byte("a")) + "," + CredEnvOpenAI + "=" + sha([]byte("o"))}
	}
	proc := func(when, role string, pid, sid int, alive bool) ProcRecord {
		return ProcRecord{When: when, Role: role, PID: pid, Start: "123", SID: sid, Alive: alive}
	}
	switch c.Name {
	case "tool-call":
		h.Values[ValueCanary] = "MOAT-HOST-CANARY-fake"
		for _, w := range []string{procWhenReady, procWhenSignaled} {
			h.ToolProcs = append(h.ToolProcs, proc(w, "moat", 90, 1, true), proc(w, "server", 200, 200, true))
		}
	case "tool-secrets":
		h.ToolEnv = map[string]string{"LANG": sha([]byte(toolServerLang)), ToolCredEnv: sha([]byte("tool-cred"))}
	case "tool-reaped":
		for _, w := range []string{procWhenBefore, procWhenAfter} {
			alive := w == procWhenBefore
			h.ToolProcs = append(h.ToolProcs, proc(w, "moat", 90, 1, alive), proc(w, "server", 200, 200, alive), proc(w, "server", 201, 201, alive))
		}
	}
	return nil
}

// The add call of the fake tool cases.
const (
	fakeToolArgs = `{"a":12,"b":30}`
	fakeToolSum  = "42"
)

// fakeToolCase journals a clean tool case's records with app and returns
// its tool raw files (the server's log, or the url server's events).
func fakeToolCase(c Case, app func(audit.Record) string) map[string][]byte {
	if c.Tool == "" {
		return nil
	}
	attr := audit.Attribution{Status: confirmation.AttributionUnavailable, Reason: "test"}
	line := app(audit.ToolRequested{CallID: "moatcall_000000000000000000000001", Server: probe.ToolServer, Tool: toolAllowed,
		ArgumentsSHA256: sha([]byte(fakeToolArgs)), ArgumentsBytes: int64(len(fakeToolArgs)), Attribution: attr})
	app(audit.ToolCompleted{CallID: "moatcall_000000000000000000000001", ResultSHA256: sha(nil)})
	if c.Name == "tool-unlisted" {
		for i, tool := range []string{toolUnlistedMul, toolUnlistedEnv} {
			app(audit.ToolRefused{CallID: fmt.Sprintf("moatcall_00000000000000000000001%d", i), Server: probe.ToolServer, Method: "tools/call", Tool: tool,
				Reason: "tool_not_allowed", Detail: "not allowed", Attribution: attr})
		}
	}
	if c.Tool == ToolURL {
		b, _ := json.Marshal(ToolEvent{N: 1, Time: "t", Method: "tools/call", Tool: toolAllowed, Arguments: fakeToolArgs,
			PreEffect: line, PreEffectCount: 1, NativeVerified: true, OpenSSLVerified: true})
		return map[string][]byte{FileToolEvents: append(b, '\n')}
	}
	b, _ := json.Marshal(ToolLogLine{Tool: toolAllowed, Arguments: fakeToolArgs})
	return map[string][]byte{FileToolLog: append(b, '\n')}
}

func runInfoJSON(run string, pem []byte) []byte {
	b, _ := json.Marshal(map[string]any{"run_id": run, "public_key_pem": string(pem), "host_pid": 100, "workload_pid": 101, "backend": "native"})
	return b
}

// The fake egress case's registry.
const (
	fakeEgressBody = "moat-evidence-registry-fake"
	fakeEgressPort = "4443"
)

// fakeEgressCase journals a clean egress case's records with app, sets
// nothing else, and returns its egress-events.jsonl.
func fakeEgressCase(c Case, app func(audit.Record) string) map[string][]byte {
	out := map[string][]byte{}
	if !c.Egress {
		return out
	}
	attr := audit.Attribution{Status: confirmation.AttributionUnavailable, Reason: "test"}
	for i, h := range []string{probe.EgressGranted, probe.EgressRebind} {
		id := fmt.Sprintf("moattun_00000000000000000000000%d", i+1)
		app(audit.EgressOpened{TunnelID: id, Host: h, Port: 4443, Grant: h + ":4443", Address: egressRegistryAddr, SNI: h, Attribution: attr})
		app(audit.EgressClosed{TunnelID: id, BytesToHost: 100, BytesToWorkload: 200, DurationMS: 1, Reason: "closed"})
	}
	for i, r := range egressRefusals {
		app(audit.EgressRefused{TunnelID: fmt.Sprintf("moattun_00000000000000000000001%d", i), Host: r.host, Port: 4443, Address: r.address,
			Reason: r.reason, Detail: "refused", Attribution: attr})
	}
	var b []byte
	for i, ev := range []EgressEvent{
		{Listener: EgressTrap, Kind: "control", Bytes: 40, SHA256: sha(nil)},
		{Listener: EgressRegistry, Kind: EgressKindHello, SNI: probe.EgressGranted},
		{Listener: EgressRegistry, Kind: EgressKindRequest, SNI: probe.EgressGranted, Host: probe.EgressGranted + ":" + fakeEgressPort, Path: probe.EgressPath},
		{Listener: EgressRegistry, Kind: EgressKindHello, SNI: probe.EgressRebind},
		{Listener: EgressRegistry, Kind: EgressKindRequest, SNI: probe.EgressRebind, Host: probe.EgressRebind + ":" + fakeEgressPort, Path: probe.EgressPath},
	} {
		ev.N, ev.Time = i+1, "t"
		l, _ := json.Marshal(ev)
		b = append(append(b, l...), '\n')
	}
	out[FileEgressEvents] = b
	return out
}
