package cli

import "testing"

// TestShown: what a workload chose reaches the operator's terminal
// without control, format or invalid bytes; plain text, LF and tab are
// kept (control).
func TestShown(t *testing.T) {
	for in, want := range map[string]string{
		"{\"a\":\"b\"}\n\tc": "{\"a\":\"b\"}\n\tc",
		"héllo":              "héllo",
		"x\x1b[2Jy":          `x\u001b[2Jy`,
		"x\u009b31mz":        `x\u009b31mz`,
		"rm \u202e/ fr-":     `rm \u202e/ fr-`,
		"a\xffb":             `a\xffb`,
		"del\x7f":            `del\u007f`,
		"cr\rover":           `cr\u000dover`,
		"zero\u200bwidth":    `zero\u200bwidth`,
	} {
		if got := shown(in); got != want {
			t.Errorf("shown(%q) = %q, want %q", in, got, want)
		}
	}
}
