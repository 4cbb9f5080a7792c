package evidence

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
)

// Verdict of an offline verification.
type Verdict int

const (
	VerdictInvalid  Verdict = iota // tampered, inconsistent or unreadable: exit 1
	VerdictSubset                  // valid, but a --case subset: exit 2
	VerdictComplete                // valid and complete: exit 0
)

// Pins are what a verifier knows from outside the bundle. Either one
// authenticates the whole bundle: the manifest lists the sha256 of every
// other file, and the signed report lists the sha256 of every case file
// and determines report.md, report.dsse.json's form and the manifest.
type Pins struct {
	// ManifestSHA256 is the sha256 of manifest.json, in hex, as the run
	// printed it.
	ManifestSHA256 string
	// SuiteKeyFingerprint is the suite key's keyid (sha256 of the raw
	// Ed25519 public key, in hex), as the run printed it.
	SuiteKeyFingerprint string
}

// VerifyResult is what VerifyBundle found.
type VerifyResult struct {
	Verdict  Verdict  `json:"-"`
	Status   string   `json:"status"`   // complete | subset | invalid
	Problems []string `json:"problems"` // why invalid; empty otherwise
	// Pinned is true when the bundle is valid and a pin was given (and
	// matched): only then is it known who made it. A valid bundle without
	// a pin is consistent, but anyone could have written and signed it.
	Pinned         bool    `json:"pinned"`
	ManifestSHA256 string  `json:"manifest_sha256"`
	SuiteKeyID     string  `json:"suite_keyid"`
	Summary        Summary `json:"summary"`
	Planned        int     `json:"planned"`
}

// ExitCode maps a verdict to `moat evidence verify`'s exit code.
func (r VerifyResult) ExitCode() int {
	switch r.Verdict {
	case VerdictComplete:
		return 0
	case VerdictSubset:
		return 2
	}
	return 1
}

// VerifyBundle is VerifyBundlePinned with at most a manifest pin.
func VerifyBundle(dir, pinnedManifestSHA256 string) VerifyResult {
	return VerifyBundlePinned(dir, Pins{ManifestSHA256: pinnedManifestSHA256})
}

// VerifyBundlePinned checks a bundle offline: the pins when given, the
// manifest, the exact set of files, the report's DSSE signature and the
// files it lists, report.md regenerated from report.json, the planned
// list, and every case's observations, claims and outcome recomputed from
// its raw files.
func VerifyBundlePinned(dir string, pins Pins) (res VerifyResult) {
	bad := func(f string, a ...any) { res.Problems = append(res.Problems, fmt.Sprintf(f, a...)) }
	defer func() {
		if len(res.Problems) > 0 {
			res.Verdict = VerdictInvalid
		}
		res.Pinned = res.Verdict != VerdictInvalid && (pins.ManifestSHA256 != "" || pins.SuiteKeyFingerprint != "")
		res.Status = [...]string{"invalid", "subset", "complete"}[res.Verdict]
		if res.Problems == nil {
			res.Problems = []string{}
		}
	}()

	files, ok := verifyManifest(dir, pins, &res, bad)
	if !ok {
		return res
	}
	if isFaultsBundle(dir) {
		verifyFaultsBundle(dir, pins, files, &res, bad)
		return res
	}

	// Report and its signature.
	rb, err := readCapped(filepath.Join(dir, FileReport), MaxReportBytes)
	if err != nil {
		bad("report: %v", err)
		return res
	}
	var rep Report
	if err := decodeStrict(rb, &rep); err != nil {
		bad("report.json: %v", err)
		return res
	}
	res.SuiteKeyID = rep.SuiteKeyID
	res.Planned = len(rep.Planned)
	if pins.SuiteKeyFingerprint != "" && !strings.EqualFold(pins.SuiteKeyFingerprint, rep.SuiteKeyID) {
		bad("suite key fingerprint %s is not the pinned %s: this report was not signed by the suite run you pinned", rep.SuiteKeyID, pins.SuiteKeyFingerprint)
	}
	verifyReportSignature(dir, rb, &rep, bad)
	verifyFileSet(files, &rep, bad)
	if md, err := readCapped(filepath.Join(dir, FileReportMD), MaxReportBytes); err != nil {
		bad("report.md: %v", err)
	} else if want := RenderMarkdown(&rep, ReportMDNote); !bytes.Equal(md, want) {
		bad("report.md differs from the one regenerated from report.json (%s)", firstDiff(md, want))
	}
	if rep.Suite != SuiteName || rep.Version != ReportVersion {
		bad("report: suite %q version %d, want %q version %d", rep.Suite, rep.Version, SuiteName, ReportVersion)
	}
	if rep.Binary.Unchanged != (rep.Binary.SHA256 != "" && rep.Binary.SHA256 == rep.Binary.SHA256End) {
		bad("report: binary unchanged=%v contradicts its hashes %s and %s", rep.Binary.Unchanged, rep.Binary.SHA256, rep.Binary.SHA256End)
	}
	if rep.Fixture.SHA256 != FixtureSHA256() {
		bad("report: case list sha256 %s differs from this verifier's %s", rep.Fixture.SHA256, FixtureSHA256())
	}

	// Planned list: a subsequence of the fixed list, without repeats.
	full := checkPlanned(rep.Planned, CaseNames(), rep.Complete, bad)
	if len(rep.Cases) != len(rep.Planned) {
		bad("%d planned cases, %d reported: a planned case is missing", len(rep.Planned), len(rep.Cases))
	}
	for i, n := range rep.Planned {
		if i < len(rep.Cases) && rep.Cases[i].Name != n {
			bad("case %d is %q, planned %q", i+1, rep.Cases[i].Name, n)
		}
	}

	// Each case, recomputed.
	for _, cr := range rep.Cases {
		c, ok := CaseByName(cr.Name)
		if !ok {
			bad("case %q is not in the fixed list", cr.Name)
			continue
		}
		if verifyNotApplicable(rep.Backend, cr, files, bad) {
			continue
		}
		verifyCase(filepath.Join(dir, CasesDir, c.Name), c, cr, bad)
	}
	if got := Summarize(rep.Cases); got != rep.Summary {
		bad("summary %+v does not match the outcomes %+v", rep.Summary, got)
	}
	res.Summary = rep.Summary
	if full {
		res.Verdict = VerdictComplete
	} else {
		res.Verdict = VerdictSubset
	}
	return res
}

// verifyManifest checks manifest.json against the pin and the files under
// dir, and returns their hashes; false when the bundle cannot be read.
func verifyManifest(dir string, pins Pins, res *VerifyResult, bad func(string, ...any)) (map[string]string, bool) {
	// Manifest.
	mb, err := readCapped(filepath.Join(dir, FileManifest), MaxReportBytes)
	if err != nil {
		bad("manifest: %v", err)
		return nil, false
	}
	ms := sha256.Sum256(mb)
	res.ManifestSHA256 = hex.EncodeToString(ms[:])
	if pins.ManifestSHA256 != "" && !strings.EqualFold(pins.ManifestSHA256, res.ManifestSHA256) {
		bad("manifest sha256 %s is not the pinned %s", res.ManifestSHA256, pins.ManifestSHA256)
	}
	var man Manifest
	if err := decodeStrict(mb, &man); err != nil {
		bad("manifest: %v", err)
		return nil, false
	}
	if man.Version != 1 {
		bad("manifest version %d, want 1", man.Version)
	}
	files, err := hashTree(dir)
	if err != nil {
		bad("bundle: %v", err)
		return nil, false
	}
	for _, name := range sortedNames(files) {
		want, ok := man.Files[name]
		switch {
		case !ok:
			bad("%s: not in the manifest", name)
		case want != files[name]:
			bad("%s: sha256 %s, manifest says %s", name, files[name], want)
		}
	}
	for _, name := range sortedNames(man.Files) {
		if _, ok := files[name]; !ok {
			bad("%s: in the manifest but missing", name)
		}
	}
	if want, err := manifestBytes(files); err == nil && !bytes.Equal(mb, want) && reflect.DeepEqual(man.Files, files) {
		bad("manifest.json: not in the form moat writes (indented JSON, sorted names, one final LF)")
	}

	return files, true
}

func verifyReportSignature(dir string, rb []byte, rep *Report, bad func(string, ...any)) {
	verifySignedBy(dir, rb, rep.SuitePublicKey, rep.SuiteKeyID, bad)
}

// verifySignedBy checks that report.dsse.json signs exactly rb with the
// suite key pubPEM, whose keyid is keyID.
func verifySignedBy(dir string, rb []byte, pubPEM, keyID string, bad func(string, ...any)) {
	pub, err := parsePublicKeyPEM([]byte(pubPEM))
	if err != nil {
		bad("report: suite public key: %v", err)
		return
	}
	if keyIDOf(pub) != keyID {
		bad("report: suite_keyid %s is not the key's %s", keyID, keyIDOf(pub))
	}
	db, err := readCapped(filepath.Join(dir, FileReportDSSE), MaxReportBytes)
	if err != nil {
		bad("report signature: %v", err)
		return
	}
	var env envelope
	if err := decodeStrict(db, &env); err != nil {
		bad("report.dsse.json: %v", err)
		return
	}
	line, err := json.Marshal(env)
	if err != nil {
		bad("report.dsse.json: %v", err)
		return
	}
	if want, err := envelopeBytes(env); err != nil || !bytes.Equal(db, want) {
		bad("report.dsse.json: not in the form moat writes (indented JSON, one final LF)")
	}
	payload, _, _, err := verifyEnvelope(line, ReportPayloadType, ed25519.PublicKey(pub))
	if err != nil {
		bad("report.dsse.json: %v", err)
		return
	}
	if !bytes.Equal(payload, rb) {
		bad("report.dsse.json signs different bytes than report.json")
	}
}

// caseFileNames are the only files a case directory holds.
var caseFileNames = []string{FilePolicy, FileRunInfo, FilePublicKey, FileJournal, FileProviderEvents,
	FileRedirectEvents, FileReceiverEvents, FileHost, FileProbeOut, FileMoatErr, FileLaterRuns,
	FileToolLog, FileToolEvents, FileEgressEvents}

// verifyFileSet checks that the bundle holds exactly the files a bundle
// holds (the manifest is checked against them separately), and that the
// case files are exactly those the signed report lists, with their hashes.
func verifyFileSet(files map[string]string, rep *Report, bad func(string, ...any)) {
	for _, name := range sortedNames(files) {
		switch name {
		case FileReport, FileReportDSSE, FileReportMD:
			continue
		}
		rest, ok := strings.CutPrefix(name, CasesDir+"/")
		cn, fn, _ := strings.Cut(rest, "/")
		if !ok || !slices.Contains(caseFileNames, fn) {
			bad("%s: not a file that a bundle holds", name)
			continue
		}
		if !slices.Contains(rep.Planned, cn) {
			bad("%s: case %q was not planned", name, cn)
		}
		switch want, listed := rep.CaseFiles[name]; {
		case !listed:
			bad("%s: not among the case files that report.json lists", name)
		case want != files[name]:
			bad("%s: sha256 %s, report.json says %s", name, files[name], want)
		}
	}
	for _, name := range sortedNames(rep.CaseFiles) {
		if _, ok := files[name]; !ok {
			bad("%s: listed in report.json but missing", name)
		}
	}
	for _, name := range []string{FileReport, FileReportDSSE, FileReportMD} {
		if _, ok := files[name]; !ok {
			bad("%s: missing", name)
		}
	}
}

// firstDiff describes where a and b first differ, by line.
func firstDiff(a, b []byte) string {
	al, bl := strings.Split(string(a), "\n"), strings.Split(string(b), "\n")
	for i := 0; i < len(al) || i < len(bl); i++ {
		var x, y string
		if i < len(al) {
			x = al[i]
		}
		if i < len(bl) {
			y = bl[i]
		}
		if x != y || i >= len(al) || i >= len(bl) {
			return fmt.Sprintf("line %d is %.80q, want %.80q", i+1, x, y)
		}
	}
	return "same lines"
}

func verifyCase(dir string, c Case, cr CaseReport, bad func(string, ...any)) {
	o, err := ObserveCase(dir, c)
	if err != nil {
		bad("%s: %v", c.Name, err)
		return
	}
	if !reflect.DeepEqual(normalize(o), normalize(cr.Observations)) {
		bad("%s: recorded observations differ from the raw files:\n  recorded   %s\n  recomputed %s", c.Name, mustJSON(cr.Observations), mustJSON(o))
	}
	outcome, reasons := Score(c, o)
	if outcome != cr.Outcome {
		bad("%s: recorded outcome %q, the raw observations give %q (%s)", c.Name, cr.Outcome, outcome, strings.Join(reasons, "; "))
	}
	if !slices.Equal(reasons, cr.Reasons) {
		bad("%s: recorded reasons differ from the recomputed ones", c.Name)
	}
	out, _ := readCapped(filepath.Join(dir, FileProbeOut), MaxEventsBytes)
	if claims := ParseClaims(out); claims != cr.ProbeClaims {
		bad("%s: recorded probe claims %+v differ from the probe's output %+v", c.Name, cr.ProbeClaims, claims)
	}
	if pemBytes, err := readCapped(filepath.Join(dir, FilePublicKey), maxSmallFile); err == nil {
		if pub, err := parsePublicKeyPEM(pemBytes); err == nil && keyIDOf(pub) != cr.AuditKeyID {
			bad("%s: audit key %s is not the recorded %s", c.Name, keyIDOf(pub), cr.AuditKeyID)
		}
		// The pinned key is the one moat announced in its run info.
		if rb, err := readCapped(filepath.Join(dir, FileRunInfo), maxSmallFile); err == nil {
			var ri runInfo
			if err := json.Unmarshal(rb, &ri); err != nil {
				bad("%s: %s: %v", c.Name, FileRunInfo, err)
			} else if pub, err := parsePublicKeyPEM([]byte(ri.PublicKeyPEM)); err != nil || keyIDOf(pub) != cr.AuditKeyID {
				bad("%s: the run info's public key is not the pinned audit key %s", c.Name, cr.AuditKeyID)
			}
		} else {
			bad("%s: audit key pinned but %s is missing", c.Name, FileRunInfo)
		}
	} else if cr.AuditKeyID != "" {
		bad("%s: audit key recorded but %s is missing", c.Name, FilePublicKey)
	}
}

// normalize round-trips observations through JSON so that nil and empty
// collections compare equal the way they are written.
func normalize(o Observations) string { return mustJSON(o) }

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return "BUG: " + err.Error()
	}
	return string(b)
}

// checkPlanned checks a report's planned list against its suite's fixed
// list: a subsequence without repeats, and complete exactly when it is
// the whole list. It reports whether the list is whole. Both suites'
// verifiers use it.
func checkPlanned(planned, fixed []string, complete bool, bad func(string, ...any)) (full bool) {
	idx := -1
	for _, n := range planned {
		i := slices.Index(fixed, n)
		if i <= idx {
			bad("planned case %q is unknown, repeated or out of order", n)
			continue
		}
		idx = i
	}
	full = slices.Equal(planned, fixed)
	if complete != full {
		bad("report says complete=%v, but %d of %d cases were planned", complete, len(planned), len(fixed))
	}
	return full
}
