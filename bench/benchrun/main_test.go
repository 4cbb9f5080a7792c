package main

import (
	"os"
	"path/filepath"
	"testing"
)

// A section recording a separate run survives a regeneration; a section
// bench/run writes itself does not come back twice (the control).
func TestKeptSections(t *testing.T) {
	p := filepath.Join(t.TempDir(), "RESULTS.md")
	old := "# moat benchmark results\n\n| a | b |\n\n## Where moat misses a target, by how much, and why\n\n- x\n\n" +
		"## Latency under attack " + keptMark + "\n\nfigures\nmore\n\n## Notes from this run\n\n- n\n"
	if err := os.WriteFile(p, []byte(old), 0o644); err != nil {
		t.Fatal(err)
	}
	want := "\n## Latency under attack " + keptMark + "\n\nfigures\nmore\n"
	if got := keptSections(p); got != want {
		t.Fatalf("kept:\n%q\nwant\n%q", got, want)
	}
	if got := keptSections(filepath.Join(t.TempDir(), "missing")); got != "" {
		t.Errorf("no file: %q", got)
	}
}
