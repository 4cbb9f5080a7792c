package evidence

import (
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
