package sandbox

import (
	"log/slog"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/broker"
	"github.com/moat-sandbox/moat/policy"
)

// A run ended by the broker gets the run-wide cap as its terminal reason
// when a cap ended it, else cancelled.
func TestFatalTerminalReason(t *testing.T) {
	for _, tc := range []struct {
		reason string
		want   audit.TerminalReason
	}{
		{string(broker.ReasonRefusalLimit), audit.ReasonRefusalLimit},
		{string(broker.ReasonJournalLimit), audit.ReasonJournalLimit},
		{"credential_reflected", audit.ReasonCancelled},
		{"audit_failure", audit.ReasonCancelled},
		{"", audit.ReasonCancelled},
	} {
		if got := (Fatal{Reason: tc.reason, Msg: "m"}).TerminalReason(); got != tc.want {
			t.Errorf("Fatal{%q}.TerminalReason() = %q, want %q", tc.reason, got, tc.want)
		}
	}
}

func TestParseLogLevel(t *testing.T) {
	for _, tc := range []struct {
		name string
		want slog.Level
	}{
		{LogQuiet, slog.LevelError},
		{LogRefusals, slog.LevelWarn},
		{"", slog.LevelWarn},
		{LogRequests, slog.LevelInfo},
		{LogDebug, slog.LevelDebug},
	} {
		if got, err := ParseLogLevel(tc.name); err != nil || got != tc.want {
			t.Errorf("ParseLogLevel(%q) = %v, %v; want %v", tc.name, got, err, tc.want)
		}
	}
	_, err := ParseLogLevel("verbose")
	if err == nil || !strings.Contains(err.Error(), `"verbose"`) || !strings.Contains(err.Error(), strings.Join(LogLevels, ", ")) {
		t.Fatalf("unknown level: got %v, want an error quoting it and listing the levels", err)
	}
}

func TestValidTerm(t *testing.T) {
	for _, tc := range []struct {
		term string
		ok   bool
	}{
		{"xterm-256color", true},
		{"screen.xterm+new_x", true},
		{strings.Repeat("x", 128), true},
		{"", false},
		{strings.Repeat("x", 129), false},
		{"xterm 256", false},
		{"xterm\x1b]0;", false},
		{"../../x", false},
	} {
		if got := validTerm(tc.term); got != tc.ok {
			t.Errorf("validTerm(%q) = %v, want %v", tc.term, got, tc.ok)
		}
	}
}

func TestTruncateReason(t *testing.T) {
	short := strings.Repeat("a", maxReasonBytes)
	if got := truncateReason(short); got != short {
		t.Fatalf("a reason at the limit was changed")
	}
	// A three-byte rune straddles the limit: it goes whole, not in part.
	long := strings.Repeat("a", maxReasonBytes-1) + "€" + "tail"
	got := truncateReason(long)
	if !utf8.ValidString(got) || got != strings.Repeat("a", maxReasonBytes-1)+"…" {
		t.Fatalf("got %q (valid UTF-8: %v), want the a's and an ellipsis", got[maxReasonBytes-8:], utf8.ValidString(got))
	}
}

// A run id is what audit accepts as one (the journal's run member) and
// fresh each time.
func TestNewRunID(t *testing.T) {
	re := regexp.MustCompile(`^\d{8}T\d{6}Z-[0-9a-f]{12}$`)
	seen := map[string]bool{}
	for range 100 {
		id := NewRunID()
		if !re.MatchString(id) || len(id) > audit.MaxRunIDBytes {
			t.Fatalf("run id %q is not of the form %s", id, re)
		}
		if seen[id] {
			t.Fatalf("run id %q twice", id)
		}
		seen[id] = true
	}
}

// Missing or unusable credentials refuse the run with one message naming
// each variable and its providers; good ones are handed out per provider.
func TestProviderCredentials(t *testing.T) {
	pol := &policy.Policy{}
	pol.Inference.Providers = []policy.Provider{
		{Name: "a", CredentialEnv: "KEY_A"},
		{Name: "b", CredentialEnv: "KEY_B"},
		{Name: "c", CredentialEnv: "KEY_B"},
	}
	good := strings.Repeat("k", broker.MinCredentialBytes)
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

	creds, err := providerCredentials(pol, env(map[string]string{"KEY_A": good, "KEY_B": good + "b"}))
	if err != nil || creds["a"] != good || creds["b"] != good+"b" || creds["c"] != good+"b" || len(creds) != 3 {
		t.Fatalf("all set: got %v, %v", creds, err)
	}
	_, err = providerCredentials(pol, env(map[string]string{"KEY_B": "has space " + good}))
	if _, ok := err.(*RefusedError); !ok {
		t.Fatalf("got %v, want a *RefusedError", err)
	}
	msg := err.Error()
	for _, want := range []string{`KEY_A is not set or empty (provider "a")`, `KEY_B (providers "b", "c") is unusable`} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q does not contain %q", msg, want)
		}
	}
	if strings.Contains(msg, good) {
		t.Errorf("message %q repeats the credential", msg)
	}
}
