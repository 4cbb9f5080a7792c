// Package e2e runs the evidence suite and the demo against the real
// sandbox. It lives apart from package evidence so that evidence's unit
// tests do not depend on the whole CLI.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/evidence"
	"github.com/moat-sandbox/moat/evidence/probe"
	"github.com/moat-sandbox/moat/internal/cli"
	"github.com/moat-sandbox/moat/internal/reexec"
	"github.com/moat-sandbox/moat/internal/testenv"
)

// TestMain lets the test binary stand in for both binaries under test, so
// that the end-to-end tests need neither the Go toolchain nor the source
// tree at run time: copied as "moat" it is moat (including its hidden
// re-exec helpers); copied as "moat-probe" it is the probe.
func TestMain(m *testing.M) {
	switch {
	case len(os.Args) > 1 && strings.HasPrefix(os.Args[1], reexec.Prefix), filepath.Base(os.Args[0]) == "moat":
		os.Exit(cli.Main(os.Args[1:]))
	case filepath.Base(os.Args[0]) == "moat-probe":
		os.Exit(probe.Main(os.Args[1:], os.Stdout))
	}
	os.Exit(m.Run())
}

// bins copies the test binary to a world-readable directory as moat and
// moat-probe.
func bins(t *testing.T) (moat, probeBin string) {
	t.Helper()
	testenv.Need(t, runtime.GOOS == "linux", "the sandbox is Linux-only")
	_, err := os.Stat("/proc/self/ns/user")
	testenv.Need(t, err == nil, "user namespaces are not available")
	_, err = exec.LookPath("openssl")
	testenv.Need(t, err == nil, "openssl is needed by the synthetic provider")
	dir, err := os.MkdirTemp("", "moat-evidence-bin-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	moat, probeBin = filepath.Join(dir, "moat"), filepath.Join(dir, "moat-probe")
	for _, p := range []string{moat, probeBin} {
		if err := copyExe(self, p); err != nil {
			t.Fatal(err)
		}
	}
	return moat, probeBin
}

func copyExe(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		return err
	}
	return out.Close()
}

func runSuite(t *testing.T, cases ...string) (string, *evidence.Result) {
	t.Helper()
	return runSuiteOn(t, "", cases...)
}

func runSuiteOn(t *testing.T, backend string, cases ...string) (string, *evidence.Result) {
	t.Helper()
	moat, probeBin := bins(t)
	out := filepath.Join(t.TempDir(), "bundle")
	var progress bytes.Buffer
	o := evidence.Options{Out: out, Cases: cases, Binary: moat, Probe: probeBin, Backend: backend, Progress: &progress}
	if len(cases) == 0 || slices.ContainsFunc(cases, func(n string) bool { c, _ := evidence.CaseByName(n); return c.Egress }) {
		o.HooksBinary = hooksBin(t)
	}
	res, err := evidence.Run(context.Background(), o)
	t.Logf("progress:\n%s", progress.String())
	if err != nil {
		t.Fatalf("suite: %v", err)
	}
	return out, res
}

// TestRootEvidenceSuite runs the whole suite against the real sandbox (the
// storage fault needs root), verifies the bundle, greps it for secrets, and
// checks that each tampering is rejected.
func TestRootEvidenceSuite(t *testing.T) {
	testenv.NeedRoot(t)
	out, res := runSuite(t)
	for _, c := range res.Report.Cases {
		if c.Outcome != evidence.OutcomePass {
			t.Errorf("%s: got %s, want pass: %v", c.Name, c.Outcome, c.Reasons)
			// What moat itself said, for the diagnosis.
			if b, err := os.ReadFile(filepath.Join(out, "cases", c.Name, "moat.err")); err == nil {
				t.Logf("%s: moat's stderr:\n%s", c.Name, b)
			}
		}
	}
	if !res.Report.Complete || len(res.Report.Cases) != len(evidence.Cases) {
		t.Fatalf("got complete=%v with %d cases, want the full list", res.Report.Complete, len(res.Report.Cases))
	}
	v := evidence.VerifyBundle(out, res.ManifestSHA256)
	if v.ExitCode() != 0 {
		t.Fatalf("verify: got exit %d: %v", v.ExitCode(), v.Problems)
	}
	checkNoSecrets(t, out, res.Credentials)

	for _, tc := range evidence.Tampers {
		t.Run("tamper/"+tc.Name, func(t *testing.T) {
			cp := filepath.Join(t.TempDir(), "bundle")
			if err := os.CopyFS(cp, os.DirFS(out)); err != nil {
				t.Fatal(err)
			}
			if err := tc.Apply(cp); err != nil {
				t.Fatal(err)
			}
			if got := evidence.VerifyBundle(cp, "").ExitCode(); got != 1 {
				t.Fatalf("got exit %d, want 1", got)
			}
		})
	}
}

// TestEvidenceSubset runs a few cases as whoever runs the tests (CI's
// unprivileged pass too): a subset verifies with exit 2, never as full
// qualification.
func TestEvidenceSubset(t *testing.T) {
	out, res := runSuite(t, "direct-network", "worker-credential-headers", "credential-reflection")
	for _, c := range res.Report.Cases {
		if c.Outcome != evidence.OutcomePass {
			t.Errorf("%s: got %s, want pass: %v", c.Name, c.Outcome, c.Reasons)
		}
	}
	if got := evidence.VerifyBundle(out, res.ManifestSHA256).ExitCode(); got != 2 {
		t.Fatalf("verify subset: got exit %d, want 2", got)
	}
	checkNoSecrets(t, out, res.Credentials)
}

// escapeCases are the cases appended for issue 11's escape classes.
func escapeCases() []string {
	var out []string
	for _, c := range evidence.Cases[20:] {
		if c.Tool == "" && !c.Egress {
			out = append(out, c.Name)
		}
	}
	return out
}

// toolCases are the cases appended for issue 12's tools.
func toolCases() []string {
	var out []string
	for _, c := range evidence.Cases {
		if c.Tool != "" {
			out = append(out, c.Name)
		}
	}
	return out
}

// hooksBin is moat built with -tags moat_test_hooks for the egress case:
// $MOAT_HOOKS_BIN (scripts/test builds it), else built here.
func hooksBin(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("MOAT_HOOKS_BIN"); p != "" {
		return p
	}
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	out := filepath.Join(dir, "moat-hooks")
	cmd := exec.Command("go", "build", "-tags", "moat_test_hooks", "-o", out, "github.com/moat-sandbox/moat/cmd/moat")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building moat with -tags moat_test_hooks (set MOAT_HOOKS_BIN): %v\n%s", err, b)
	}
	return out
}

// TestEvidenceEgressCase runs the egress case as whoever runs the tests
// (root, and CI's unprivileged pass): it passes on its host checks, the
// registry saw the granted fetch and the trap only the host's control,
// and the bundle verifies. Its control: without a hooks binary the same
// case is invalid (a missing precondition) and moat is not run.
func TestEvidenceEgressCase(t *testing.T) {
	out, res := runSuite(t, "egress-grants")
	c := res.Report.Cases[0]
	for _, h := range c.Observations.HostChecks {
		t.Logf("%s: %s: %v %s", c.Name, h.Name, h.Held, h.Detail)
	}
	if c.Outcome != evidence.OutcomePass {
		b, _ := os.ReadFile(filepath.Join(out, "cases", c.Name, "moat.err"))
		p, _ := os.ReadFile(filepath.Join(out, "cases", c.Name, "probe.out"))
		t.Fatalf("got %s, want pass: %v\nmoat's stderr:\n%s\nprobe:\n%s", c.Outcome, c.Reasons, b, p)
	}
	evs, err := os.ReadFile(filepath.Join(out, "cases", c.Name, evidence.FileEgressEvents))
	if err != nil || !strings.Contains(string(evs), `"sni":"registry.test"`) || !strings.Contains(string(evs), `"listener":"trap","kind":"control"`) {
		t.Errorf("egress events %s (%v): want the granted fetch and the trap's control", evs, err)
	}
	if got := evidence.VerifyBundle(out, res.ManifestSHA256).ExitCode(); got != 2 {
		t.Fatalf("verify subset: got exit %d, want 2", got)
	}
	checkNoSecrets(t, out, res.Credentials)

	// Without a hooks binary: invalid, moat never started.
	moat, probeBin := bins(t)
	out2 := filepath.Join(t.TempDir(), "bundle")
	res2, err := evidence.Run(context.Background(), evidence.Options{Out: out2, Cases: []string{"egress-grants"}, Binary: moat, Probe: probeBin})
	if err != nil {
		t.Fatal(err)
	}
	if c := res2.Report.Cases[0]; c.Outcome != evidence.OutcomeInvalid || c.Observations.RunInfo {
		t.Errorf("without a hooks binary: got %s (run info %v), want invalid without a run: %v", c.Outcome, c.Observations.RunInfo, c.Reasons)
	}
	// The binary under test is not a hooks build: given as one, refused.
	out3 := filepath.Join(t.TempDir(), "bundle")
	res3, err := evidence.Run(context.Background(), evidence.Options{Out: out3, Cases: []string{"egress-grants"}, Binary: moat, Probe: probeBin, HooksBinary: moat})
	if err != nil {
		t.Fatal(err)
	}
	if c := res3.Report.Cases[0]; c.Outcome != evidence.OutcomeInvalid || c.Observations.RunInfo {
		t.Errorf("a plain binary as the hooks binary: got %s, want invalid without a run: %v", c.Outcome, c.Reasons)
	}
}

// TestEvidenceToolCases runs the tool cases as whoever runs the tests
// (root, and CI's unprivileged pass): each passes on its host checks, and
// the raw records show that the host saw what the checks say.
func TestEvidenceToolCases(t *testing.T) {
	out, res := runSuite(t, toolCases()...)
	if len(res.Report.Cases) != 5 {
		t.Fatalf("got %d tool cases, want 5", len(res.Report.Cases))
	}
	for _, c := range res.Report.Cases {
		if c.Outcome != evidence.OutcomePass {
			t.Errorf("%s: got %s, want pass: %v", c.Name, c.Outcome, c.Reasons)
			if b, err := os.ReadFile(filepath.Join(out, "cases", c.Name, "moat.err")); err == nil {
				t.Logf("%s: moat's stderr:\n%s", c.Name, b)
			}
		}
		for _, h := range c.Observations.HostChecks {
			t.Logf("%s: %s: %s", c.Name, h.Name, h.Detail)
		}
		host := readHost(t, filepath.Join(out, "cases", c.Name))
		switch c.Name {
		case "tool-call":
			// The probe really signalled: its kill steps are in its output.
			b, _ := os.ReadFile(filepath.Join(out, "cases", c.Name, "probe.out"))
			if n := strings.Count(string(b), `"step":"kill-`); n != 2 {
				t.Errorf("tool-call: %d kill steps in the probe's output, want 2 (moat and the server):\n%s", n, b)
			}
		case "tool-secrets":
			if len(host.ToolEnv) == 0 {
				t.Errorf("tool-secrets: the server's environment was not read")
			}
		case "tool-reaped":
			if len(host.ToolProcs) < 6 {
				t.Errorf("tool-reaped: %d process records, want moat, the server and its child before and after", len(host.ToolProcs))
			}
		}
	}
	if got := evidence.VerifyBundle(out, res.ManifestSHA256).ExitCode(); got != 2 {
		t.Fatalf("verify subset: got exit %d, want 2", got)
	}
	checkNoSecrets(t, out, res.Credentials)
}

// TestEvidenceEscapeClasses runs the escape-class cases as whoever runs
// the tests (root, and CI's unprivileged pass: rootless): each passes on
// its host observations, and the raw records show that the attacks ran.
func TestEvidenceEscapeClasses(t *testing.T) {
	out, res := runSuite(t, escapeCases()...)
	checkEscapeCases(t, out, res, "native")
}

// TestRootEvidenceEscapeClassesGVisor is the same on gVisor.
func TestRootEvidenceEscapeClassesGVisor(t *testing.T) {
	testenv.NeedRoot(t)
	_, err := exec.LookPath("runsc")
	testenv.Need(t, err == nil, "runsc is not installed")
	out, res := runSuiteOn(t, "gvisor", escapeCases()...)
	checkEscapeCases(t, out, res, "gvisor")
}

func checkEscapeCases(t *testing.T, out string, res *evidence.Result, backend string) {
	t.Helper()
	if len(res.Report.Cases) != len(escapeCases()) {
		t.Fatalf("got %d cases, want %d", len(res.Report.Cases), len(escapeCases()))
	}
	for _, c := range res.Report.Cases {
		if c.Outcome != evidence.OutcomePass {
			t.Errorf("%s: got %s, want pass: %v", c.Name, c.Outcome, c.Reasons)
			if b, err := os.ReadFile(filepath.Join(out, "cases", c.Name, "moat.err")); err == nil {
				t.Logf("%s: moat's stderr:\n%s", c.Name, b)
			}
		}
		for _, h := range c.Observations.HostChecks {
			t.Logf("%s: %s: %s", c.Name, h.Name, h.Detail)
		}
		host := readHost(t, filepath.Join(out, "cases", c.Name))
		switch c.Name {
		case "setid-file":
			// The attack files were made (the chmod family's files exist
			// with their ordinary mode), so the host really looked.
			n := 0
			for _, p := range host.Paths {
				if p.Exists {
					n++
				}
			}
			if n < 5 {
				t.Errorf("setid-file: only %d of the probe's files exist on the host: the attack did not run", n)
			}
		case "planted-grant-symlink", "run-info-symlink":
			if len(host.Runs) == 0 || host.Runs[0].ExitCode != 125 {
				t.Errorf("%s: later runs %+v, want run 2 refused", c.Name, host.Runs)
			}
		case "inotify-counter":
			// Native: the workload's instances are host inotify descriptors,
			// counted from the host; gVisor keeps them in the sentry.
			if backend == "native" && (host.Inotify == nil || host.Inotify.WorkloadFDs < 1) {
				t.Errorf("inotify-counter: %+v, want the workload's instances counted from the host", host.Inotify)
			}
		}
	}
	if got := evidence.VerifyBundle(out, res.ManifestSHA256).ExitCode(); got != 2 {
		t.Fatalf("verify subset: got exit %d, want 2", got)
	}
	checkNoSecrets(t, out, res.Credentials)
}

func readHost(t *testing.T, dir string) evidence.HostRecord {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, evidence.FileHost))
	if err != nil {
		t.Fatal(err)
	}
	var h evidence.HostRecord
	if err := json.Unmarshal(b, &h); err != nil {
		t.Fatal(err)
	}
	return h
}

// checkNoSecrets greps every file of a bundle for private-key material and
// for the run's synthetic credentials.
func checkNoSecrets(t *testing.T, out string, creds []string) {
	t.Helper()
	if len(creds) == 0 {
		t.Fatal("no synthetic credentials reported: nothing to grep for")
	}
	needles := append([]string{"PRIVATE KEY", "sk-ant-synthetic-", "sk-synthetic-", "tool-synthetic-"}, creds...)
	files := 0
	err := filepath.WalkDir(out, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		files++
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, n := range needles {
			if bytes.Contains(b, []byte(n)) {
				t.Errorf("%s contains %q", p, n)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 10 {
		t.Fatalf("grepped only %d files", files)
	}
}

// TestDemo runs `moat demo`'s engine with the test binary as moat: the
// agent (the binary's hidden helper) does useful work, its escapes fail,
// and the journal verifies.
func TestDemo(t *testing.T) {
	moat, _ := bins(t)
	var out bytes.Buffer
	dir := filepath.Join(t.TempDir(), "demo")
	ok, err := evidence.Demo(context.Background(), evidence.DemoOptions{Out: dir, Binary: moat, Stdout: &out})
	t.Logf("demo output:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		for _, f := range []string{"moat.err", "probe.out"} {
			b, _ := os.ReadFile(filepath.Join(dir, "cases", "demo", f))
			t.Logf("%s:\n%s", f, b)
		}
		t.Fatal("demo did not pass")
	}
	for _, want := range []string{`answered: "ok hello"`, `answered: "ok bye"`, "journal: complete", "0 delivery(ies) from the sandbox", "Outcome: pass",
		"allowed: call the calc tool add over MCP           returned: ", `answered: "ok tool-result"`,
		`blocked: calling "tools/call": moat: refused: tool "mul" is not allowed`,
		"tool calls: 1 requested, 1 refused, 1 completed, 0 failed"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("demo output lacks %q", want)
		}
	}
	if strings.Contains(out.String(), "answered: \"ok\"") {
		t.Error("an escape was answered by the provider")
	}
}

// TestEvidenceCatchesLyingBackend runs cases against moat built with the
// test-only "lying" backend (MOAT_LYING_BIN, built by scripts/test with
// -tags moat_lying_backend): it reaches Ready through a real measurement
// but runs the workload unconfined. The suite must fail those cases from
// its own observations; TestEvidenceSubset is the same setup with the real
// backend, passing.
func TestEvidenceCatchesLyingBackend(t *testing.T) {
	lying := os.Getenv("MOAT_LYING_BIN")
	testenv.Need(t, lying != "", "MOAT_LYING_BIN names a moat built with -tags moat_lying_backend (scripts/test builds it)")
	_, probeBin := bins(t)
	out := filepath.Join(t.TempDir(), "bundle")
	var progress bytes.Buffer
	res, err := evidence.Run(context.Background(), evidence.Options{Out: out, Binary: lying, Probe: probeBin, Backend: "lying",
		Cases: []string{"direct-network", "allowed-inference-canary", "host-datagram-socket", "setid-file"}, Progress: &progress})
	t.Logf("progress:\n%s", progress.String())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range res.Report.Cases {
		if c.Outcome != evidence.OutcomeFail {
			t.Errorf("%s: got %s, want fail against an unconfined workload", c.Name, c.Outcome)
		}
		if c.Observations.NetNSPrivate == nil || *c.Observations.NetNSPrivate {
			t.Errorf("%s: the host did not observe the shared network namespace", c.Name)
		}
	}
	if hits := res.Report.Cases[1].Observations.ReceiverHits; hits[evidence.RecvTCP] == 0 || hits[evidence.RecvUnix] == 0 {
		t.Errorf("direct-network: receivers observed %v, want TCP and Unix deliveries", hits)
	}
	// Unconfined, the probe's datagrams reach the host socket, and its
	// set-id files land on the host: the host observes both.
	if hits := res.Report.Cases[2].Observations.ReceiverHits; hits[evidence.RecvUnixgram] == 0 {
		t.Errorf("host-datagram-socket: receivers observed %v, want unixgram deliveries", hits)
	}
	setid := false
	for _, h := range res.Report.Cases[3].Observations.HostChecks {
		if h.Name == evidence.CheckNoSetID && h.Observed && !h.Held {
			setid = true
		}
	}
	if !setid {
		t.Errorf("setid-file: host checks %+v, want the set-id files seen", res.Report.Cases[3].Observations.HostChecks)
	}
	if got := evidence.VerifyBundle(out, res.ManifestSHA256).ExitCode(); got != 2 {
		t.Errorf("a failing subset bundle still verifies as a subset: got exit %d, want 2", got)
	}
}
