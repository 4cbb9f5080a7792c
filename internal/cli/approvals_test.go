package cli

import (
	"strings"
	"testing"
)

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

// TestApprovalsFlags: each usage mistake is refused with exit 125 and a
// reason, before any socket is reached.
func TestApprovalsFlags(t *testing.T) {
	id := "moatapr_0123456789abcdef01234567"
	dir := t.TempDir()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"approvals", "approve", id}, "approve needs --digest D"},
		{[]string{"approvals", "list", "--sandbox", "a", "--run", dir}, "--sandbox and --run both given"},
		{[]string{"approvals", "list", "--run", dir}, "is the run still going?"},
		{[]string{"approvals", "show", id, "--sandbox", "Bad/Name"}, "Bad/Name"},
		{[]string{"approvals", "list", "-o", "xml"}, "unsupported output format"},
	} {
		out, code := runCLI(t, c.args...)
		if code != ExitRefused || !strings.Contains(out, c.want) {
			t.Errorf("%v: exit %d\n%s\nwant 125 and %q", c.args, code, out, c.want)
		}
	}
}
