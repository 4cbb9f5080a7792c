package evidence

import (
	"crypto/ed25519"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func sampleJournal(t *testing.T) *fakeJournal {
	j := newFakeJournal(t, "run-j")
	j.add("run.started", nil)
	j.add("boundary.confirmed", map[string]any{"ready": true})
	j.add("inference.requested", map[string]any{"body_sha256": sha([]byte("x"))})
	j.add("run.terminated", map[string]any{"reason": "completed"})
	return j
}

func TestVerifyJournal(t *testing.T) {
	j := sampleJournal(t)
	full := string(j.data)
	lines := strings.SplitAfter(strings.TrimSuffix(full, "\n"), "\n")
	_, otherPriv, _ := ed25519.GenerateKey(rand.Reader)
	tests := []struct {
		name string
		data string
		pub  ed25519.PublicKey
		want string
	}{
		{"complete", full, j.pub(), JournalComplete},
		{"prefix without terminal", strings.Join(lines[:3], ""), j.pub(), JournalIncomplete},
		{"torn last line", strings.Join(lines[:3], "") + lines[3][:40], j.pub(), JournalIncomplete},
		{"bytes after terminal", full + "x", j.pub(), JournalInvalid},
		{"line after terminal", full + lines[1], j.pub(), JournalInvalid},
		{"other key", full, otherPriv.Public().(ed25519.PublicKey), JournalInvalid},
		{"line dropped", lines[0] + strings.Join(lines[2:], ""), j.pub(), JournalInvalid},
		{"lines swapped", lines[0] + lines[2] + lines[1] + lines[3], j.pub(), JournalInvalid},
		{"payload edited", strings.Replace(full, `"payload":"ey`, `"payload":"eX`, 1), j.pub(), JournalInvalid},
		{"empty", "", j.pub(), JournalIncomplete},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := VerifyJournal([]byte(tc.data), tc.pub)
			if got.Status != tc.want {
				t.Fatalf("got %s (%s), want %s", got.Status, got.Reason, tc.want)
			}
		})
	}
}

func FuzzVerifyJournal(f *testing.F) {
	j := newFakeJournal(&testing.T{}, "run-f")
	j.add("run.started", nil)
	j.add("run.terminated", map[string]any{"reason": "completed"})
	f.Add(j.data)
	f.Add([]byte("{}\n"))
	pub := j.pub()
	f.Fuzz(func(t *testing.T, data []byte) {
		r := VerifyJournal(data, pub)
		switch r.Status {
		case JournalComplete, JournalIncomplete, JournalInvalid:
		default:
			t.Fatalf("status %q", r.Status)
		}
	})
}

func FuzzParseClaims(f *testing.F) {
	f.Add([]byte(`{"claims":{"passed":true,"escape_success":true,"audit_verified":true}}` + "\n"))
	f.Fuzz(func(t *testing.T, data []byte) { ParseClaims(data) })
}

func FuzzCheckPreEffect(f *testing.F) {
	j := newFakeJournal(&testing.T{}, "run-p")
	line := j.add("inference.requested", map[string]any{"body_sha256": sha([]byte("b"))})
	f.Add([]byte(line), []byte("b"))
	pub := j.pub()
	f.Fuzz(func(t *testing.T, line, body []byte) { checkPreEffect(line, body, "run-p", pub) })
}

// FuzzObserveEvents feeds arbitrary provider and receiver event files to
// ObserveCase: malformed input is an error or missing evidence, never a panic.
func FuzzObserveEvents(f *testing.F) {
	f.Add([]byte(`{"n":1,"body":"e30=","pre_effect":"{}","headers":{"moat-x":"1"}}`+"\n"), []byte(`{"receiver":"tcp","kind":"hit"}`+"\n"))
	f.Add([]byte("{\"n\":\n"), []byte(`{"receiver":"nope","kind":"control"}`))
	c, _ := CaseByName("provider-redirect")
	f.Fuzz(func(t *testing.T, prov, recv []byte) {
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, FileProviderEvents), prov, 0o644)
		os.WriteFile(filepath.Join(dir, FileReceiverEvents), recv, 0o644)
		os.WriteFile(filepath.Join(dir, FileRedirectEvents), recv, 0o644)
		os.WriteFile(filepath.Join(dir, FileHost), prov, 0o644)
		if o, err := ObserveCase(dir, c); err == nil {
			Score(c, o)
		}
	})
}
