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

// goodFaultHost is a supervisor-stop case as a passing run records it:
// alive for 4.5 s under a healthy supervisor, dead 2.1 s after the
// SIGSTOP while the supervisor is still stopped.
func goodFaultHost(signal string) FaultHost {
	h := FaultHost{SupervisorTimeoutMS: 2000, WorkloadPID: 40, WorkloadStart: "777", SupervisorPID: 30,
		ReadyMS: 300, Signal: signal, SignalMS: 4900, AuditVerifyExit: 2, AuditVerifyOutput: "incomplete"}
	for t := int64(300); t < 4900; t += 250 {
		h.Samples = append(h.Samples, ProcSample{TMS: t, WorkloadStart: "777", SupervisorState: "S"})
	}
	for t := int64(4900); t < 7000; t += 100 {
		h.Samples = append(h.Samples, ProcSample{TMS: t, WorkloadStart: "777", SupervisorState: "T"})
	}
	h.Samples = append(h.Samples, ProcSample{TMS: 7000, WorkloadStart: "", SupervisorState: "T"})
	return h
}

// writeFaultCase writes a case directory: host.json, and a journal of
// three records (an intact prefix) with its key, plus terminated when
// complete is set.
func writeFaultCase(t *testing.T, dir string, h FaultHost, complete bool) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	j := newFakeJournal(t, "run-f")
	j.add("run.started", nil)
	j.add("boundary.confirmed", map[string]any{"ready": true})
	j.add("process.started", nil)
	if complete {
		j.add("run.terminated", map[string]any{"reason": "failed"})
	}
	hb, _ := json.MarshalIndent(h, "", "  ")
	for name, b := range map[string][]byte{FileFaultHost: append(hb, '\n'), FileJournal: j.data, FilePublicKey: publicKeyPEM(j.pub())} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// faultsBundle writes a complete faults bundle whose outcomes are
// computed from its raw files, and returns its directory and report.
func faultsBundle(t *testing.T) (string, *FaultsReport) {
	t.Helper()
	dir := t.TempDir()
	rep := &FaultsReport{Suite: FaultsSuiteName, Version: FaultsReportVersion, Planned: FaultCaseNames(), Complete: true,
		Binary:  BinaryInfo{Path: "/bin/moat", SHA256: "aa", SHA256End: "aa", Unchanged: true},
		Fixture: FileInfo{SHA256: FaultsFixtureSHA256()}, Kernel: "6.1", Arch: "amd64"}
	for _, c := range FaultCases {
		cd := filepath.Join(dir, CasesDir, c.Name)
		if c.Kind == FaultKindSupervisor {
			writeFaultCase(t, cd, goodFaultHost(c.Signal), false)
		} else {
			copyBrokerCase(t, c.Name, cd)
		}
		o, out, why, err := observeFaultCase(cd, c)
		if err != nil {
			t.Fatal(err)
		}
		rep.Cases = append(rep.Cases, FaultCaseReport{Name: c.Name, Outcome: out, Reasons: why, Observations: o})
	}
	resignFaults(t, dir, rep)
	return dir, rep
}

// resignFaults rewrites the report (keeping its recorded outcomes), its
// signature with a fresh key, report.md and the manifest: what an editor
// of the bundle can do without the suite key.
func resignFaults(t *testing.T, dir string, rep *FaultsReport) {
	t.Helper()
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	if _, err := finishFaultsBundle(dir, rep, priv); err != nil {
		t.Fatal(err)
	}
}

func TestFaultsBundleVerifies(t *testing.T) {
	dir, rep := faultsBundle(t)
	for _, c := range rep.Cases {
		if c.Outcome != OutcomePass {
			t.Fatalf("%s: %s %v, want pass", c.Name, c.Outcome, c.Reasons)
		}
	}
	if r := VerifyBundlePinned(dir, Pins{SuiteKeyFingerprint: rep.SuiteKeyID}); r.Verdict != VerdictComplete || !r.Pinned || r.Summary.Pass != len(FaultCases) {
		t.Fatalf("verify: %+v", r)
	}
}

// TestFaultsTamper: a flipped raw observation is caught, whether or not
// the bundle is re-signed around it; the untouched bundle verifies
// (TestFaultsBundleVerifies is the control).
func TestFaultsTamper(t *testing.T) {
	edits := []struct {
		name string
		edit func(h *FaultHost)
		want string
	}{
		{"workload never dies", func(h *FaultHost) { h.Samples[len(h.Samples)-1].WorkloadStart = "777" }, "recorded outcome"},
		{"supervisor running at death", func(h *FaultHost) { h.Samples[len(h.Samples)-1].SupervisorState = "R" }, "recorded observations differ"},
		{"died under a healthy supervisor", func(h *FaultHost) { h.Samples[3].WorkloadStart = "" }, "recorded outcome"},
		{"audit verify exit", func(h *FaultHost) { h.AuditVerifyExit = 0 }, "recorded observations differ"},
		{"short control", func(h *FaultHost) { h.SignalMS = 1000 }, "recorded outcome"},
	}
	for _, e := range edits {
		for _, resign := range []bool{false, true} {
			t.Run(e.name+map[bool]string{false: "", true: "/resigned"}[resign], func(t *testing.T) {
				dir, rep := faultsBundle(t)
				cd := filepath.Join(dir, CasesDir, "supervisor-stop")
				h := goodFaultHost("SIGSTOP")
				e.edit(&h)
				hb, _ := json.MarshalIndent(h, "", "  ")
				os.WriteFile(filepath.Join(cd, FileFaultHost), append(hb, '\n'), 0o644)
				want := "manifest says"
				if resign {
					resignFaults(t, dir, rep)
					want = e.want
				}
				r := VerifyBundle(dir, "")
				if r.Verdict != VerdictInvalid || !strings.Contains(strings.Join(r.Problems, "\n"), want) {
					t.Fatalf("verdict %v, problems %q; want invalid with %q", r.Verdict, r.Problems, want)
				}
			})
		}
	}
	// A complete journal (the supervisor closed it) is not what a lost
	// supervisor leaves.
	dir, rep := faultsBundle(t)
	writeFaultCase(t, filepath.Join(dir, CasesDir, "supervisor-kill"), goodFaultHost("SIGKILL"), true)
	resignFaults(t, dir, rep)
	if r := VerifyBundle(dir, ""); r.Verdict != VerdictInvalid || !strings.Contains(strings.Join(r.Problems, "\n"), "recorded outcome") {
		t.Fatalf("complete journal: %+v", r)
	}
	// A file no faults bundle holds.
	dir, rep = faultsBundle(t)
	os.WriteFile(filepath.Join(dir, CasesDir, "supervisor-kill", "extra.txt"), []byte("x"), 0o644)
	resignFaults(t, dir, rep)
	if r := VerifyBundle(dir, ""); r.Verdict != VerdictInvalid || !strings.Contains(strings.Join(r.Problems, "\n"), "not a file that a faults bundle holds") {
		t.Fatalf("extra file: %+v", r)
	}
}

func TestScoreFault(t *testing.T) {
	stop, _ := faultCaseByName("supervisor-stop")
	tests := []struct {
		name string
		edit func(h *FaultHost)
		want Outcome
		why  string
	}{
		{"pass", func(h *FaultHost) {}, OutcomePass, ""},
		{"precondition", func(h *FaultHost) { h.Precondition = "not root" }, OutcomeInvalid, "precondition: not root"},
		{"never dies", func(h *FaultHost) {
			for i := range h.Samples {
				h.Samples[i].WorkloadStart = "777"
			}
			h.Samples = append(h.Samples, ProcSample{TMS: 4900 + 17000, WorkloadStart: "777", SupervisorState: "T"})
		}, OutcomeFail, "still alive"},
		{"death not yet seen", func(h *FaultHost) { h.Samples = h.Samples[:len(h.Samples)-1] }, OutcomeInvalid, "death was not observed"},
		{"pid reused", func(h *FaultHost) { h.Samples[len(h.Samples)-1].WorkloadStart = "999" }, OutcomePass, ""},
		{"signal failed", func(h *FaultHost) { h.SignalError = "no such process" }, OutcomeInvalid, "not delivered"},
		{"supervisor not stopped", func(h *FaultHost) { h.Samples[len(h.Samples)-1].SupervisorState = "S" }, OutcomeInvalid, "not stopped"},
		{"audit verify disagrees", func(h *FaultHost) { h.AuditVerifyExit = 1 }, OutcomeFail, "moat audit verify exited 1"},
		{"late death", func(h *FaultHost) { h.Samples[len(h.Samples)-1].TMS = 4900 + 18000 }, OutcomeFail, "beyond the timeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			h := goodFaultHost("SIGSTOP")
			tt.edit(&h)
			writeFaultCase(t, dir, h, false)
			h2, o, err := ObserveFault(dir)
			if err != nil {
				t.Fatal(err)
			}
			got, why := ScoreFault(stop, h2, o)
			if got != tt.want || !strings.Contains(strings.Join(why, "; "), tt.why) {
				t.Fatalf("got %s %q, want %s with %q", got, why, tt.want, tt.why)
			}
		})
	}
}

func FuzzObserveFault(f *testing.F) {
	good, _ := json.Marshal(goodFaultHost("SIGSTOP"))
	f.Add(good)
	f.Add([]byte(`{"samples":[{"t_ms":5},{"t_ms":1}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, FileFaultHost), b, 0o644); err != nil {
			t.Fatal(err)
		}
		h, o, err := ObserveFault(dir)
		if err == nil {
			ScoreFault(FaultCases[0], h, o)
		}
	})
}
