package evidence

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"debug/buildinfo"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/internal/fsutil"
	"github.com/moat-sandbox/moat/internal/kubeapi/kubeopt"
)

// Controller limits.
const (
	// CaseTimeout bounds one case's moat run.
	CaseTimeout = 120 * time.Second
	// runInfoWait bounds the wait for moat's run-info file.
	runInfoWait = 60 * time.Second
	// MaxCapture caps moat's captured stdout and stderr per case.
	MaxCapture = 4 << 20
	// Env names of the synthetic credentials given to moat.
	CredEnvAnthropic = "MOAT_EVIDENCE_ANTHROPIC_KEY"
	CredEnvOpenAI    = "MOAT_EVIDENCE_OPENAI_KEY"
	// Models the case policies allow.
	ModelAnthropic = "claude-synthetic-1"
	ModelOpenAI    = "gpt-synthetic-1"
)

// Options configure a suite run.
type Options struct {
	Out     string   // bundle directory: must not exist, or be empty
	Cases   []string // a subset; empty: the whole fixed list
	Backend string
	Binary  string // the moat binary under test
	// HooksBinary is moat built with -tags moat_test_hooks from the same
	// source, which runs the egress case alone (doc.go); empty: that
	// case is invalid.
	HooksBinary          string
	ExpectedBinarySHA256 string
	Probe                string // the moat-probe binary
	ExpectedProbeSHA256  string
	SourceCommit         string
	Progress             io.Writer // progress lines; nil: discarded
	// Kubernetes describes the cluster for Backend "kubernetes".
	Kubernetes *Kubernetes
}

// HarnessError is a failure of the harness itself (exit 125).
type HarnessError struct{ Err error }

func (e *HarnessError) Error() string { return e.Err.Error() }
func (e *HarnessError) Unwrap() error { return e.Err }

func harnessf(f string, a ...any) error { return &HarnessError{Err: fmt.Errorf(f, a...)} }

// Result of a suite run.
type Result struct {
	Report         *Report
	ManifestSHA256 string
	SuitePublicKey []byte // PEM
	// Credentials are the synthetic credentials used (never written to the
	// bundle; kept here so tests can check that).
	Credentials []string
}

// suite is one run's state.
type suite struct {
	Options
	scratch string
	binDir  string
	probe   string // the probe copy the sandbox may read
	creds   map[string]string
	openssl string
	// kube is the cluster's view for the kubernetes backend (nil otherwise).
	kube kubeopt.Cluster
	// agentHelper, when set, makes the workload "<probe copy> agentHelper …"
	// (moat demo runs its own binary's hidden agent helper).
	agentHelper string
}

// Run runs the suite and writes the bundle. A non-nil error is a harness
// error; case outcomes are in the report.
func Run(ctx context.Context, o Options) (*Result, error) {
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	planned, err := plan(o.Cases)
	if err != nil {
		return nil, &HarnessError{Err: err}
	}
	s := &suite{Options: o}
	if o.Backend == "kubernetes" {
		if err := CheckKubernetes(o.Kubernetes); err != nil {
			return nil, &HarnessError{Err: err}
		}
		if s.kube, err = kubeopt.Open(o.Kubernetes); err != nil {
			return nil, &HarnessError{Err: err}
		}
	}
	started := time.Now().UTC()
	binSHA, err := FileSHA256(o.Binary)
	if err != nil {
		return nil, harnessf("moat binary: %w", err)
	}
	if o.ExpectedBinarySHA256 != "" && !strings.EqualFold(o.ExpectedBinarySHA256, binSHA) {
		return nil, harnessf("refused: moat binary %s has sha256 %s, not the expected %s", o.Binary, binSHA, o.ExpectedBinarySHA256)
	}
	probeSHA, err := FileSHA256(o.Probe)
	if err != nil {
		return nil, harnessf("probe: %w (build it with CGO_ENABLED=0 go build ./cmd/moat-probe, or pass --probe)", err)
	}
	if o.ExpectedProbeSHA256 != "" && !strings.EqualFold(o.ExpectedProbeSHA256, probeSHA) {
		return nil, harnessf("refused: probe %s has sha256 %s, not the expected %s", o.Probe, probeSHA, o.ExpectedProbeSHA256)
	}
	s.openssl, _ = exec.LookPath("openssl")
	if err := s.prepare(); err != nil {
		return nil, &HarnessError{Err: err}
	}
	defer os.RemoveAll(s.scratch)
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, harnessf("suite key: %w", err)
	}

	rep := &Report{Suite: SuiteName, Version: ReportVersion, Planned: planned,
		Complete: slices.Equal(planned, CaseNames()), Cases: []CaseReport{},
		Binary:  BinaryInfo{Path: o.Binary, SHA256: binSHA, ExpectedSHA: strings.ToLower(o.ExpectedBinarySHA256)},
		Probe:   FileInfo{Path: o.Probe, SHA256: probeSHA},
		Fixture: FileInfo{SHA256: FixtureSHA256()},
		Source:  sourceInfo(o.Binary, o.SourceCommit),
		Kernel:  kernelRelease(), Arch: runtime.GOARCH, LandlockABI: landlockABI(),
		Backend: o.Backend, ControllerUID: os.Geteuid(),
		SuitePublicKey: string(publicKeyPEM(pub)), SuiteKeyID: keyIDOf(pub),
		Started: started.Format(time.RFC3339Nano),
	}
	if rep.Backend == "" {
		rep.Backend = "native"
	}
	for i, name := range planned {
		c, _ := CaseByName(name)
		t0 := time.Now()
		if _, na := NotApplicable(rep.Backend, name); na {
			// The fixed list: not run on this backend, nothing observed.
			cr := notApplicableReport(rep.Backend, name)
			rep.Cases = append(rep.Cases, cr)
			fmt.Fprintf(o.Progress, "[%2d/%d] %s … %s\n        %s\n", i+1, len(planned), name, cr.Outcome, cr.Reasons[0])
			continue
		}
		cr, err := s.runCase(ctx, c)
		if err != nil {
			return nil, &HarnessError{Err: fmt.Errorf("case %s: %w", name, err)}
		}
		cr.DurationMS = time.Since(t0).Milliseconds()
		rep.Cases = append(rep.Cases, cr)
		fmt.Fprintf(o.Progress, "[%2d/%d] %s … %s (%.1f s)\n", i+1, len(planned), name, cr.Outcome, time.Since(t0).Seconds())
		for _, r := range cr.Reasons {
			fmt.Fprintf(o.Progress, "        %s\n", r)
		}
	}
	rep.Binary.SHA256End, _ = FileSHA256(o.Binary)
	rep.Binary.Unchanged = rep.Binary.SHA256End == binSHA
	rep.Summary = Summarize(rep.Cases)
	rep.Finished = time.Now().UTC().Format(time.RFC3339Nano)

	msha, err := FinishBundle(o.Out, rep, priv)
	if err != nil {
		return nil, &HarnessError{Err: err}
	}
	creds := []string{}
	for _, c := range s.creds {
		creds = append(creds, c)
	}
	return &Result{Report: rep, ManifestSHA256: msha, SuitePublicKey: publicKeyPEM(pub), Credentials: creds}, nil
}

// plan returns the selected cases in the fixed order.
func plan(sel []string) ([]string, error) {
	if len(sel) == 0 {
		return CaseNames(), nil
	}
	var out []string
	for _, n := range sel {
		if _, ok := CaseByName(n); !ok {
			return nil, fmt.Errorf("unknown case %q (cases: %s)", n, strings.Join(CaseNames(), ", "))
		}
	}
	for _, n := range CaseNames() {
		if slices.Contains(sel, n) {
			out = append(out, n)
		}
	}
	return out, nil
}

// systemReadOnly are the host directories each case policy grants
// read-only (those that exist).
var systemReadOnly = []string{"/usr", "/bin", "/lib", "/lib64"}

// prepare checks the output directory and builds the scratch area: a
// world-traversable directory with the probe copy and per-case workspaces.
func (s *suite) prepare() error {
	out, err := filepath.Abs(s.Out)
	if err != nil {
		return err
	}
	s.Out = out
	if ents, err := os.ReadDir(out); err == nil && len(ents) > 0 {
		return fmt.Errorf("refused: output directory %s is not empty; give a new directory", out)
	}
	for _, g := range systemReadOnly {
		if fsutil.Within(out, g) {
			return fmt.Errorf("refused: output directory %s lies inside %s, which the sandbox can see; choose a directory outside it", out, g)
		}
	}
	if err := os.MkdirAll(filepath.Join(out, CasesDir), 0o755); err != nil {
		return err
	}
	s.scratch, err = os.MkdirTemp("", "moat-evidence-")
	if err != nil {
		return err
	}
	if fsutil.Within(s.scratch, out) || fsutil.Within(out, s.scratch) {
		return fmt.Errorf("refused: output directory %s overlaps the suite's scratch %s", out, s.scratch)
	}
	os.Chmod(s.scratch, 0o755)
	s.binDir = filepath.Join(s.scratch, "bin")
	if err := os.Mkdir(s.binDir, 0o755); err != nil {
		return err
	}
	s.probe = filepath.Join(s.binDir, "moat-probe")
	if err := copyFile(s.Probe, s.probe, 0o755); err != nil {
		return fmt.Errorf("copy probe: %w", err)
	}
	s.creds = map[string]string{"anthropic": "sk-ant-synthetic-" + randHex(24), "openai": "sk-synthetic-" + randHex(24),
		credTool: "tool-synthetic-" + randHex(24)}
	return nil
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func copyFile(src, dst string, mode os.FileMode) error { return fsutil.CopyFile(src, dst, mode) }

// sourceInfo records the declared commit beside the binary's embedded one.
func sourceInfo(binary, declared string) SourceInfo {
	si := SourceInfo{Declared: declared}
	if bi, err := buildinfo.ReadFile(binary); err == nil {
		for _, kv := range bi.Settings {
			if kv.Key == "vcs.revision" {
				si.Embedded = kv.Value
			}
		}
	}
	si.Mismatch = declared != "" && si.Embedded != "" && !strings.HasPrefix(si.Embedded, declared)
	return si
}

func kernelRelease() string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}

// redact replaces every synthetic credential in b.
func (s *suite) redact(b []byte) []byte {
	for _, c := range s.creds {
		b = bytes.ReplaceAll(b, []byte(c), []byte(RedactedCredential))
	}
	return b
}

// capBuffer is a bounded output buffer.
type capBuffer struct{ bytes.Buffer }

func (c *capBuffer) Write(p []byte) (int, error) {
	if room := MaxCapture - c.Len(); room > 0 {
		if len(p) > room {
			c.Buffer.Write(p[:room])
		} else {
			c.Buffer.Write(p)
		}
	}
	return len(p), nil
}

var errNoRunInfo = errors.New("moat exited before writing its run info")

// FinishBundle writes report.json, its DSSE envelope signed by priv,
// report.md and the manifest into out, and returns the manifest's sha256.
// rep.SuitePublicKey and rep.SuiteKeyID are set from priv.
func FinishBundle(out string, rep *Report, priv ed25519.PrivateKey) (string, error) {
	pub := priv.Public().(ed25519.PublicKey)
	rep.SuitePublicKey, rep.SuiteKeyID = string(publicKeyPEM(pub)), keyIDOf(pub)
	rep.Summary = Summarize(rep.Cases)
	cf, err := CaseFileHashes(out)
	if err != nil {
		return "", fmt.Errorf("hashing the case files: %w", err)
	}
	rep.CaseFiles = cf
	rb, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return "", fmt.Errorf("report: %w", err)
	}
	rb = append(rb, '\n')
	sig, err := SignReport(rb, priv)
	if err != nil {
		return "", fmt.Errorf("sign report: %w", err)
	}
	for _, f := range []struct {
		name string
		b    []byte
	}{{FileReport, rb}, {FileReportDSSE, sig},
		{FileReportMD, RenderMarkdown(rep, ReportMDNote)}} {
		if err := os.WriteFile(filepath.Join(out, f.name), f.b, 0o644); err != nil {
			return "", fmt.Errorf("%s: %w", f.name, err)
		}
	}
	msha, err := WriteManifest(out)
	if err != nil {
		return "", fmt.Errorf("manifest: %w", err)
	}
	return msha, nil
}
