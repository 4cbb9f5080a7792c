package evidence

import (
	"crypto/ed25519"
	"crypto/rand"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// kubeBundle writes a bundle of backend kubernetes the way the controller
// does: the fixed list's cases not applicable, with no files, the others
// run (here faked as clean runs).
func kubeBundle(t *testing.T, names ...string) string {
	t.Helper()
	out := t.TempDir()
	planned, err := plan(names)
	if err != nil {
		t.Fatal(err)
	}
	rep := &Report{Suite: SuiteName, Version: ReportVersion, Planned: planned, Complete: len(names) == 0,
		Fixture: FileInfo{SHA256: FixtureSHA256()}, Backend: "kubernetes", Kernel: "test", Arch: "amd64",
		Binary: BinaryInfo{Path: "/moat", SHA256: sha([]byte("moat")), SHA256End: sha([]byte("moat")), Unchanged: true}}
	for _, n := range planned {
		if _, na := NotApplicable("kubernetes", n); na {
			rep.Cases = append(rep.Cases, notApplicableReport("kubernetes", n))
			continue
		}
		c, _ := CaseByName(n)
		dir := filepath.Join(out, CasesDir, n)
		writeFakeCase(t, dir, c)
		rep.Cases = append(rep.Cases, mustCaseReport(t, dir, c))
	}
	rep.Summary = Summarize(rep.Cases)
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	if _, err := FinishBundle(out, rep, priv); err != nil {
		t.Fatal(err)
	}
	return out
}

// The fixed list names only cases that exist, each with a reason, and
// only for the kubernetes backend; the cases the kubernetes backend can
// run (the broker's, direct-network, the workspace's host checks) are not
// on it.
func TestNotApplicableList(t *testing.T) {
	for backend, cases := range notApplicable {
		if backend != "kubernetes" {
			t.Errorf("backend %q on the list", backend)
		}
		for name, why := range cases {
			if _, ok := CaseByName(name); !ok || why == "" {
				t.Errorf("%s/%s: unknown case or no reason", backend, name)
			}
		}
	}
	for _, n := range []string{"direct-network", "allowed-inference-canary", "host-datagram-socket", "setid-file", "credential-reflection", "inotify-counter", "run-info-symlink", "audit-storage-fault"} {
		if _, na := NotApplicable("kubernetes", n); na {
			t.Errorf("%s is exempted on kubernetes", n)
		}
	}
	for _, n := range CaseNames() {
		for _, b := range []string{"native", "gvisor", ""} {
			if _, na := NotApplicable(b, n); na {
				t.Errorf("%s exempted on %q", n, b)
			}
		}
	}
}

// A kubernetes bundle with not-applicable cases verifies, counting them;
// the same outcomes are refused where the fixed list does not give them:
// on another backend, for a case off the list, with another reason, with
// files of their own; and a listed case may not be reported run.
func TestNotApplicableVerified(t *testing.T) {
	names := []string{"direct-network", "tool-call", "egress-grants"}
	ok := kubeBundle(t, names...)
	r := VerifyBundlePinned(ok, Pins{})
	if r.ExitCode() != 2 || len(r.Problems) != 0 || r.Summary.NotApplicable != 2 || r.Summary.Pass != 1 {
		t.Fatalf("honest kubernetes subset: exit %d, summary %+v: %v", r.ExitCode(), r.Summary, r.Problems)
	}
	md := string(readFile(t, filepath.Join(ok, FileReportMD)))
	if !strings.Contains(md, "2 not applicable on this backend") || !strings.Contains(md, "tool servers are refused by the kubernetes backend") {
		t.Errorf("report.md does not say which cases are not applicable and why:\n%s", md)
	}
	forgeries := []struct {
		name, want string
		apply      func(out string) error
	}{
		{"backend native", "does not exempt", func(out string) error {
			return ResignReport(out, func(r *Report) { r.Backend = "native" })
		}},
		{"backend named by the bundle", "does not exempt", func(out string) error {
			return ResignReport(out, func(r *Report) { r.Backend = "kubernetes-lite" })
		}},
		{"a case off the list", "does not exempt", func(out string) error {
			if err := os.RemoveAll(filepath.Join(out, CasesDir, "direct-network")); err != nil {
				return err
			}
			return ResignReport(out, func(r *Report) {
				for i := range r.Cases {
					if r.Cases[i].Name == "direct-network" {
						r.Cases[i] = CaseReport{Name: "direct-network", Outcome: OutcomeNotApplicable, Reasons: []string{"not applicable on backend kubernetes: trust me"}}
					}
				}
				for k := range r.CaseFiles {
					if strings.HasPrefix(k, CasesDir+"/direct-network/") {
						delete(r.CaseFiles, k)
					}
				}
				r.Summary = Summarize(r.Cases)
			})
		}},
		{"another reason", "reason is not the fixed list's", func(out string) error {
			return ResignReport(out, func(r *Report) {
				for i := range r.Cases {
					if r.Cases[i].Name == "tool-call" {
						r.Cases[i].Reasons = []string{"not applicable on backend kubernetes: it passed anyway"}
					}
				}
			})
		}},
		{"a listed case reported pass", "yet reported", func(out string) error {
			return ResignReport(out, func(r *Report) {
				for i := range r.Cases {
					if r.Cases[i].Name == "tool-call" {
						r.Cases[i] = CaseReport{Name: "tool-call", Outcome: OutcomePass, Reasons: []string{}}
					}
				}
				r.Summary = Summarize(r.Cases)
			})
		}},
		{"observations on a not-applicable case", "has observations", func(out string) error {
			return ResignReport(out, func(r *Report) {
				for i := range r.Cases {
					if r.Cases[i].Name == "egress-grants" {
						r.Cases[i].Observations.Verified = 3
					}
				}
			})
		}},
	}
	for _, f := range forgeries {
		t.Run(f.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "bundle")
			if err := os.CopyFS(out, os.DirFS(ok)); err != nil {
				t.Fatal(err)
			}
			if err := f.apply(out); err != nil {
				t.Fatal(err)
			}
			r := VerifyBundlePinned(out, Pins{})
			if r.ExitCode() != 1 || !slices.ContainsFunc(r.Problems, func(p string) bool { return strings.Contains(p, f.want) }) {
				t.Fatalf("exit %d, want 1 with a problem naming %q: %v", r.ExitCode(), f.want, r.Problems)
			}
		})
	}
}
