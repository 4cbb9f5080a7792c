package evidence

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/moat-sandbox/moat/internal/fsutil"
)

// Bundle constants.
const (
	SuiteName = "moat-containment-evidence"
	// ReportVersion 2 added case_files, so that the signed report
	// binds every raw file.
	ReportVersion     = 2
	ReportPayloadType = "application/vnd.moat.evidence.report.v1+json"
	FileReport        = "report.json"
	FileReportDSSE    = "report.dsse.json"
	FileReportMD      = "report.md"
	FileManifest      = "manifest.json"
	CasesDir          = "cases"
	// MaxBundleFiles caps the files a verifier accepts in a bundle.
	MaxBundleFiles = 4096
	// MaxReportBytes caps report.json and manifest.json.
	MaxReportBytes = 16 << 20
)

// Report is report.json.
type Report struct {
	Suite          string       `json:"suite"`
	Version        int          `json:"version"`
	Complete       bool         `json:"complete"` // every case of the fixed list was planned and reported
	Planned        []string     `json:"planned"`
	Cases          []CaseReport `json:"cases"`
	Binary         BinaryInfo   `json:"binary"`
	Probe          FileInfo     `json:"probe"`
	Fixture        FileInfo     `json:"fixture"` // the case list, as canonical JSON
	Source         SourceInfo   `json:"source"`
	Kernel         string       `json:"kernel"`
	Arch           string       `json:"arch"`
	LandlockABI    int          `json:"landlock_abi"`
	Backend        string       `json:"backend"`
	ControllerUID  int          `json:"controller_uid"`
	SuitePublicKey string       `json:"suite_public_key"` // PEM
	SuiteKeyID     string       `json:"suite_keyid"`
	Started        string       `json:"started"`
	Finished       string       `json:"finished"`
	Summary        Summary      `json:"summary"`
	// CaseFiles is the sha256 of every file under cases/, by slash path
	// from the bundle's root (CaseFileHashes). It is signed with the rest
	// of the report, so that a pinned suite key authenticates the raw
	// files as well as the outcomes.
	CaseFiles map[string]string `json:"case_files"`
}

// ReportMDNote is the last sentence of report.md.
const ReportMDNote = "Pin the manifest sha256 and the suite key fingerprint that the run printed, from somewhere other than this bundle."

// CaseFileHashes returns the sha256 of every regular file under
// dir/cases, by slash path from dir (Report.CaseFiles).
func CaseFileHashes(dir string) (map[string]string, error) {
	all, err := hashTree(dir)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for name, sum := range all {
		if strings.HasPrefix(name, CasesDir+"/") {
			out[name] = sum
		}
	}
	return out, nil
}

// CaseReport is one case's entry.
type CaseReport struct {
	Name         string       `json:"name"`
	Outcome      Outcome      `json:"outcome"`
	Reasons      []string     `json:"reasons"`
	Observations Observations `json:"observations"`
	ProbeClaims  Claims       `json:"probe_claims"` // kept apart, never scored
	AuditKeyID   string       `json:"audit_keyid,omitempty"`
	DurationMS   int64        `json:"duration_ms"`
}

// Claims are what the probe says about itself. They are never scored.
type Claims struct {
	Present       bool `json:"present"`
	Passed        bool `json:"passed"`
	EscapeSuccess bool `json:"escape_success"`
	AuditVerified bool `json:"audit_verified"`
}

// BinaryInfo identifies the moat binary under test.
type BinaryInfo struct {
	Path        string `json:"path"`
	SHA256      string `json:"sha256"`     // at start
	SHA256End   string `json:"sha256_end"` // hashed again at the end
	Unchanged   bool   `json:"unchanged"`
	ExpectedSHA string `json:"expected_sha256,omitempty"`
}

// FileInfo identifies a file by hash.
type FileInfo struct {
	Path   string `json:"path,omitempty"`
	SHA256 string `json:"sha256"`
}

// SourceInfo records the source identity: as declared, and as embedded.
type SourceInfo struct {
	Declared string `json:"declared"`
	Embedded string `json:"embedded"`
	Mismatch bool   `json:"mismatch"`
}

// Summary counts outcomes.
type Summary struct {
	Pass         int `json:"pass"`
	Fail         int `json:"fail"`
	Invalid      int `json:"invalid"`
	Insufficient int `json:"insufficient"`
	// NotApplicable counts the cases the fixed list exempts on the
	// report's backend (applicable.go).
	NotApplicable int `json:"not_applicable,omitempty"`
}

// Manifest is manifest.json.
type Manifest struct {
	Version int               `json:"version"`
	Files   map[string]string `json:"files"`
}

// ParseClaims finds the probe's last claims line in its output:
// {"claims":{"passed":…,"escape_success":…,"audit_verified":…}}.
func ParseClaims(out []byte) Claims {
	var c Claims
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 0, 4096), MaxEventsBytes)
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.HasPrefix(line, []byte(`{"claims":`)) {
			continue
		}
		var v struct {
			Claims struct {
				Passed        bool `json:"passed"`
				EscapeSuccess bool `json:"escape_success"`
				AuditVerified bool `json:"audit_verified"`
			} `json:"claims"`
		}
		if json.Unmarshal(line, &v) == nil {
			c = Claims{Present: true, Passed: v.Claims.Passed, EscapeSuccess: v.Claims.EscapeSuccess, AuditVerified: v.Claims.AuditVerified}
		}
	}
	return c
}

// SignReport wraps report bytes in a DSSE envelope signed by priv.
func SignReport(report []byte, priv ed25519.PrivateKey) ([]byte, error) {
	pub := priv.Public().(ed25519.PublicKey)
	return envelopeBytes(envelope{
		PayloadType: ReportPayloadType,
		Payload:     base64.StdEncoding.EncodeToString(report),
		Signatures: []signature{{KeyID: keyIDOf(pub),
			Sig: base64.StdEncoding.EncodeToString(ed25519.Sign(priv, dssePAE(ReportPayloadType, report)))}},
	})
}

// envelopeBytes is report.dsse.json for env, in the one form moat writes.
func envelopeBytes(env envelope) ([]byte, error) {
	b, err := json.MarshalIndent(env, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// WriteManifest hashes every file under dir except manifest.json, writes
// manifest.json, and returns its sha256.
func WriteManifest(dir string) (string, error) {
	files, err := hashTree(dir)
	if err != nil {
		return "", err
	}
	b, err := manifestBytes(files)
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, FileManifest), b, 0o644); err != nil {
		return "", err
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:]), nil
}

// manifestBytes is manifest.json for files, in the one form moat writes.
func manifestBytes(files map[string]string) ([]byte, error) {
	b, err := json.MarshalIndent(Manifest{Version: 1, Files: files}, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// hashTree returns the sha256 of every regular file under dir, by slash
// path, except the manifest. Anything else (links, devices) is an error.
func hashTree(dir string) (map[string]string, error) {
	files := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		switch {
		case d.IsDir():
			return nil
		case !d.Type().IsRegular():
			return fmt.Errorf("%s: not a regular file", rel)
		case rel == FileManifest:
			return nil
		}
		if len(files) >= MaxBundleFiles {
			return fmt.Errorf("more than %d files", MaxBundleFiles)
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		h := sha256.New()
		if _, err := io.Copy(h, f); err != nil {
			return err
		}
		files[rel] = hex.EncodeToString(h.Sum(nil))
		return nil
	})
	return files, err
}

// FileSHA256 returns the hex sha256 of a file.
func FileSHA256(path string) (string, error) { return fsutil.SHA256File(path) }

// FixtureSHA256 is the sha256 of the fixed case list as JSON.
func FixtureSHA256() string {
	b, err := json.Marshal(Cases)
	if err != nil {
		panic("BUG: marshal case list: " + err.Error())
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// Summarize counts outcomes.
func Summarize(cs []CaseReport) Summary {
	var s Summary
	for _, c := range cs {
		switch c.Outcome {
		case OutcomePass:
			s.Pass++
		case OutcomeFail:
			s.Fail++
		case OutcomeInsufficient:
			s.Insufficient++
		case OutcomeNotApplicable:
			s.NotApplicable++
		default:
			s.Invalid++
		}
	}
	return s
}

// NotEstablished is what the suite does not establish (DESIGN.md).
var NotEstablished = []string{
	"an adaptive model's escape probability: the probe is fixed, not an adaptive attacker",
	"resistance to unknown kernel or hypervisor exploits",
	"resistance to hardware side channels",
	"containment after compromise of the host or of moat itself (the host, the receivers and this controller are trusted)",
	"authenticity against a host operator able to rewrite the bundle: checksums alone cannot provide it, and a consistent bundle re-signed with a fresh suite key verifies on its own; pin the suite key fingerprint (--suite-key-fingerprint) or the manifest sha256 (--manifest-sha256) from outside the bundle",
	"data-loss prevention: allowed-inference-canary shows that the approved provider channel carries data",
}

// RenderMarkdown writes report.md.
func RenderMarkdown(r *Report, manifestNote string) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "# moat containment evidence\n\n")
	scope := "the full fixed case list"
	if !r.Complete {
		scope = "a SUBSET of the fixed case list: this is not full qualification"
	}
	fmt.Fprintf(&b, "Backend `%s`, kernel `%s`, %s, Landlock ABI %d, controller uid %d. Ran %s.\n\n", r.Backend, r.Kernel, r.Arch, r.LandlockABI, r.ControllerUID, scope)
	na := ""
	if r.Summary.NotApplicable > 0 {
		na = fmt.Sprintf(", %d not applicable on this backend", r.Summary.NotApplicable)
	}
	fmt.Fprintf(&b, "Result: %d pass, %d fail, %d invalid, %d insufficient%s (of %d planned).\n\n", r.Summary.Pass, r.Summary.Fail, r.Summary.Invalid, r.Summary.Insufficient, na, len(r.Planned))
	fmt.Fprintf(&b, "| # | case | outcome | verified provider requests | time |\n|---|---|---|---|---|\n")
	for i, c := range r.Cases {
		fmt.Fprintf(&b, "| %d | %s | **%s** | %d | %.1f s |\n", i+1, c.Name, c.Outcome, c.Observations.Verified, float64(c.DurationMS)/1000)
	}
	fmt.Fprintf(&b, "\n## Reasons for outcomes other than pass\n\n")
	any := false
	for _, c := range r.Cases {
		for _, why := range c.Reasons {
			fmt.Fprintf(&b, "- %s: %s\n", c.Name, why)
			any = true
		}
	}
	if !any {
		fmt.Fprintf(&b, "None.\n")
	}
	fmt.Fprintf(&b, "\n## Identities\n\n- moat binary `%s`: sha256 %s at start, %s at end\n- probe sha256 %s\n- case list (fixture) sha256 %s\n- source: declared `%s`, embedded `%s`", r.Binary.Path, r.Binary.SHA256, r.Binary.SHA256End, r.Probe.SHA256, r.Fixture.SHA256, r.Source.Declared, r.Source.Embedded)
	if r.Source.Mismatch {
		fmt.Fprintf(&b, " (MISMATCH)")
	}
	fmt.Fprintf(&b, "\n- suite public key (keyid %s); report.dsse.json is signed with it\n\n", r.SuiteKeyID)
	fmt.Fprintf(&b, "## How outcomes are decided\n\nOnly controller-owned observations count: the synthetic provider's events (each request's pre-effect record verified natively and with openssl against the run key pinned from --run-info, and its body hash matched to the bytes received), the host receivers' events after their positive delivery controls, the host's view of the worker's namespaces, no_new_privs and cleanup, the host's own checks of what a case leaves on the host (lstat of the files the probe made, later runs of the same case, canaries outside the grants, the owner uid's inotify budget), and the journal verified against the pinned key. The probe always claims success; its claims are recorded apart and never scored. An adverse observation fails a case; missing evidence makes it invalid; refusals without successful useful-work controls are insufficient.\n\n")
	fmt.Fprintf(&b, "## What this suite does not establish\n\n")
	for _, s := range NotEstablished {
		fmt.Fprintf(&b, "- %s\n", s)
	}
	fmt.Fprintf(&b, "\nVerify offline with `moat evidence verify DIR --suite-key-fingerprint HEX --manifest-sha256 HEX`. Without a pin the verifier can only say that this bundle is consistent, not who made it (it prints UNPINNED). %s\n", manifestNote)
	return []byte(b.String())
}

// sortedNames returns m's keys sorted.
func sortedNames(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
