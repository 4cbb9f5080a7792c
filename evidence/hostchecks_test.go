package evidence

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/evidence/probe"
)

// editHost rewrites a case directory's host.json with edit.
func editHost(t *testing.T, dir string, edit func(h *HostRecord)) {
	t.Helper()
	var h HostRecord
	if err := readStrictJSON(filepath.Join(dir, FileHost), &h); err != nil {
		t.Fatal(err)
	}
	edit(&h)
	b, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, FileHost), b)
}

func setPath(h *HostRecord, when, path string, edit func(p *PathRecord)) {
	for i := range h.Paths {
		if h.Paths[i].When == when && h.Paths[i].Path == path {
			edit(&h.Paths[i])
			return
		}
	}
	panic("no path record " + when + " " + path)
}

func setProc(h *HostRecord, when string, pid int, alive bool) {
	for i := range h.ToolProcs {
		if h.ToolProcs[i].When == when && h.ToolProcs[i].PID == pid {
			h.ToolProcs[i].Alive = alive
			return
		}
	}
	panic(fmt.Sprintf("no process record %s %d", when, pid))
}

func dropProcs(h *HostRecord, when string) {
	var keep []ProcRecord
	for _, p := range h.ToolProcs {
		if p.When != when {
			keep = append(keep, p)
		}
	}
	h.ToolProcs = keep
}

func dropPath(h *HostRecord, when, path string) {
	var keep []PathRecord
	for _, p := range h.Paths {
		if p.When != when || p.Path != path {
			keep = append(keep, p)
		}
	}
	h.Paths = keep
}

// Each host check scores from the raw host record: the clean fake passes;
// an adverse raw observation fails the case; a missing observation or a
// failed positive control makes it invalid. The raw files are edited, not
// the observations, so that ObserveCase's reading is tested with Score's.
func TestHostChecksFromRawFiles(t *testing.T) {
	type edit struct {
		name string
		c    string
		host func(h *HostRecord)
		file func(t *testing.T, dir string) // other raw files
		want Outcome
	}
	setidAttack := wsPath(probe.SetIDAttacks[0])
	tests := []edit{
		// setid-file
		{"set-id bit seen on the host", "setid-file", func(h *HostRecord) {
			setPath(h, WhenAfter, setidAttack, func(p *PathRecord) { p.Mode = modeRegular | 0o4755 })
		}, nil, OutcomeFail},
		{"set-gid directory seen on the host", "setid-file", func(h *HostRecord) {
			setPath(h, WhenAfter, wsPath("setid-dir-chmod-2755"), func(p *PathRecord) {
				*p = PathRecord{When: WhenAfter, Path: p.Path, Exists: true, Mode: modeDir | 0o2755, UID: 65534}
			})
		}, nil, OutcomeFail},
		{"root-owned executable from the workload", "setid-file", func(h *HostRecord) {
			setPath(h, WhenAfter, wsPath(probe.SetIDPlain), func(p *PathRecord) { p.UID = 0 })
		}, nil, OutcomeFail},
		{"plain chmod control not seen", "setid-file", func(h *HostRecord) {
			setPath(h, WhenAfter, wsPath(probe.SetIDPlain), func(p *PathRecord) { p.Mode = modeRegular | 0o644 })
		}, nil, OutcomeInvalid},
		{"plain file absent", "setid-file", func(h *HostRecord) {
			setPath(h, WhenAfter, wsPath(probe.SetIDPlain), func(p *PathRecord) { *p = PathRecord{When: WhenAfter, Path: p.Path} })
		}, nil, OutcomeInvalid},
		{"an attack file not stat'ed", "setid-file", func(h *HostRecord) { dropPath(h, WhenAfter, setidAttack) }, nil, OutcomeInvalid},
		{"an attack file unobservable", "setid-file", func(h *HostRecord) {
			setPath(h, WhenAfter, setidAttack, func(p *PathRecord) { p.Err = "lstat: permission denied" })
		}, nil, OutcomeInvalid},
		{"no host record at all", "setid-file", func(h *HostRecord) { h.Paths = nil }, nil, OutcomeInvalid},
		// planted-grant-symlink
		{"run 2 got Ready", "planted-grant-symlink", func(h *HostRecord) {
			h.Runs[0].RunInfo, h.Runs[0].ExitCode = true, 0
		}, nil, OutcomeFail},
		{"run 2 failed otherwise", "planted-grant-symlink", func(h *HostRecord) { h.Runs[0].ExitCode = 1 }, nil, OutcomeFail},
		{"run 2 never ran", "planted-grant-symlink", func(h *HostRecord) { h.Runs = nil }, nil, OutcomeInvalid},
		{"run 2 timed out", "planted-grant-symlink", func(h *HostRecord) { h.Runs[0].TimedOut = true }, nil, OutcomeInvalid},
		{"symlink not planted", "planted-grant-symlink", func(h *HostRecord) {
			setPath(h, WhenRun1, wsPath(probe.NestedGrantParent), func(p *PathRecord) { p.Mode, p.Link = modeDir|0o755, "" })
		}, nil, OutcomeInvalid},
		{"nested read content differs", "planted-grant-symlink", func(h *HostRecord) { h.Values[ValueGranted] = "granted-other" }, nil, OutcomeInvalid},
		{"canary in later run output", "planted-grant-symlink", nil, func(t *testing.T, dir string) {
			writeFile(t, filepath.Join(dir, FileLaterRuns), []byte("== run 2: probe stdout ==\n{\"step\":\"read-nested-grant\",\"reply\":\"MOAT-HOST-CANARY-fake\"}\n"))
		}, OutcomeFail},
		{"canary at the provider", "planted-grant-symlink", nil, func(t *testing.T, dir string) {
			p := filepath.Join(dir, FileProviderEvents)
			if err := appendLine(p, ProviderEvent{N: 9, Method: "POST", Path: "/v1/messages", Body: []byte("nested data=MOAT-HOST-CANARY-fake"), CredentialOK: true}); err != nil {
				t.Fatal(err)
			}
		}, OutcomeFail},
		{"no canary recorded", "planted-grant-symlink", func(h *HostRecord) { delete(h.Values, ValueCanary) }, nil, OutcomeInvalid},
		// run-info-symlink
		{"target overwritten", "run-info-symlink", func(h *HostRecord) {
			setPath(h, WhenAfter, "outside/ri-target-2", func(p *PathRecord) { p.SHA256 = sha([]byte("{\"run_id\":\"x\"}")) })
		}, nil, OutcomeFail},
		{"target mode changed", "run-info-symlink", func(h *HostRecord) {
			setPath(h, WhenAfter, "outside/ri-target-1", func(p *PathRecord) { p.Mode = modeRegular | 0o600 })
		}, nil, OutcomeFail},
		{"run 2 with run info inside the grant got Ready", "run-info-symlink", func(h *HostRecord) {
			h.Runs[0].RunInfo, h.Runs[0].ExitCode = true, 0
		}, nil, OutcomeFail},
		{"link left in place", "run-info-symlink", func(h *HostRecord) {
			setPath(h, WhenAfter, "planted/run-info.json", func(p *PathRecord) { p.Mode, p.Link, p.SHA256 = modeSymlink|0o777, "x", "" })
		}, nil, OutcomeInvalid},
		{"run 3 refused", "run-info-symlink", func(h *HostRecord) { h.Runs[1].RunInfo, h.Runs[1].ExitCode = false, 125 }, nil, OutcomeInvalid},
		{"targets not stat'ed after", "run-info-symlink", func(h *HostRecord) { dropPath(h, WhenAfter, "outside/ri-target-1") }, nil, OutcomeInvalid},
		// inotify-counter
		{"host out of inotify instances", "inotify-counter", func(h *HostRecord) {
			h.Inotify.During = "inotify_init1: too many open files"
		}, nil, OutcomeFail},
		{"before control failed", "inotify-counter", func(h *HostRecord) { h.Inotify.Before = "inotify_init1: too many open files" }, nil, OutcomeInvalid},
		{"probe never held", "inotify-counter", func(h *HostRecord) { h.Inotify.Held, h.Inotify.During = false, "" }, nil, OutcomeInvalid},
		{"not measured", "inotify-counter", func(h *HostRecord) { h.Inotify = nil }, nil, OutcomeInvalid},
		// tool-call
		{"the probe's SIGKILL ended the server", "tool-call", func(h *HostRecord) { setProc(h, procWhenSignaled, 200, false) }, nil, OutcomeFail},
		{"the probe's SIGKILL ended moat", "tool-call", func(h *HostRecord) { setProc(h, procWhenSignaled, 90, false) }, nil, OutcomeFail},
		{"processes not seen after the signals", "tool-call", func(h *HostRecord) { dropProcs(h, procWhenSignaled) }, nil, OutcomeInvalid},
		{"server not seen at Ready", "tool-call", func(h *HostRecord) { setProc(h, procWhenReady, 200, false) }, nil, OutcomeInvalid},
		{"host file at the provider", "tool-call", nil, func(t *testing.T, dir string) {
			if err := appendLine(filepath.Join(dir, FileProviderEvents), ProviderEvent{N: 9, Method: "POST", Path: "/v1/messages", Body: []byte("MOAT-HOST-CANARY-fake"), CredentialOK: true}); err != nil {
				t.Fatal(err)
			}
		}, OutcomeFail},
		{"tool result not at the provider", "tool-call", func(h *HostRecord) { h.Values[ValueToolSum] = "43" }, nil, OutcomeInvalid},
		// tool-unlisted
		{"an unlisted tool reached the server", "tool-unlisted", nil, func(t *testing.T, dir string) {
			if err := appendLine(filepath.Join(dir, FileToolLog), ToolLogLine{Tool: "mul", Arguments: `{"a":1,"b":2}`}); err != nil {
				t.Fatal(err)
			}
		}, OutcomeFail},
		{"the attack marker reached the server", "tool-unlisted", nil, func(t *testing.T, dir string) {
			if err := appendLine(filepath.Join(dir, FileToolLog), ToolLogLine{Tool: "add", Arguments: `{"a":"` + AttackMarker + `"}`}); err != nil {
				t.Fatal(err)
			}
		}, OutcomeFail},
		{"the listed call is not in the server's log", "tool-unlisted", nil, func(t *testing.T, dir string) {
			writeFile(t, filepath.Join(dir, FileToolLog), nil)
		}, OutcomeInvalid},
		{"no server log", "tool-unlisted", nil, func(t *testing.T, dir string) {
			if err := os.Remove(filepath.Join(dir, FileToolLog)); err != nil {
				t.Fatal(err)
			}
		}, OutcomeInvalid},
		// tool-secrets
		{"the canary's value in the server's environment", "tool-secrets", func(h *HostRecord) { h.ToolEnv["X"] = sha([]byte("canary")) }, nil, OutcomeFail},
		{"a provider credential's name in the server's environment", "tool-secrets", func(h *HostRecord) { h.ToolEnv[CredEnvOpenAI] = sha(nil) }, nil, OutcomeFail},
		{"the server's credential not given", "tool-secrets", func(h *HostRecord) { h.ToolEnv[ToolCredEnv] = sha(nil) }, nil, OutcomeInvalid},
		{"the server's environment not read", "tool-secrets", func(h *HostRecord) { h.ToolEnv = nil }, nil, OutcomeInvalid},
		// tool-reaped
		{"the detached child outlived moat", "tool-reaped", func(h *HostRecord) { setProc(h, procWhenAfter, 201, true) }, nil, OutcomeFail},
		{"no detached child seen", "tool-reaped", func(h *HostRecord) {
			var keep []ProcRecord
			for _, p := range h.ToolProcs {
				if p.PID != 201 {
					keep = append(keep, p)
				}
			}
			h.ToolProcs = keep
		}, nil, OutcomeInvalid},
		{"not observed after the kill", "tool-reaped", func(h *HostRecord) { dropProcs(h, procWhenAfter) }, nil, OutcomeInvalid},
		// tool-url-pre-effect
		{"a call without its pre-effect record", "tool-url-pre-effect", nil, func(t *testing.T, dir string) {
			if err := appendLine(filepath.Join(dir, FileToolEvents), ToolEvent{N: 2, Method: "tools/call", Tool: "add", Arguments: "{}", Detail: "0 Moat-Pre-Effect headers, want 1"}); err != nil {
				t.Fatal(err)
			}
		}, OutcomeFail},
		{"a call whose arguments differ from its record", "tool-url-pre-effect", nil, func(t *testing.T, dir string) {
			evs, err := readJSONLines[ToolEvent](filepath.Join(dir, FileToolEvents))
			if err != nil {
				t.Fatal(err)
			}
			ev := evs[0]
			ev.N, ev.Arguments = 2, `{"a":12,"b":31}`
			if err := appendLine(filepath.Join(dir, FileToolEvents), ev); err != nil {
				t.Fatal(err)
			}
		}, OutcomeFail},
		{"no url server events", "tool-url-pre-effect", nil, func(t *testing.T, dir string) {
			if err := os.Remove(filepath.Join(dir, FileToolEvents)); err != nil {
				t.Fatal(err)
			}
		}, OutcomeInvalid},
		// egress-grants
		{"the trap heard a connection", "egress-grants", nil, func(t *testing.T, dir string) {
			if err := appendLine(filepath.Join(dir, FileEgressEvents), EgressEvent{N: 9, Listener: EgressTrap, Kind: "hit", Bytes: 5, SHA256: sha(nil)}); err != nil {
				t.Fatal(err)
			}
		}, OutcomeFail},
		{"the registry saw the ungranted name", "egress-grants", nil, func(t *testing.T, dir string) {
			if err := appendLine(filepath.Join(dir, FileEgressEvents), EgressEvent{N: 9, Listener: EgressRegistry, Kind: EgressKindHello, SNI: probe.EgressUngranted}); err != nil {
				t.Fatal(err)
			}
		}, OutcomeFail},
		{"a request's Host is not its SNI", "egress-grants", nil, func(t *testing.T, dir string) {
			if err := appendLine(filepath.Join(dir, FileEgressEvents), EgressEvent{N: 9, Listener: EgressRegistry, Kind: EgressKindRequest,
				SNI: probe.EgressGranted, Host: probe.EgressUngranted + ":" + fakeEgressPort, Path: "/"}); err != nil {
				t.Fatal(err)
			}
		}, OutcomeFail},
		{"no trap control", "egress-grants", nil, func(t *testing.T, dir string) {
			evs, err := readJSONLines[EgressEvent](filepath.Join(dir, FileEgressEvents))
			if err != nil {
				t.Fatal(err)
			}
			var b []byte
			for _, e := range evs {
				if e.Listener != EgressTrap {
					l, _ := json.Marshal(e)
					b = append(append(b, l...), '\n')
				}
			}
			writeFile(t, filepath.Join(dir, FileEgressEvents), b)
		}, OutcomeInvalid},
		{"no egress events", "egress-grants", nil, func(t *testing.T, dir string) {
			if err := os.Remove(filepath.Join(dir, FileEgressEvents)); err != nil {
				t.Fatal(err)
			}
		}, OutcomeInvalid},
		{"the registry's body not at the provider", "egress-grants", func(h *HostRecord) { h.Values[ValueEgressBody] = "other" }, nil, OutcomeInvalid},
		{"no hooks binary: moat not run", "egress-grants", func(h *HostRecord) {
			h.Values = nil
			h.Missing = append(h.Missing, "precondition: the egress case needs moat built with -tags moat_test_hooks")
		}, nil, OutcomeInvalid},
	}
	for _, c := range Cases[20:] {
		t.Run("clean/"+c.Name, func(t *testing.T) {
			o := cleanObs(t, c)
			if got, reasons := Score(c, o); got != OutcomePass {
				t.Fatalf("got %s (%v), want pass", got, reasons)
			}
			if len(o.HostChecks) != len(c.HostChecks) {
				t.Fatalf("got %d host checks, want %d", len(o.HostChecks), len(c.HostChecks))
			}
		})
	}
	for _, tc := range tests {
		t.Run(tc.c+"/"+tc.name, func(t *testing.T) {
			c := mustCase(tc.c)
			dir := filepath.Join(t.TempDir(), c.Name)
			writeFakeCase(t, dir, c)
			if tc.host != nil {
				editHost(t, dir, tc.host)
			}
			if tc.file != nil {
				tc.file(t, dir)
			}
			o, err := ObserveCase(dir, c)
			if err != nil {
				t.Fatal(err)
			}
			got, reasons := Score(c, o)
			if got != tc.want {
				t.Fatalf("got %s (%v), want %s", got, reasons, tc.want)
			}
			if !strings.Contains(strings.Join(reasons, "\n"), "host check") {
				t.Fatalf("no host check among the reasons: %v", reasons)
			}
		})
	}
}

// The verifier recomputes host checks from the raw files: a bundle whose
// report keeps "pass" for a case whose raw host record shows an escape is
// rejected, even re-signed.
func TestVerifierRecomputesHostChecks(t *testing.T) {
	for _, c := range Cases[20:] {
		if len(c.HostChecks) == 0 {
			continue
		}
		t.Run(c.Name, func(t *testing.T) {
			out := fullBundle(t)
			dir := filepath.Join(out, CasesDir, c.Name)
			var orig CaseReport
			var rep Report
			if err := json.Unmarshal(readFile(t, filepath.Join(out, FileReport)), &rep); err != nil {
				t.Fatal(err)
			}
			for _, cr := range rep.Cases {
				if cr.Name == c.Name {
					orig = cr
				}
			}
			// An escape in the raw record: the first attack check flips.
			editHost(t, dir, func(h *HostRecord) {
				switch c.Name {
				case "setid-file":
					setPath(h, WhenAfter, wsPath(probe.SetIDAttacks[0]), func(p *PathRecord) { p.Mode = modeRegular | 0o4755 })
				case "planted-grant-symlink":
					h.Runs[0].RunInfo, h.Runs[0].ExitCode = true, 0
				case "run-info-symlink":
					setPath(h, WhenAfter, "outside/ri-target-1", func(p *PathRecord) { p.SHA256 = sha(nil) })
				case "inotify-counter":
					h.Inotify.During = "inotify_init1: too many open files"
				case "tool-call":
					setProc(h, procWhenSignaled, 200, false)
				case "tool-secrets":
					h.ToolEnv[ToolCanaryEnv] = sha(nil)
				case "tool-reaped":
					setProc(h, procWhenAfter, 201, true)
				}
			})
			switch c.Name {
			case "tool-unlisted":
				if err := appendLine(filepath.Join(dir, FileToolLog), ToolLogLine{Tool: "mul", Arguments: "{}"}); err != nil {
					t.Fatal(err)
				}
			case "tool-url-pre-effect":
				if err := appendLine(filepath.Join(dir, FileToolEvents), ToolEvent{N: 2, Method: "tools/call", Tool: "add"}); err != nil {
					t.Fatal(err)
				}
			case "egress-grants":
				if err := appendLine(filepath.Join(dir, FileEgressEvents), EgressEvent{N: 9, Listener: EgressTrap, Kind: "hit"}); err != nil {
					t.Fatal(err)
				}
			}
			if err := ResignReport(out, nil); err != nil {
				t.Fatal(err)
			}
			res := VerifyBundle(out, "")
			if res.ExitCode() != 1 || !strings.Contains(strings.Join(res.Problems, "\n"), c.Name+": recorded outcome \"pass\"") {
				t.Fatalf("got exit %d (%v), want the recorded pass rejected", res.ExitCode(), res.Problems)
			}
			// Recording the recomputed observations but not the outcome is
			// rejected too.
			o, err := ObserveCase(dir, c)
			if err != nil {
				t.Fatal(err)
			}
			if err := ResignReport(out, func(r *Report) {
				for i := range r.Cases {
					if r.Cases[i].Name == c.Name {
						r.Cases[i].Observations = o
					}
				}
			}); err != nil {
				t.Fatal(err)
			}
			res = VerifyBundle(out, "")
			if res.ExitCode() != 1 || orig.Outcome != OutcomePass {
				t.Fatalf("observations updated, outcome kept: got exit %d (%v), want 1", res.ExitCode(), res.Problems)
			}
			// The honest report (outcome fail) verifies.
			outcome, reasons := Score(c, o)
			if err := ResignReport(out, func(r *Report) {
				for i := range r.Cases {
					if r.Cases[i].Name == c.Name {
						r.Cases[i].Outcome, r.Cases[i].Reasons = outcome, reasons
					}
				}
				r.Summary = Summarize(r.Cases)
			}); err != nil {
				t.Fatal(err)
			}
			if res := VerifyBundle(out, ""); res.ExitCode() != 0 || outcome != OutcomeFail {
				t.Fatalf("honest fail: got exit %d (%v), outcome %s; want 0 and fail", res.ExitCode(), res.Problems, outcome)
			}
		})
	}
}

// The later runs' output belongs to the bundle; a stray file does not.
func TestLaterRunsFileIsACaseFile(t *testing.T) {
	out := fullBundle(t)
	if _, err := os.Stat(filepath.Join(out, CasesDir, "planted-grant-symlink", FileLaterRuns)); err != nil {
		t.Fatal(err)
	}
	if res := VerifyBundle(out, ""); res.ExitCode() != 0 {
		t.Fatalf("got exit %d (%v)", res.ExitCode(), res.Problems)
	}
	writeFile(t, filepath.Join(out, CasesDir, "direct-network", "run-2.out"), []byte("x"))
	if err := ResignReport(out, nil); err != nil {
		t.Fatal(err)
	}
	if res := VerifyBundle(out, ""); res.ExitCode() != 1 {
		t.Fatalf("stray case file: got exit %d, want 1", res.ExitCode())
	}
}

// docGo is the package documentation, embedded so that the test binary
// needs no source tree (CI runs it again elsewhere as uid 65534).
//
//go:embed doc.go
var docGo string

// The package documentation lists every case and every host check.
func TestDocListsEveryCase(t *testing.T) {
	doc := docGo
	for _, c := range Cases {
		if !strings.Contains(doc, c.Name) {
			t.Errorf("doc.go does not list case %s", c.Name)
		}
		for _, h := range c.HostChecks {
			if !strings.Contains(doc, h) {
				t.Errorf("doc.go does not name %s's host check %s", c.Name, h)
			}
		}
	}
}

// TestSameSource: a hooks binary from another revision than the binary
// under test is refused; the same revision, or one that does not say,
// is not.
func TestSameSource(t *testing.T) {
	for _, c := range []struct {
		tested, hooks string
		ok            bool
	}{{"abc", "abc", true}, {"", "abc", true}, {"abc", "", true}, {"abc", "def", false}} {
		if got := sameSource(c.tested, c.hooks) == ""; got != c.ok {
			t.Errorf("sameSource(%q, %q): ok %v, want %v", c.tested, c.hooks, got, c.ok)
		}
	}
}
