package audit

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// copyRun writes journal bytes and the key into a run directory of auditDir.
func copyRun(t *testing.T, auditDir, name string, j testJournal, journal []byte) string {
	t.Helper()
	dir := filepath.Join(auditDir, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, PublicKeyFile), j.w.PublicKeyPEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	if journal != nil {
		if err := os.WriteFile(filepath.Join(dir, JournalFile), journal, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestSummarize(t *testing.T) {
	j := buildJournal(t)
	aud := t.TempDir()
	n := len(j.lines)
	cases := []struct {
		name    string
		journal []byte
		reason  TerminalReason
		exit    int // -1: no exit code
		records int
		problem string
	}{
		{"complete", j.raw, ReasonCompleted, 3, n, ""},
		{"no terminal record", joinLines(j.lines[:n-1]), ReasonIncomplete, -1, n - 1, ""},
		{"torn tail", append(joinLines(j.lines[:n-1]), j.lines[n-1][:20]...), ReasonIncomplete, -1, n - 1, "line 10 is torn"},
		{"unreadable line", append(joinLines(j.lines[:2]), "garbage\n"...), ReasonIncomplete, -1, 2, "line 3:"},
		{"no journal", nil, ReasonIncomplete, -1, 0, "reading the journal"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := Summarize(copyRun(t, aud, strings.ReplaceAll(c.name, " ", "-"), j, c.journal))
			if s.Reason != c.reason || s.Records != c.records || !strings.Contains(s.Problem, c.problem) || (c.problem == "") != (s.Problem == "") {
				t.Fatalf("got reason %q, %d records, problem %q; want %q, %d, %q", s.Reason, s.Records, s.Problem, c.reason, c.records, c.problem)
			}
			if (c.exit < 0) != (s.ExitCode == nil) || (s.ExitCode != nil && *s.ExitCode != c.exit) {
				t.Fatalf("exit code: got %v, want %d", s.ExitCode, c.exit)
			}
			if c.records > 0 && (s.ID != "20261129T083000Z-0123456789ab" || s.Backend != "native" || s.KeyID != KeyID(j.pub) || s.Started.IsZero()) {
				t.Fatalf("header fields: %+v", s)
			}
			if c.name == "complete" && (s.Counts != Counts{Requested: 2, Completed: 1, Refused: 1, Failed: 1, Processes: 1}) {
				t.Fatalf("counts: got %+v", s.Counts)
			}
		})
	}
}

func TestListRuns(t *testing.T) {
	j := buildJournal(t)
	aud := t.TempDir()
	copyRun(t, aud, "b", j, j.raw)
	copyRun(t, aud, "a", j, joinLines(j.lines[:3]))
	copyRun(t, aud, "keyonly", j, nil)
	os.Mkdir(filepath.Join(aud, "not-a-run"), 0o700)
	os.WriteFile(filepath.Join(aud, "file"), nil, 0o600)
	runs, err := ListRuns(aud)
	if err != nil {
		t.Fatal(err)
	}
	var dirs []string
	for _, r := range runs {
		dirs = append(dirs, filepath.Base(r.Dir))
	}
	// Same start time (one journal): by id, then stable. keyonly has no
	// start time and sorts first.
	if got := strings.Join(dirs, ","); got != "keyonly,b,a" && got != "keyonly,a,b" {
		t.Fatalf("got %s, want keyonly then a and b, and no other entry", got)
	}
	none, err := ListRuns(filepath.Join(aud, "missing"))
	if err != nil || len(none) != 0 || none == nil {
		t.Fatalf("missing audit dir: got %v %v, want an empty list", none, err)
	}
}

func TestVerifyFiles(t *testing.T) {
	j := buildJournal(t)
	aud := t.TempDir()
	dir := copyRun(t, aud, "r", j, j.raw)
	jp, kp := filepath.Join(dir, JournalFile), filepath.Join(dir, PublicKeyFile)
	if res, pinned := VerifyFiles(jp, kp, ""); res.Status != Complete || pinned {
		t.Fatalf("unpinned: got %v pinned=%v", res.Status, pinned)
	}
	if res, pinned := VerifyFiles(jp, kp, KeyID(j.pub)); res.Status != Complete || !pinned {
		t.Fatalf("pinned: got %v pinned=%v", res.Status, pinned)
	}
	if res, _ := VerifyFiles(jp, kp, strings.Repeat("0", 64)); res.Status != Invalid || !strings.Contains(res.Reason, "not the pinned") {
		t.Fatalf("wrong pin: got %v %q", res.Status, res.Reason)
	}
	keyOnly := copyRun(t, aud, "k", j, nil)
	if res, _ := VerifyFiles(filepath.Join(keyOnly, JournalFile), filepath.Join(keyOnly, PublicKeyFile), ""); res.Status != Incomplete || res.Records != 0 {
		t.Fatalf("never-created journal: got %v %d", res.Status, res.Records)
	}
	// A crash before the first record was durable: an empty journal, the
	// key missing or empty (Create syncs it with that record).
	for _, key := range []string{"missing", "empty", "garbage"} {
		d := filepath.Join(aud, "crash-"+key)
		os.Mkdir(d, 0o700)
		os.WriteFile(filepath.Join(d, JournalFile), nil, 0o600)
		switch key {
		case "empty":
			os.WriteFile(filepath.Join(d, PublicKeyFile), nil, 0o644)
		case "garbage":
			os.WriteFile(filepath.Join(d, PublicKeyFile), []byte("not a key"), 0o644)
		}
		res, _ := VerifyFiles(filepath.Join(d, JournalFile), filepath.Join(d, PublicKeyFile), "")
		want := Incomplete
		if key == "garbage" { // bytes that are no key: not a crash's trace
			want = Invalid
		}
		if res.Status != want || res.Records != 0 {
			t.Errorf("empty journal, key %s: got %v %q, want %v", key, res.Status, res.Reason, want)
		}
	}
	// The control: a journal with a line in it needs its key.
	noKey := copyRun(t, aud, "n", j, j.raw)
	os.Remove(filepath.Join(noKey, PublicKeyFile))
	if res, _ := VerifyFiles(filepath.Join(noKey, JournalFile), filepath.Join(noKey, PublicKeyFile), ""); res.Status != Invalid {
		t.Errorf("a journal with records and no key: got %v %q, want invalid", res.Status, res.Reason)
	}
}
