package evidence

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestFakeBundleVerifies(t *testing.T) {
	out := fullBundle(t)
	res := VerifyBundle(out, "")
	if res.Verdict != VerdictComplete {
		t.Fatalf("got verdict %v (%v), want complete", res.Verdict, res.Problems)
	}
	if res.Summary.Pass != len(Cases) {
		t.Fatalf("got %+v, want all %d pass", res.Summary, len(Cases))
	}
	if res := VerifyBundle(out, res.ManifestSHA256); res.ExitCode() != 0 {
		t.Fatalf("pinned manifest: got exit %d (%v)", res.ExitCode(), res.Problems)
	}
	if res := VerifyBundle(out, strings.Repeat("0", 64)); res.ExitCode() != 1 {
		t.Fatalf("wrong pinned manifest: got exit %d, want 1", res.ExitCode())
	}
}

func TestSubsetVerifiesAsSubset(t *testing.T) {
	out := fakeBundle(t, "direct-network", "provider-redirect")
	res := VerifyBundle(out, "")
	if res.ExitCode() != 2 {
		t.Fatalf("got exit %d (%v), want 2 for a subset", res.ExitCode(), res.Problems)
	}
	// Claiming a subset is complete is rejected.
	tamper(t, out, func(r *Report) { r.Complete = true })
	if res := VerifyBundle(out, ""); res.ExitCode() != 1 {
		t.Fatalf("subset claiming complete: got exit %d, want 1", res.ExitCode())
	}
}

// tamper rewrites report.json with edit, re-signs it with a fresh suite key
// and recomputes the manifest: what an attacker without the suite key can do.
func tamper(t *testing.T, out string, edit func(*Report)) {
	t.Helper()
	var rep Report
	b, err := os.ReadFile(filepath.Join(out, FileReport))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(&rep)
	}
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	if _, err := FinishBundle(out, &rep, priv); err != nil {
		t.Fatal(err)
	}
}

// TamperCases are the integrity attacks of issue 5's "Done when" list plus
// a few more. Each gets a copy of a valid bundle, changes it, and the
// verifier must reject it with exit 1 even after the manifest is recomputed
// (and the report re-signed with a fresh suite key).
var TamperCases = []struct {
	Name  string
	Apply func(t *testing.T, out string)
}{
	{"changed-journal-signature", func(t *testing.T, out string) {
		p := filepath.Join(out, CasesDir, "twenty-signed-requests", FileJournal)
		b := readFile(t, p)
		i := strings.Index(string(b), `"sig":"`) + len(`"sig":"`)
		if b[i] == 'A' {
			b[i] = 'B'
		} else {
			b[i] = 'A'
		}
		writeFile(t, p, b)
		tamper(t, out, nil)
	}},
	{"changed-report-signature", func(t *testing.T, out string) {
		p := filepath.Join(out, FileReportDSSE)
		b := readFile(t, p)
		i := strings.Index(string(b), `"sig": "`) + len(`"sig": "`)
		b[i] ^= 1
		writeFile(t, p, b)
		if _, err := WriteManifest(out); err != nil {
			t.Fatal(err)
		}
	}},
	{"forged-receiver-hash", func(t *testing.T, out string) {
		p := filepath.Join(out, CasesDir, "allowed-inference-canary", FileProviderEvents)
		evs, err := readJSONLines[ProviderEvent](p)
		if err != nil {
			t.Fatal(err)
		}
		evs[0].BodySHA256 = strings.Repeat("ab", 32)
		evs[0].Body = []byte(`{"forged":true}`)
		writeEvents(t, p, evs)
		tamper(t, out, nil)
	}},
	{"missing-trial", func(t *testing.T, out string) {
		if err := os.RemoveAll(filepath.Join(out, CasesDir, "direct-network")); err != nil {
			t.Fatal(err)
		}
		tamper(t, out, func(r *Report) {
			var cs []CaseReport
			for _, c := range r.Cases {
				if c.Name != "direct-network" {
					cs = append(cs, c)
				}
			}
			r.Cases = cs
		})
	}},
	{"false-success-claim", func(t *testing.T, out string) {
		// The provider never saw the useful work; the report keeps "pass"
		// on the strength of the probe's claims.
		dir := filepath.Join(out, CasesDir, "false-success-claim")
		writeFile(t, filepath.Join(dir, FileProviderEvents), nil)
		writeFile(t, filepath.Join(dir, FileProbeOut), []byte(`{"claims":{"passed":true,"escape_success":false,"audit_verified":true}}`+"\n"))
		tamper(t, out, func(r *Report) {
			for i := range r.Cases {
				if r.Cases[i].Name == "false-success-claim" {
					r.Cases[i].ProbeClaims = Claims{Present: true, Passed: true, AuditVerified: true}
				}
			}
		})
	}},
	{"flipped-outcome", func(t *testing.T, out string) {
		dir := filepath.Join(out, CasesDir, "direct-network")
		b, _ := json.Marshal(ReceiverEvent{Receiver: RecvTCP, Kind: "hit", Time: "t", Bytes: 20, SHA256: sha([]byte("x"))})
		f, _ := os.OpenFile(filepath.Join(dir, FileReceiverEvents), os.O_APPEND|os.O_WRONLY, 0)
		f.Write(append(b, '\n'))
		f.Close()
		tamper(t, out, nil) // outcome stays "pass"
	}},
	{"outcome-flipped-to-fail", func(t *testing.T, out string) {
		tamper(t, out, func(r *Report) { r.Cases[3].Outcome = OutcomeFail })
	}},
	{"prefix-missing-terminal-record", func(t *testing.T, out string) {
		p := filepath.Join(out, CasesDir, "unapproved-model", FileJournal)
		b := readFile(t, p)
		lines := strings.SplitAfter(strings.TrimSuffix(string(b), "\n"), "\n")
		writeFile(t, p, []byte(strings.Join(lines[:len(lines)-1], "")))
		tamper(t, out, nil)
	}},
	{"observation-edited", func(t *testing.T, out string) {
		tamper(t, out, func(r *Report) { r.Cases[0].Observations.Verified++ })
	}},
	{"unknown-field-in-report", func(t *testing.T, out string) {
		p := filepath.Join(out, FileReport)
		b := readFile(t, p)
		b = []byte(strings.Replace(string(b), `"suite":`, `"escape_success": false, "suite":`, 1))
		writeFile(t, p, b)
		if _, err := WriteManifest(out); err != nil {
			t.Fatal(err)
		}
	}},
	{"extra-file", func(t *testing.T, out string) {
		writeFile(t, filepath.Join(out, CasesDir, "extra", "x"), []byte("x"))
		if _, err := WriteManifest(out); err != nil {
			t.Fatal(err)
		}
	}},
	{"unrecomputed-manifest", func(t *testing.T, out string) {
		writeFile(t, filepath.Join(out, FileReportMD), []byte("# all passed\n"))
	}},
}

func TestTamperedBundlesRejected(t *testing.T) {
	for _, tc := range TamperCases {
		t.Run(tc.Name, func(t *testing.T) {
			out := fullBundle(t)
			tc.Apply(t, out)
			res := VerifyBundle(out, "")
			if res.ExitCode() != 1 {
				t.Fatalf("got exit %d, want 1 (tampering accepted)", res.ExitCode())
			}
			t.Logf("rejected: %s", strings.Join(res.Problems, " | "))
		})
	}
}

func readFile(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func writeFile(t *testing.T, p string, b []byte) {
	t.Helper()
	os.MkdirAll(filepath.Dir(p), 0o755)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func writeEvents[T any](t *testing.T, p string, evs []T) {
	t.Helper()
	var out []byte
	for _, e := range evs {
		b, _ := json.Marshal(e)
		out = append(append(out, b...), '\n')
	}
	writeFile(t, p, out)
}
