package evidence

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/moat-sandbox/moat/evidence/probe"
)

// Tamper is one integrity attack on a bundle. Tampers is exported (not in a
// _test file) so that the unit tests, the end-to-end tests on a real bundle
// and anyone auditing a verifier can run the same list.
type Tamper struct {
	Name  string
	Apply func(dir string) error
}

// ResignReport rewrites report.json with edit, signs it with a fresh suite
// key and recomputes the manifest: all that an attacker without the suite
// key can do to make a bundle look consistent.
func ResignReport(dir string, edit func(*Report)) error {
	var rep Report
	b, err := os.ReadFile(filepath.Join(dir, FileReport))
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		return err
	}
	if edit != nil {
		edit(&rep)
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	_, err = FinishBundle(dir, &rep, priv)
	return err
}

func appendLine(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Tampers are the integrity attacks of issue 5's "Done when" list and a few
// more. Each leaves a bundle that VerifyBundle must reject (exit 1) even
// though its manifest was recomputed and its report re-signed.
var Tampers = []Tamper{
	{"changed-journal-signature", func(out string) error {
		p := filepath.Join(out, CasesDir, "twenty-signed-requests", FileJournal)
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		i := strings.Index(string(b), `"sig":"`)
		if i < 0 {
			return errors.New("no signature in the journal")
		}
		i += len(`"sig":"`)
		if b[i] == 'A' {
			b[i] = 'B'
		} else {
			b[i] = 'A'
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			return err
		}
		return ResignReport(out, nil)
	}},
	{"changed-report-signature", func(out string) error {
		p := filepath.Join(out, FileReportDSSE)
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		i := strings.Index(string(b), `"sig": "`)
		if i < 0 {
			return errors.New("no signature in report.dsse.json")
		}
		b[i+len(`"sig": "`)] ^= 1
		if err := os.WriteFile(p, b, 0o644); err != nil {
			return err
		}
		_, err = WriteManifest(out)
		return err
	}},
	{"forged-receiver-hash", func(out string) error {
		p := filepath.Join(out, CasesDir, "allowed-inference-canary", FileProviderEvents)
		evs, err := readJSONLines[ProviderEvent](p)
		if err != nil {
			return err
		}
		if len(evs) == 0 {
			return errors.New("no provider events")
		}
		evs[0].BodySHA256 = strings.Repeat("ab", 32)
		evs[0].Body = []byte(`{"forged":true}`)
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			return err
		}
		for _, e := range evs {
			if err := appendLine(p, e); err != nil {
				return err
			}
		}
		return ResignReport(out, nil)
	}},
	{"missing-trial", func(out string) error {
		if err := os.RemoveAll(filepath.Join(out, CasesDir, "direct-network")); err != nil {
			return err
		}
		return ResignReport(out, func(r *Report) {
			var cs []CaseReport
			for _, c := range r.Cases {
				if c.Name != "direct-network" {
					cs = append(cs, c)
				}
			}
			r.Cases = cs
		})
	}},
	{"false-success-claim", func(out string) error {
		// The provider saw nothing; the report keeps "pass" on the strength
		// of the probe's claims.
		dir := filepath.Join(out, CasesDir, "false-success-claim")
		if err := os.WriteFile(filepath.Join(dir, FileProviderEvents), nil, 0o644); err != nil {
			return err
		}
		claims := `{"claims":{"passed":true,"escape_success":false,"audit_verified":true}}` + "\n"
		if err := os.WriteFile(filepath.Join(dir, FileProbeOut), []byte(claims), 0o644); err != nil {
			return err
		}
		return ResignReport(out, func(r *Report) {
			for i := range r.Cases {
				if r.Cases[i].Name == "false-success-claim" {
					r.Cases[i].ProbeClaims = Claims{Present: true, Passed: true, AuditVerified: true}
				}
			}
		})
	}},
	{"flipped-outcome", func(out string) error {
		// The TCP receiver saw a delivery; the report still says pass.
		p := filepath.Join(out, CasesDir, "direct-network", FileReceiverEvents)
		if err := appendLine(p, ReceiverEvent{Receiver: RecvTCP, Kind: "hit", Time: "2026-11-29T00:00:00Z", Bytes: 20, SHA256: strings.Repeat("0", 64)}); err != nil {
			return err
		}
		return ResignReport(out, nil)
	}},
	{"outcome-flipped-to-fail", func(out string) error {
		return ResignReport(out, func(r *Report) { r.Cases[3].Outcome = OutcomeFail })
	}},
	{"prefix-missing-terminal-record", func(out string) error {
		p := filepath.Join(out, CasesDir, "unapproved-model", FileJournal)
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		lines := strings.SplitAfter(strings.TrimSuffix(string(b), "\n"), "\n")
		if len(lines) < 2 {
			return fmt.Errorf("journal has %d lines", len(lines))
		}
		if err := os.WriteFile(p, []byte(strings.Join(lines[:len(lines)-1], "")), 0o644); err != nil {
			return err
		}
		return ResignReport(out, nil)
	}},
	{"run-info-key-swapped", func(out string) error {
		// Another run's key in the run info than the one the journal is
		// checked against.
		a, err := os.ReadFile(filepath.Join(out, CasesDir, "direct-network", FileRunInfo))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(out, CasesDir, "malformed-json", FileRunInfo), a, 0o644); err != nil {
			return err
		}
		return ResignReport(out, nil)
	}},
	{"observation-edited", func(out string) error {
		return ResignReport(out, func(r *Report) { r.Cases[0].Observations.Verified++ })
	}},
	{"unknown-field-in-report", func(out string) error {
		p := filepath.Join(out, FileReport)
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		b = []byte(strings.Replace(string(b), `"suite":`, `"escape_success": false, "suite":`, 1))
		if err := os.WriteFile(p, b, 0o644); err != nil {
			return err
		}
		_, err = WriteManifest(out)
		return err
	}},
	{"extra-case-directory", func(out string) error {
		if err := os.MkdirAll(filepath.Join(out, CasesDir, "extra"), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(out, CasesDir, "extra", "x"), []byte("x"), 0o644); err != nil {
			return err
		}
		_, err := WriteManifest(out)
		return err
	}},
	{"manifest-not-recomputed", func(out string) error {
		return os.WriteFile(filepath.Join(out, FileReportMD), []byte("# all passed\n"), 0o644)
	}},
	{"report-md-rewritten", func(out string) error {
		p := filepath.Join(out, FileReportMD)
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		b = []byte(strings.Replace(string(b), "Result: ", "Result (independently audited): ", 1))
		return rewriteManifest(out, os.WriteFile(p, b, 0o644))
	}},
	{"file-added", func(out string) error {
		return rewriteManifest(out, os.WriteFile(filepath.Join(out, "AUDITOR-NOTES.txt"), []byte("all cases reviewed: pass\n"), 0o644))
	}},
	{"file-added-to-case-and-report", func(out string) error {
		// Even listed in a re-signed report, a case holds only its files.
		if err := os.WriteFile(filepath.Join(out, CasesDir, "direct-network", "notes.txt"), []byte("x"), 0o644); err != nil {
			return err
		}
		return ResignReport(out, nil)
	}},
	{"file-removed", func(out string) error {
		return rewriteManifest(out, os.Remove(filepath.Join(out, CasesDir, "direct-network", FileMoatErr)))
	}},
	{"case-file-edited", func(out string) error {
		// moat.err is not scored; the signed report lists its hash.
		return rewriteManifest(out, os.WriteFile(filepath.Join(out, CasesDir, "direct-network", FileMoatErr), []byte("nothing to see\n"), 0o644))
	}},
	{"report-signed-by-another-key", func(out string) error {
		// report.json names key A; report.dsse.json is signed by key B.
		b, err := os.ReadFile(filepath.Join(out, FileReport))
		if err != nil {
			return err
		}
		_, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return err
		}
		sig, err := SignReport(b, priv)
		if err != nil {
			return err
		}
		return rewriteManifest(out, os.WriteFile(filepath.Join(out, FileReportDSSE), sig, 0o644))
	}},
	{"setid-bit-hidden", func(out string) error {
		// The host saw a set-id file; the report still says pass.
		return editHostRecord(filepath.Join(out, CasesDir, "setid-file"), func(h *HostRecord) error {
			for i := range h.Paths {
				if h.Paths[i].When == WhenAfter && h.Paths[i].Path == wsPath(probe.SetIDAttacks[0]) {
					h.Paths[i] = PathRecord{When: WhenAfter, Path: h.Paths[i].Path, Exists: true, Mode: modeRegular | 0o4755, UID: workloadUID, GID: workloadUID}
					return nil
				}
			}
			return errors.New("no host record of " + probe.SetIDAttacks[0])
		}, out)
	}},
	{"planted-run-got-ready", func(out string) error {
		// Run 2 started through the planted symlink; the report still says pass.
		return editHostRecord(filepath.Join(out, CasesDir, "planted-grant-symlink"), func(h *HostRecord) error {
			if len(h.Runs) == 0 {
				return errors.New("no later run recorded")
			}
			h.Runs[0].RunInfo, h.Runs[0].ExitCode = true, 0
			return nil
		}, out)
	}},
	{"unlisted-tool-hidden", func(out string) error {
		// The server's own log shows an unlisted call; the report still says pass.
		if err := appendLine(filepath.Join(out, CasesDir, "tool-unlisted", FileToolLog), ToolLogLine{Tool: toolUnlistedMul, Arguments: `{"a":1,"b":2}`}); err != nil {
			return err
		}
		return ResignReport(out, nil)
	}},
	{"tool-call-without-pre-effect", func(out string) error {
		// A tools/call reached the url server without its record; the report still says pass.
		if err := appendLine(filepath.Join(out, CasesDir, "tool-url-pre-effect", FileToolEvents), ToolEvent{N: 99, Method: "tools/call", Tool: toolAllowed, Arguments: "{}"}); err != nil {
			return err
		}
		return ResignReport(out, nil)
	}},
	{"egress-trap-hit-hidden", func(out string) error {
		// The egress trap heard the rebinding name's second lookup; the report still says pass.
		if err := appendLine(filepath.Join(out, CasesDir, "egress-grants", FileEgressEvents), EgressEvent{N: 99, Listener: EgressTrap, Kind: "hit", Bytes: 5, SHA256: sha256Hex([]byte("hello"))}); err != nil {
			return err
		}
		return ResignReport(out, nil)
	}},
	{"egress-ungranted-at-registry-hidden", func(out string) error {
		// The registry saw the ungranted name; the report still says pass.
		if err := appendLine(filepath.Join(out, CasesDir, "egress-grants", FileEgressEvents), EgressEvent{N: 99, Listener: EgressRegistry, Kind: EgressKindHello, SNI: probe.EgressUngranted}); err != nil {
			return err
		}
		return ResignReport(out, nil)
	}},
	{"report-dsse-reformatted", func(out string) error {
		p := filepath.Join(out, FileReportDSSE)
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return rewriteManifest(out, os.WriteFile(p, append([]byte(" "), b...), 0o644))
	}},
}

// editHostRecord rewrites a case's host.json with edit and re-signs the
// bundle's report unchanged.
func editHostRecord(dir string, edit func(h *HostRecord) error, out string) error {
	p := filepath.Join(dir, FileHost)
	var h HostRecord
	if err := readStrictJSON(p, &h); err != nil {
		return err
	}
	if err := edit(&h); err != nil {
		return err
	}
	b, err := json.MarshalIndent(h, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(p, append(b, '\n'), 0o644); err != nil {
		return err
	}
	return ResignReport(out, nil)
}

// rewriteManifest recomputes the manifest after a tamper (err is the
// tamper's own error, returned first).
func rewriteManifest(out string, err error) error {
	if err != nil {
		return err
	}
	_, err = WriteManifest(out)
	return err
}
