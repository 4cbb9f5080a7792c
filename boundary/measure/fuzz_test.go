package measure

import (
	"os"
	"path/filepath"
	"testing"
)

// fuzzPlan is the plan the report fuzzer checks reports against.
var fuzzPlan = plan{V: 1, Nonce: "00", Probes: []probe{
	{ID: "fs/read-secret:/etc/shadow", Op: opRead, Path: "/etc/shadow", property: PropFilesystem, kind: KindViolation},
	{ID: "priv/exec-self", Op: opExec, property: PropPrivilege, kind: KindControl},
}}

func addSeeds(f *testing.F, glob string) {
	files, err := filepath.Glob(glob)
	if err != nil || len(files) == 0 {
		f.Fatalf("no seed corpus at %s", glob)
	}
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
}

// FuzzDecodeReport: no input panics; an accepted report answers only
// planned probes, once each, with a known outcome and a bounded detail.
func FuzzDecodeReport(f *testing.F) {
	addSeeds(f, "testdata/report-*.json")
	f.Fuzz(func(t *testing.T, b []byte) {
		res, err := decodeReport(b, fuzzPlan)
		if err != nil {
			return
		}
		for id, r := range res {
			if id != r.ID || (id != fuzzPlan.Probes[0].ID && id != fuzzPlan.Probes[1].ID) {
				t.Fatalf("accepted unplanned id %q", id)
			}
			if r.Outcome != OutcomeSucceeded && r.Outcome != OutcomeFailed && r.Outcome != OutcomeError {
				t.Fatalf("accepted outcome %q", r.Outcome)
			}
			if len(r.Detail) > MaxDetailBytes+len("…") {
				t.Fatalf("detail of %d bytes", len(r.Detail))
			}
		}
	})
}

// FuzzDecodePlan: no input panics; an accepted plan has version 1, a
// bounded number of probes and unique ids.
func FuzzDecodePlan(f *testing.F) {
	addSeeds(f, "testdata/plan-*.json")
	f.Fuzz(func(t *testing.T, b []byte) {
		pl, err := decodePlan(string(b))
		if err != nil {
			return
		}
		if pl.V != 1 || len(pl.Probes) > MaxProbes {
			t.Fatalf("accepted %+v", pl)
		}
		seen := map[string]bool{}
		for _, p := range pl.Probes {
			if seen[p.ID] {
				t.Fatalf("accepted duplicate id %q", p.ID)
			}
			seen[p.ID] = true
		}
	})
}
