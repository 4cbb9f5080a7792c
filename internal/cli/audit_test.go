package cli

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/evidence"
)

// runCLI runs moat with args and returns its stdout and exit code.
func runCLI(t *testing.T, args ...string) (string, int) {
	t.Helper()
	root := NewRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.Execute()
	if err == nil {
		return out.String(), 0
	}
	var ee *ExitError
	if errors.As(err, &ee) {
		if ee.Err != nil {
			out.WriteString("moat: " + ee.Err.Error() + "\n")
		}
		return out.String(), ee.Code
	}
	return out.String() + err.Error(), exitUsage
}

// writeRun makes a real journal: run.started, boundary.confirmed, a
// refused and a requested inference, and (if terminate) run.terminated.
func writeRun(t *testing.T, terminate bool) (dir string, lines [][]byte) {
	t.Helper()
	dir = filepath.Join(t.TempDir(), "run")
	w, err := audit.Create(dir, "cli-test")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	recs := []audit.Record{
		audit.RunStarted{PolicySHA256: strings.Repeat("a", 64), Backend: "native", BinarySHA256: strings.Repeat("b", 64), PublicKey: string(w.PublicKeyPEM())},
		audit.BoundaryConfirmed{Ready: true},
		audit.InferenceRefused{RequestID: "r1", Reason: "model_not_allowed", Detail: `moat: refused: model "x" is not allowed by policy (allowed: a, b)`,
			Attribution: audit.Attribution{Status: "unavailable", Reason: "test"}},
		audit.InferenceRequested{RequestID: "r2", Provider: "anthropic", Model: "a", Endpoint: "/v1/messages",
			Attribution: audit.Attribution{Status: "resolved", PID: 7, Executable: "/bin/agent"}},
	}
	if terminate {
		recs = append(recs, audit.RunTerminated{Reason: "completed"})
	}
	for _, r := range recs {
		l, err := w.Append(r)
		if err != nil {
			t.Fatal(err)
		}
		lines = append(lines, l)
	}
	return dir, lines
}

func TestAuditVerifyExitCodes(t *testing.T) {
	dir, lines := writeRun(t, true)
	pub := filepath.Join(dir, audit.PublicKeyFile)
	journal := filepath.Join(dir, audit.JournalFile)
	raw, _ := os.ReadFile(journal)
	write := func(name string, b []byte) string {
		p := filepath.Join(t.TempDir(), name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	flipped := bytes.Clone(raw)
	// Change one base64 character inside line 1's signature to another.
	if at := len(lines[0]) - 30; flipped[at] == 'A' {
		flipped[at] = 'B'
	} else {
		flipped[at] = 'A'
	}
	other := filepath.Join(t.TempDir(), "other")
	w2, err := audit.Create(other, "other")
	if err != nil {
		t.Fatal(err)
	}
	w2.Close()
	cases := []struct {
		name    string
		journal string
		pubkey  string
		code    int
		want    string
	}{
		{"complete", journal, pub, 0, "complete: 5 records"},
		{"terminal dropped", write("j", raw[:len(raw)-len(lines[4])-1]), pub, 2, "no terminal record"},
		{"torn tail", write("j", raw[:len(raw)-len(lines[4])-1+37]), pub, 2, "torn tail of 37 bytes"},
		{"flipped signature byte", write("j", flipped), pub, 1, "INVALID: line 1: bad signature"},
		{"garbage after terminal", write("j", append(bytes.Clone(raw), "x\n"...)), pub, 1, "line 6: data after the terminal record"},
		{"wrong key", journal, filepath.Join(other, audit.PublicKeyFile), 1, "line 1: wrong key"},
		{"missing journal", filepath.Join(dir, "nope"), pub, 1, "reading the journal"},
		{"not a key", journal, journal, 1, "not a PEM file"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, code := runCLI(t, "audit", "verify", c.journal, "--pubkey", c.pubkey)
			if code != c.code || !strings.Contains(out, c.want) {
				t.Fatalf("exit %d, output %q; want exit %d and %q", code, out, c.code, c.want)
			}
		})
	}
	t.Run("json", func(t *testing.T) {
		out, code := runCLI(t, "audit", "verify", write("j", raw[:len(raw)-len(lines[4])-1+37]), "--pubkey", pub, "-o", "json")
		var got struct {
			Status   string `json:"status"`
			Line     int    `json:"line"`
			Reason   string `json:"reason"`
			Records  int    `json:"records"`
			ExitCode int    `json:"exit_code"`
		}
		// stderr (UNPINNED) comes first in runCLI's merged output.
		_, js, _ := strings.Cut(out, "\n{")
		if err := json.Unmarshal([]byte("{"+js), &got); err != nil || !strings.Contains(out, "UNPINNED") {
			t.Fatalf("output %q: %v", out, err)
		}
		if code != 2 || got.Status != "incomplete" || got.Line != 5 || got.Records != 4 || got.ExitCode != 2 || !strings.Contains(got.Reason, "torn tail of 37 bytes") {
			t.Fatalf("exit %d, %+v", code, got)
		}
	})
	t.Run("pubkey beside the journal by default", func(t *testing.T) {
		for _, arg := range []string{journal, dir} {
			out, code := runCLI(t, "audit", "verify", arg)
			if code != 0 || !strings.Contains(out, "complete: 5 records") || !strings.Contains(out, "UNPINNED: authenticity not established") {
				t.Fatalf("%s: exit %d\n%s", arg, code, out)
			}
		}
		if out, code := runCLI(t, "audit", "verify", write("journal.jsonl", raw)); code != 1 || !strings.Contains(out, "reading the public key") {
			t.Fatalf("no pubkey.pem beside the journal: exit %d\n%s", code, out)
		}
	})
}

// forgeRun writes what an attacker without the run key can make of a run:
// a journal signed with a fresh key, with the requested inference's record
// removed, and that key as pubkey.pem.
func forgeRun(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "forged")
	w, err := audit.Create(dir, "cli-test")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for _, r := range []audit.Record{
		audit.RunStarted{PolicySHA256: strings.Repeat("a", 64), Backend: "native", BinarySHA256: strings.Repeat("b", 64), PublicKey: string(w.PublicKeyPEM())},
		audit.BoundaryConfirmed{Ready: true},
		audit.RunTerminated{Reason: "completed"},
	} {
		if _, err := w.Append(r); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func keyIDOf(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, audit.PublicKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	pub, err := audit.ParsePublicKeyPEM(b)
	if err != nil {
		t.Fatal(err)
	}
	return audit.KeyID(pub)
}

func TestAuditVerifyPins(t *testing.T) {
	dir, _ := writeRun(t, true)
	fp := keyIDOf(t, dir)
	forged := forgeRun(t)
	incomplete, _ := writeRun(t, false)
	for _, c := range []struct {
		name string
		args []string
		code int
		want []string
		not  string
	}{
		{"pinned", []string{dir, "--key-fingerprint", fp}, 0, []string{"complete: 5 records", "pinned"}, "UNPINNED"},
		{"pinned, upper-case hex", []string{dir, "--key-fingerprint", strings.ToUpper(fp)}, 0, []string{"complete: 5 records"}, "UNPINNED"},
		{"pinned and required", []string{dir, "--key-fingerprint", fp, "--require-pin"}, 0, []string{"complete"}, "UNPINNED"},
		{"unpinned", []string{dir}, 0, []string{"complete: 5 records", "UNPINNED: authenticity not established", fp}, ""},
		{"unpinned, pin required", []string{dir, "--require-pin"}, 3, []string{"UNPINNED: authenticity not established", "--require-pin"}, ""},
		{"unpinned incomplete, pin required", []string{incomplete, "--require-pin"}, 3, []string{"incomplete", "UNPINNED"}, ""},
		{"pinned incomplete", []string{incomplete, "--key-fingerprint", keyIDOf(t, incomplete), "--require-pin"}, 2, []string{"incomplete"}, "UNPINNED"},
		{"another run's pin", []string{dir, "--key-fingerprint", keyIDOf(t, incomplete)}, 1, []string{"INVALID", "not the pinned " + keyIDOf(t, incomplete)}, ""},
		// The attack: re-signed with a fresh key, a request removed,
		// pubkey.pem replaced. On its own state it is complete…
		{"forged, unpinned", []string{forged}, 0, []string{"complete: 3 records", "UNPINNED"}, ""},
		// …and the pin is what rejects it.
		{"forged, pinned", []string{forged, "--key-fingerprint", fp}, 1, []string{"INVALID", "not the pinned " + fp}, ""},
		{"forged, pinned, --pubkey of the real run", []string{filepath.Join(forged, audit.JournalFile), "--pubkey", filepath.Join(dir, audit.PublicKeyFile), "--key-fingerprint", fp}, 1, []string{"INVALID: line 1: wrong key"}, ""},
		{"malformed pin", []string{dir, "--key-fingerprint", fp[:63]}, exitUsage, []string{"64 hex digits"}, ""},
		{"non-hex pin", []string{dir, "--key-fingerprint", strings.Repeat("g", 64)}, exitUsage, []string{"not hex"}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, code := runCLI(t, append([]string{"audit", "verify"}, c.args...)...)
			if code != c.code {
				t.Fatalf("exit %d, want %d\n%s", code, c.code, out)
			}
			for _, w := range c.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			if c.not != "" && strings.Contains(out, c.not) {
				t.Errorf("output has %q:\n%s", c.not, out)
			}
		})
	}
	t.Run("json", func(t *testing.T) {
		for _, c := range []struct {
			args   []string
			code   int
			pinned bool
		}{
			{[]string{dir, "--key-fingerprint", fp}, 0, true},
			{[]string{dir}, 0, false},
			{[]string{dir, "--require-pin"}, 3, false},
			{[]string{forged, "--key-fingerprint", fp}, 1, false},
		} {
			root := NewRoot()
			var out, errb bytes.Buffer
			root.SetOut(&out)
			root.SetErr(&errb)
			root.SetArgs(append([]string{"audit", "verify", "-o", "json"}, c.args...))
			code := 0
			if err := root.Execute(); err != nil {
				var ee *ExitError
				if !errors.As(err, &ee) {
					t.Fatal(err)
				}
				code = ee.Code
			}
			var got struct {
				Pinned   *bool  `json:"pinned"`
				ExitCode int    `json:"exit_code"`
				KeyID    string `json:"keyid"`
			}
			if err := json.Unmarshal(out.Bytes(), &got); err != nil {
				t.Fatalf("%v: stdout %q: %v", c.args, out.String(), err)
			}
			if code != c.code || got.ExitCode != c.code || got.Pinned == nil || *got.Pinned != c.pinned {
				t.Fatalf("%v: exit %d, %+v; want exit %d, pinned %v", c.args, code, got, c.code, c.pinned)
			}
			if unp := strings.Contains(errb.String(), "UNPINNED: authenticity not established"); unp != (!c.pinned && c.code != 1) {
				t.Fatalf("%v: stderr %q", c.args, errb.String())
			}
		}
	})
}

// TestAuditVerifyNoJournal: a kill between creating pubkey.pem and
// journal.jsonl leaves a run directory without a journal. That is an
// incomplete run (2), not an invalid one.
func TestAuditVerifyNoJournal(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	w, err := audit.Create(dir, "cli-test")
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	fp := w.KeyID()
	if err := os.Remove(filepath.Join(dir, audit.JournalFile)); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(t.TempDir(), "run")
	os.Mkdir(empty, 0o700)
	garbage := filepath.Join(t.TempDir(), "run")
	os.Mkdir(garbage, 0o700)
	os.WriteFile(filepath.Join(garbage, audit.PublicKeyFile), []byte("not a key"), 0o644)
	for _, c := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"run directory", []string{dir}, 2, "has its public key but no journal.jsonl"},
		{"journal path", []string{filepath.Join(dir, audit.JournalFile)}, 2, "has its public key but no journal.jsonl"},
		{"pinned", []string{dir, "--key-fingerprint", fp}, 2, "no journal"},
		{"wrong pin", []string{dir, "--key-fingerprint", strings.Repeat("ab", 32)}, 1, "not the pinned"},
		{"no key yet", []string{empty}, 2, "no journal and no public key"},
		{"not a key", []string{garbage}, 1, "reading the public key"},
		{"not a run directory", []string{filepath.Join(t.TempDir(), "nope", audit.JournalFile)}, 1, "reading"},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, code := runCLI(t, append([]string{"audit", "verify"}, c.args...)...)
			if code != c.code || !strings.Contains(out, c.want) {
				t.Fatalf("exit %d, want %d and %q:\n%s", code, c.code, c.want, out)
			}
		})
	}
}

func TestAuditShow(t *testing.T) {
	dir, _ := writeRun(t, false)
	journal := filepath.Join(dir, audit.JournalFile)
	out, code := runCLI(t, "audit", "show", journal)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, out)
	}
	rows := strings.Split(strings.TrimSpace(out), "\n")
	if len(rows) != 5 {
		t.Fatalf("%d rows, want 4 records and a note:\n%s", len(rows), out)
	}
	for i, want := range []string{"run.started", "boundary.confirmed", "REFUSED inference.refused", "inference.requested", "signatures not checked"} {
		if !strings.Contains(rows[i], want) {
			t.Errorf("row %d %q, want %q", i+1, rows[i], want)
		}
	}
	if !strings.HasPrefix(rows[2], "!!") || strings.HasPrefix(rows[3], "!!") {
		t.Errorf("only the refusal is highlighted:\n%s", out)
	}
	if !strings.Contains(rows[2], "model_not_allowed") || !strings.Contains(rows[3], "pid=7") {
		t.Errorf("key fields missing:\n%s", out)
	}
	out, code = runCLI(t, "audit", "show", journal, "--pubkey", filepath.Join(dir, audit.PublicKeyFile))
	if code != 2 || !strings.Contains(out, "verified: incomplete: no terminal record") {
		t.Fatalf("show --pubkey: exit %d\n%s", code, out)
	}
	out, code = runCLI(t, "audit", "show", journal, "-o", "json")
	var recs []map[string]any
	if err := json.Unmarshal([]byte(out), &recs); err != nil || code != 0 || len(recs) != 4 || recs[2]["reason"] != "model_not_allowed" {
		t.Fatalf("show -o json: exit %d, err %v\n%s", code, err, out)
	}
}

func TestVerifyHelpShowsPin(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"audit", "verify", "--help"}, "--key-fingerprint"},
		{[]string{"evidence", "verify", "--help"}, "--suite-key-fingerprint"},
	} {
		out, code := runCLI(t, c.args...)
		_, ex, _ := strings.Cut(out, "Examples:")
		if code != 0 || !strings.Contains(ex, c.want) || !strings.Contains(out, "UNPINNED") || !strings.Contains(out, "3 ") {
			t.Errorf("%v: exit %d; want an example with %s and the exit codes:\n%s", c.args, code, c.want, out)
		}
	}
}

func TestAuditHelpHasExamples(t *testing.T) {
	for _, args := range [][]string{{"audit", "--help"}, {"audit", "verify", "--help"}, {"audit", "show", "--help"}} {
		out, code := runCLI(t, args...)
		if code != 0 || !strings.Contains(out, "Examples:") || !strings.Contains(out, "moat audit") {
			t.Errorf("%v: exit %d, no example:\n%s", args, code, out)
		}
	}
}

// emptySubsetBundle is the smallest valid bundle: no case planned, so a
// subset (exit 2), signed with a fresh suite key.
func emptySubsetBundle(t *testing.T) (dir, keyID, manifest string) {
	t.Helper()
	dir = t.TempDir()
	rep := &evidence.Report{Suite: evidence.SuiteName, Version: evidence.ReportVersion, Planned: []string{},
		Fixture: evidence.FileInfo{SHA256: evidence.FixtureSHA256()},
		Binary:  evidence.BinaryInfo{SHA256: strings.Repeat("a", 64), SHA256End: strings.Repeat("a", 64), Unchanged: true}}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	m, err := evidence.FinishBundle(dir, rep, priv)
	if err != nil {
		t.Fatal(err)
	}
	return dir, rep.SuiteKeyID, m
}

func TestEvidenceVerifyPins(t *testing.T) {
	dir, kid, man := emptySubsetBundle(t)
	other, okid, _ := emptySubsetBundle(t)
	for _, c := range []struct {
		name string
		args []string
		code int
		want []string
		not  string
	}{
		{"unpinned", []string{dir}, 2, []string{"valid SUBSET", "UNPINNED: authenticity not established"}, ""},
		{"unpinned, pin required", []string{dir, "--require-pin"}, 3, []string{"UNPINNED: authenticity not established", "--require-pin"}, ""},
		{"suite key pinned", []string{dir, "--suite-key-fingerprint", kid, "--require-pin"}, 2, []string{"valid SUBSET", "(pinned)"}, "UNPINNED"},
		{"manifest pinned", []string{dir, "--manifest-sha256", strings.ToUpper(man)}, 2, []string{"(pinned)"}, "UNPINNED"},
		{"both pinned", []string{dir, "--manifest-sha256", man, "--suite-key-fingerprint", kid}, 2, []string{"(pinned)"}, "UNPINNED"},
		{"another bundle's key", []string{other, "--suite-key-fingerprint", kid}, 1, []string{"INVALID", "not the pinned " + kid}, "UNPINNED"},
		{"another bundle's manifest", []string{other, "--manifest-sha256", man, "--require-pin"}, 1, []string{"INVALID", "is not the pinned"}, "UNPINNED"},
		{"the other one, its own key", []string{other, "--suite-key-fingerprint", okid}, 2, []string{"(pinned)"}, "UNPINNED"},
		{"malformed pin", []string{dir, "--suite-key-fingerprint", "abc"}, exitUsage, []string{"64 hex digits"}, ""},
		{"not a bundle", []string{t.TempDir()}, 1, []string{"INVALID"}, "UNPINNED"},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, code := runCLI(t, append([]string{"evidence", "verify"}, c.args...)...)
			if code != c.code {
				t.Fatalf("exit %d, want %d\n%s", code, c.code, out)
			}
			for _, w := range c.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			if c.not != "" && strings.Contains(out, c.not) {
				t.Errorf("output has %q:\n%s", c.not, out)
			}
		})
	}
	for _, c := range []struct {
		args   []string
		code   int
		pinned bool
	}{
		{[]string{dir}, 2, false},
		{[]string{dir, "--require-pin"}, 3, false},
		{[]string{dir, "--suite-key-fingerprint", kid}, 2, true},
		{[]string{other, "--suite-key-fingerprint", kid}, 1, false},
	} {
		out, code := runCLI(t, append([]string{"evidence", "verify", "-o", "json"}, c.args...)...)
		var got struct {
			Pinned   *bool `json:"pinned"`
			ExitCode int   `json:"exit_code"`
		}
		if i := strings.Index(out, "{"); i >= 0 {
			dec := json.NewDecoder(strings.NewReader(out[i:]))
			if err := dec.Decode(&got); err != nil {
				t.Fatalf("%v: %v\n%s", c.args, err, out)
			}
		}
		if code != c.code || got.ExitCode != c.code || got.Pinned == nil || *got.Pinned != c.pinned {
			t.Fatalf("%v: exit %d, %+v; want %d, pinned %v\n%s", c.args, code, got, c.code, c.pinned, out)
		}
	}
}
