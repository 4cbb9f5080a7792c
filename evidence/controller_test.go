package evidence

import (
	"context"
	"errors"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

func fakeBinaries(t *testing.T) (bin, probeBin string) {
	dir := t.TempDir()
	bin, probeBin = filepath.Join(dir, "moat"), filepath.Join(dir, "moat-probe")
	writeFile(t, bin, []byte("#!/bin/false\n"))
	writeFile(t, probeBin, []byte("probe\n"))
	return bin, probeBin
}

func TestRunRefusals(t *testing.T) {
	bin, probeBin := fakeBinaries(t)
	nonEmpty := t.TempDir()
	writeFile(t, filepath.Join(nonEmpty, "x"), []byte("x"))
	tests := []struct {
		name string
		o    Options
		want string
	}{
		{"binary hash mismatch", Options{Out: filepath.Join(t.TempDir(), "o"), Binary: bin, Probe: probeBin, ExpectedBinarySHA256: strings.Repeat("0", 64)}, "not the expected"},
		{"probe hash mismatch", Options{Out: filepath.Join(t.TempDir(), "o"), Binary: bin, Probe: probeBin, ExpectedProbeSHA256: strings.Repeat("0", 64)}, "not the expected"},
		{"probe missing", Options{Out: filepath.Join(t.TempDir(), "o"), Binary: bin, Probe: filepath.Join(t.TempDir(), "none")}, "moat-probe"},
		{"unknown case", Options{Out: filepath.Join(t.TempDir(), "o"), Binary: bin, Probe: probeBin, Cases: []string{"nope"}}, "unknown case"},
		{"output not empty", Options{Out: nonEmpty, Binary: bin, Probe: probeBin}, "not empty"},
		{"output inside a sandbox grant", Options{Out: "/usr/share/moat-evidence-test", Binary: bin, Probe: probeBin}, "sandbox can see"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Run(context.Background(), tc.o)
			var he *HarnessError
			if !errors.As(err, &he) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want a harness error containing %q", err, tc.want)
			}
		})
	}
	// The matching hashes are accepted (the run then starts; a one-case
	// run against a binary that is not moat ends invalid, not refused).
	sum, _ := FileSHA256(bin)
	psum, _ := FileSHA256(probeBin)
	res, err := Run(context.Background(), Options{Out: filepath.Join(t.TempDir(), "o"), Binary: bin, Probe: probeBin,
		ExpectedBinarySHA256: strings.ToUpper(sum), ExpectedProbeSHA256: psum, Cases: []string{"unapproved-model"}})
	if err != nil {
		t.Fatalf("matching hashes: %v", err)
	}
	if got := res.Report.Cases[0].Outcome; got != OutcomeInvalid {
		t.Fatalf("a binary that never gets Ready: got %s, want invalid", got)
	}
}

// Without root the storage fault cannot be injected: the case is invalid,
// never pass, and moat is not even run.
func TestStorageFaultUnprivilegedIsInvalid(t *testing.T) {
	defer func(f func() int) { geteuid = f }(geteuid)
	geteuid = func() int { return 65534 }
	bin, probeBin := fakeBinaries(t)
	res, err := Run(context.Background(), Options{Out: filepath.Join(t.TempDir(), "o"), Binary: bin, Probe: probeBin, Cases: []string{"audit-storage-fault"}})
	if err != nil {
		t.Fatal(err)
	}
	c := res.Report.Cases[0]
	if c.Outcome != OutcomeInvalid || runtime.GOOS == "linux" && !strings.Contains(strings.Join(c.Reasons, ";"), "needs root") {
		t.Fatalf("got %s %v, want invalid because it needs root", c.Outcome, c.Reasons)
	}
}

func TestReportMarkdownStatesLimits(t *testing.T) {
	out := fullBundle(t)
	md := string(readFile(t, filepath.Join(out, FileReportMD)))
	for _, want := range []string{"escape probability", "kernel or hypervisor exploits", "side channels", "compromise of the host", "Checksums alone", "never scored"} {
		if !strings.Contains(strings.ToLower(md), strings.ToLower(want)) {
			t.Errorf("report.md lacks %q", want)
		}
	}
}

func BenchmarkVerifyJournal(b *testing.B) {
	t := &testing.T{}
	j := newFakeJournal(t, "run-b")
	j.add("run.started", nil)
	for i := 0; i < 200; i++ {
		j.add("inference.requested", map[string]any{"body_sha256": sha([]byte{byte(i)})})
	}
	j.add("run.terminated", map[string]any{"reason": "completed"})
	b.SetBytes(int64(len(j.data)))
	for b.Loop() {
		if r := verifyJournal(j.data, j.pub()); r.Status != JournalComplete {
			b.Fatal(r.Reason)
		}
	}
}

func BenchmarkVerifyBundle(b *testing.B) {
	t := &testing.T{}
	out := fullBundle(t)
	for b.Loop() {
		if r := VerifyBundle(out, ""); r.Verdict != VerdictComplete {
			b.Fatal(r.Problems)
		}
	}
}
