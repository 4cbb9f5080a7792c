package evidence

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
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
	if err := ResignReport(out, func(r *Report) { r.Complete = true }); err != nil {
		t.Fatal(err)
	}
	if res := VerifyBundle(out, ""); res.ExitCode() != 1 {
		t.Fatalf("subset claiming complete: got exit %d, want 1", res.ExitCode())
	}
}

func TestTamperedBundlesRejected(t *testing.T) {
	for _, tc := range Tampers {
		t.Run(tc.Name, func(t *testing.T) {
			out := fullBundle(t)
			if err := tc.Apply(out); err != nil {
				t.Fatal(err)
			}
			res := VerifyBundle(out, "")
			if res.ExitCode() != 1 {
				t.Fatalf("got exit %d, want 1 (tampering accepted)", res.ExitCode())
			}
			t.Logf("rejected: %s", strings.Join(res.Problems, " | "))
		})
	}
}

// TestForgedBundlesAndPins is the table of forged bundles: which of them
// the verifier rejects on the bundle's own state (unpinned), and that every
// one is rejected once the suite key fingerprint or the manifest sha256 is
// pinned. A bundle re-signed with a fresh key is necessarily consistent on
// its own: that is what the UNPINNED warning is for.
func TestForgedBundlesAndPins(t *testing.T) {
	reference := fullBundle(t)
	honest := VerifyBundle(reference, "")
	if honest.ExitCode() != 0 || honest.Pinned {
		t.Fatalf("honest bundle unpinned: exit %d, pinned %v: %v", honest.ExitCode(), honest.Pinned, honest.Problems)
	}
	pins := Pins{ManifestSHA256: honest.ManifestSHA256, SuiteKeyFingerprint: honest.SuiteKeyID}
	// Positive controls: the honest bundle with each pin, in either case.
	for _, p := range []Pins{pins, {ManifestSHA256: pins.ManifestSHA256}, {SuiteKeyFingerprint: strings.ToUpper(pins.SuiteKeyFingerprint)}} {
		if r := VerifyBundlePinned(reference, p); r.ExitCode() != 0 || !r.Pinned {
			t.Fatalf("honest bundle with pins %+v: exit %d, pinned %v: %v", p, r.ExitCode(), r.Pinned, r.Problems)
		}
	}

	recompute := func(out, name string, r *Report) error {
		for i := range r.Cases {
			if r.Cases[i].Name != name {
				continue
			}
			c, _ := CaseByName(name)
			o, err := ObserveCase(filepath.Join(out, CasesDir, name), c)
			if err != nil {
				return err
			}
			r.Cases[i].Observations = o
			r.Cases[i].Outcome, r.Cases[i].Reasons = Score(c, o)
		}
		return nil
	}
	type forgery struct {
		name     string
		apply    func(out string) error
		unpinned int // exit code without a pin
	}
	forgeries := []forgery{
		{"suite key swapped, bundle re-signed", func(out string) error { return ResignReport(out, nil) }, 0},
		{"raw results edited, outcome recomputed, re-signed", func(out string) error {
			p := filepath.Join(out, CasesDir, "direct-network", FileReceiverEvents)
			if err := appendLine(p, ReceiverEvent{Receiver: RecvTCP, Kind: "hit", Time: "2026-11-29T00:00:00Z", Bytes: 20, SHA256: strings.Repeat("0", 64)}); err != nil {
				return err
			}
			var rerr error
			err := ResignReport(out, func(r *Report) { rerr = recompute(out, "direct-network", r) })
			return errors.Join(rerr, err)
		}, 0},
		{"case file removed, re-signed", func(out string) error {
			if err := os.Remove(filepath.Join(out, CasesDir, "direct-network", FileMoatErr)); err != nil {
				return err
			}
			return ResignReport(out, nil)
		}, 0},
		{"planned list shortened, re-signed", func(out string) error {
			if err := os.RemoveAll(filepath.Join(out, CasesDir, "direct-network")); err != nil {
				return err
			}
			return ResignReport(out, func(r *Report) {
				r.Planned = slices.DeleteFunc(r.Planned, func(n string) bool { return n == "direct-network" })
				r.Cases = slices.DeleteFunc(r.Cases, func(c CaseReport) bool { return c.Name == "direct-network" })
				r.Complete = false
			})
		}, 2},
		{"case dropped from cases, re-signed", func(out string) error {
			return ResignReport(out, func(r *Report) { r.Cases = r.Cases[1:] })
		}, 1},
		{"report.md rewritten, re-signed", func(out string) error {
			if err := ResignReport(out, nil); err != nil {
				return err
			}
			return rewriteManifest(out, os.WriteFile(filepath.Join(out, FileReportMD), []byte("# moat containment evidence\n\nAll passed.\n"), 0o644))
		}, 1},
	}
	for _, tm := range Tampers {
		forgeries = append(forgeries, forgery{tm.Name, tm.Apply, 1})
	}
	for _, f := range forgeries {
		t.Run(f.name, func(t *testing.T) {
			out := fullBundle(t)
			if err := f.apply(out); err != nil {
				t.Fatal(err)
			}
			r := VerifyBundlePinned(out, Pins{})
			if r.ExitCode() != f.unpinned || r.Pinned {
				t.Fatalf("unpinned: exit %d, pinned %v, want exit %d: %v", r.ExitCode(), r.Pinned, f.unpinned, r.Problems)
			}
			t.Logf("unpinned: exit %d %s", r.ExitCode(), strings.Join(r.Problems, " | "))
			for _, p := range []Pins{pins, {ManifestSHA256: pins.ManifestSHA256}, {SuiteKeyFingerprint: pins.SuiteKeyFingerprint}} {
				r := VerifyBundlePinned(out, p)
				if r.ExitCode() != 1 || r.Pinned {
					t.Fatalf("pins %+v: exit %d, pinned %v; want 1: forgery accepted", p, r.ExitCode(), r.Pinned)
				}
			}
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
