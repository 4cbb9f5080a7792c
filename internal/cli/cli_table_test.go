package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"

	"github.com/moat-sandbox/moat/audit"
)

// commandsOf lists every visible command under c, c included, by path.
func commandsOf(c *cobra.Command) []*cobra.Command {
	out := []*cobra.Command{c}
	for _, sub := range c.Commands() {
		if !sub.Hidden && sub.Name() != "help" {
			out = append(out, commandsOf(sub)...)
		}
	}
	return out
}

// The -o formats of every command that prints something: the house rule
// is json and yaml wherever there is output (policy check's text form is
// YAML already). A command that gains output, or -o, must be added here.
var wantOutput = map[string][]string{
	"moat audit verify":             {"json", "yaml"},
	"moat audit show":               {"json", "yaml"},
	"moat conformance run":          {"json", "yaml"},
	"moat doctor":                   {"json", "yaml"},
	"moat evidence run":             {"json", "yaml"},
	"moat evidence verify":          {"json", "yaml"},
	"moat policy check":             {"yaml", "json"},
	"moat run":                      {"json", "yaml"},
	"moat runs list":                {"json", "yaml"},
	"moat runs show":                {"json", "yaml"},
	"moat sandbox create":           {"json", "yaml"},
	"moat sandbox exec":             {"json", "yaml"},
	"moat sandbox get":              {"json", "yaml"},
	"moat sandbox list":             {"json", "yaml"},
	"moat sandbox reload-lockfiles": {"json", "yaml"},
	"moat version":                  {"json", "yaml"},
	"moat demo":                     nil, // a narrative for people; its evidence is the bundle
	"moat policy schema":            nil, // JSON Schema itself
	"moat sandbox delete":           nil, // prints nothing on success
	"moat audit":                    nil,
	"moat conformance":              nil,
	"moat evidence":                 nil,
	"moat policy":                   nil,
	"moat runs":                     nil,
	"moat sandbox":                  nil,
	"moat":                          nil,

	// receipts (issue 14 item 3)
	"moat audit receipt":        {"json", "yaml"},
	"moat audit verify-receipt": {"json", "yaml"},

	// approvals (issue 14 item 1)
	"moat approvals":         nil,
	"moat approvals list":    {"json", "yaml"},
	"moat approvals show":    {"json", "yaml"},
	"moat approvals approve": {"json", "yaml"},
	"moat approvals deny":    {"json", "yaml"},
}

func TestEveryCommandHasExampleAndOutputFormats(t *testing.T) {
	for _, c := range commandsOf(NewRoot()) {
		path := c.CommandPath()
		t.Run(path, func(t *testing.T) {
			if strings.TrimSpace(c.Example) == "" {
				t.Errorf("%s --help has no Example", path)
			}
			want, known := wantOutput[path]
			if !known {
				t.Fatalf("%s is not in wantOutput: say which -o formats it has", path)
			}
			f := c.Flags().Lookup("output")
			if want == nil {
				if f != nil {
					t.Errorf("%s has -o but is listed without output formats", path)
				}
				return
			}
			if f == nil {
				t.Fatalf("%s has no -o; want %v", path, want)
			}
			of, ok := f.Value.(*outputFlag)
			if !ok || !slices.Equal(of.allowed, want) || f.Shorthand != "o" {
				t.Fatalf("%s -o: got %T %v, want %v", path, f.Value, f.Value, want)
			}
			if !strings.Contains(c.Use, "-o "+strings.Join(want, "|")) {
				t.Errorf("%s: usage %q does not show -o %s", path, c.Use, strings.Join(want, "|"))
			}
		})
	}
}

// An unsupported -o is refused while the flags are parsed, so before any
// work: exit 125, the allowed values named, nothing on stdout. The
// commands are given arguments that would make them work (or fail
// differently) if the refusal came later.
func TestUnsupportedOutputRefusedFirst(t *testing.T) {
	t.Setenv("MOAT_STATE_DIR", t.TempDir())
	dir, _ := writeRun(t, true)
	for path, want := range wantOutput {
		if want == nil {
			continue
		}
		args := append(strings.Fields(path)[1:], "-o", "xml")
		switch path {
		case "moat audit verify", "moat audit show":
			args = append(args, filepath.Join(dir, audit.JournalFile))
		case "moat runs show":
			args = append(args, dir)
		case "moat sandbox get", "moat sandbox reload-lockfiles":
			args = append(args, "nosuch")
		case "moat sandbox exec":
			args = append(args, "nosuch", "true")
		case "moat run":
			args = append(args, "true")
		case "moat policy check":
			args = append(args, "../../examples/minimal.yaml")
		case "moat evidence verify":
			args = append(args, t.TempDir())
		case "moat evidence run":
			args = append(args, "--out", filepath.Join(t.TempDir(), "ev"))
		}
		t.Run(path, func(t *testing.T) {
			start := time.Now()
			out, code := runCLI(t, args...)
			if code != ExitRefused {
				t.Fatalf("%v: exit %d, want %d\n%s", args, code, ExitRefused, out)
			}
			msg := `unsupported output format "xml" (allowed: ` + strings.Join(want, ", ") + ")"
			if !strings.Contains(out, msg) || strings.Count(out, "\n") > 1 {
				t.Fatalf("%v: got %q, want only %q", args, out, msg)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("%v took %v: refused after work", args, d)
			}
		})
	}
}

// The exit-code table (README "Exit codes"), command by command, for what
// runs in-process; the sandbox and run codes that need a real sandbox
// (workload code, 126, 127) are the e2e tests' (e2e/run_test.go,
// e2e/sandbox_test.go).
func TestExitCodeTable(t *testing.T) {
	t.Setenv("MOAT_STATE_DIR", t.TempDir())
	auditDir := t.TempDir()
	completeDir, incompleteDir := filepath.Join(auditDir, "complete"), filepath.Join(auditDir, "incomplete")
	c1, _ := writeRun(t, true)
	c2, _ := writeRun(t, false)
	if os.Rename(c1, completeDir) != nil || os.Rename(c2, incompleteDir) != nil {
		t.Fatal("moving the runs")
	}
	grantDir := t.TempDir()
	pol := filepath.Join(t.TempDir(), "p.yaml")
	if err := os.WriteFile(pol, []byte("version: 1\nfilesystem: {read_write: ["+grantDir+"]}\naudit: {dir: "+t.TempDir()+"}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		args []string
		code int
		want string
	}{
		// 125: usage and unknown values, before any work.
		{"unknown flag", []string{"run", "--no-such-flag", "true"}, 125, "unknown flag: --no-such-flag"},
		{"unknown command", []string{"nosuch"}, 125, `unknown command "nosuch"`},
		{"run without a command", []string{"run"}, 125, "requires at least 1 arg"},
		{"run unknown backend", []string{"run", "--backend", "nosuch", "true"}, 125, `unknown backend "nosuch" (known: native, gvisor, kubernetes)`},
		{"conformance unknown backend", []string{"conformance", "run", "--backend", "nosuch"}, 125, `unknown backend "nosuch" (known: native, gvisor, kubernetes)`},
		{"conformance unknown scenario", []string{"conformance", "run", "--scenario", "nosuch"}, 125, `unknown scenario "nosuch" (known: `},
		{"evidence run unknown backend", []string{"evidence", "run", "--out", filepath.Join(t.TempDir(), "ev"), "--backend", "nosuch"}, 125, `unknown backend "nosuch" (known: native, gvisor, kubernetes)`},
		{"sandbox create unknown backend", []string{"sandbox", "create", "x", "--policy", pol, "--backend", "nosuch"}, 125, `unknown backend "nosuch" (known: native, gvisor, kubernetes)`},
		{"sandbox create without a name", []string{"sandbox", "create", "--policy", pol}, 125, "a name and --policy are required"},
		{"sandbox create two names", []string{"sandbox", "create", "a", "--name", "b", "--policy", pol}, 125, "two names given"},
		{"sandbox create bad name", []string{"sandbox", "create", "Bad/Name", "--policy", pol}, 125, "invalid sandbox name"},
		{"sandbox create audit dir in a grant", []string{"sandbox", "create", "x", "--policy", pol, "--audit-dir", filepath.Join(grantDir, "runs")}, 125, "lies inside it"},
		{"run audit dir in a grant", []string{"run", "--policy", pol, "--audit-dir", filepath.Join(grantDir, "runs"), "true"}, 125, "lies inside it"},
		{"run audit dir cannot be created", []string{"run", "--policy", pol, "--audit-dir", "/proc/moat-runs", "true"}, 125, "pass --audit-dir DIR"},
		// 125: a missing sandbox, alike for get, exec and delete.
		{"sandbox get missing", []string{"sandbox", "get", "nosuch"}, 125, "no sandbox named nosuch"},
		{"sandbox exec missing", []string{"sandbox", "exec", "nosuch", "true"}, 125, "no sandbox named nosuch"},
		{"sandbox exec missing with --", []string{"sandbox", "exec", "nosuch", "--", "true"}, 125, "no sandbox named nosuch"},
		{"sandbox delete missing", []string{"sandbox", "delete", "nosuch"}, 125, "no sandbox named nosuch"},
		{"sandbox reload-lockfiles missing", []string{"sandbox", "reload-lockfiles", "nosuch"}, 125, "no sandbox named nosuch"},
		{"sandbox delete missing, ignored", []string{"sandbox", "delete", "nosuch", "--ignore-not-found"}, 0, "nothing to delete"},
		{"sandbox exec without a command", []string{"sandbox", "exec", "nosuch"}, 125, "no command given"},
		// 0 with output.
		{"sandbox list empty", []string{"sandbox", "list", "-o", "json"}, 0, "[]"},
		{"sandbox list yaml", []string{"sandbox", "list", "-o", "yaml"}, 0, "[]"},
		{"runs list", []string{"runs", "list", "--audit-dir", auditDir}, 0, "completed (exit 0)"},
		{"runs list incomplete", []string{"runs", "list", "--audit-dir", auditDir}, 0, "incomplete"},
		{"runs list missing dir", []string{"runs", "list", "--audit-dir", filepath.Join(auditDir, "none"), "-o", "json"}, 0, "[]"},
		// Verifiers: 0 complete, 2 incomplete, 1 invalid, 3 unpinned with --require-pin.
		{"runs show complete", []string{"runs", "show", filepath.Base(completeDir), "--audit-dir", auditDir}, 0, "verified:   complete"},
		{"runs show incomplete", []string{"runs", "show", incompleteDir}, 2, "verified:   incomplete"},
		{"runs show unpinned required", []string{"runs", "show", completeDir, "--require-pin"}, 3, "UNPINNED"},
		{"runs show wrong pin", []string{"runs", "show", completeDir, "--key-fingerprint", strings.Repeat("ab", 32)}, 1, "not the pinned"},
		{"runs show missing", []string{"runs", "show", "nosuch", "--audit-dir", auditDir}, 125, "no run nosuch in " + auditDir},
		{"audit verify complete", []string{"audit", "verify", completeDir}, 0, "complete: 5 records"},
		{"audit verify incomplete", []string{"audit", "verify", incompleteDir}, 2, "incomplete"},
		{"audit verify bad pin", []string{"audit", "verify", completeDir, "--key-fingerprint", "xyz"}, 125, "64 hex digits"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, code := runCLI(t, c.args...)
			if code != c.code || !strings.Contains(out, c.want) {
				t.Fatalf("%v: exit %d, output %q; want exit %d and %q", c.args, code, out, c.code, c.want)
			}
		})
	}
}

// runs list and show in both machine formats: the same data.
func TestRunsOutputFormats(t *testing.T) {
	complete, _ := writeRun(t, true)
	auditDir := filepath.Dir(complete)
	for _, format := range []string{"json", "yaml"} {
		t.Run(format, func(t *testing.T) {
			out, code := runCLI(t, "runs", "list", "--audit-dir", auditDir, "-o", format)
			if code != 0 {
				t.Fatalf("exit %d\n%s", code, out)
			}
			var got []map[string]any
			if format == "json" {
				err := json.Unmarshal([]byte(out), &got)
				if err != nil {
					t.Fatalf("%v\n%s", err, out)
				}
			} else if err := yaml.Unmarshal([]byte(out), &got); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			if len(got) != 1 || got[0]["id"] != "cli-test" || got[0]["reason"] != "completed" || got[0]["backend"] != "native" {
				t.Fatalf("got %v", got)
			}
			counts, _ := got[0]["counts"].(map[string]any)
			if n, _ := counts["requested"].(float64); format == "json" && n != 1 {
				t.Errorf("requested: got %v, want 1", counts["requested"])
			}
			if n, _ := counts["requested"].(int); format == "yaml" && n != 1 {
				t.Errorf("requested: got %v, want 1", counts["requested"])
			}
			show, code := runCLI(t, "runs", "show", complete, "-o", format)
			if code != 0 || !strings.Contains(show, "pinned") || !strings.Contains(show, "status") {
				t.Fatalf("show -o %s: exit %d\n%s", format, code, show)
			}
		})
	}
}

// exec's own flags may come before or after NAME; the command keeps its
// flags whether or not "--" marks it.
func TestSandboxExecArgs(t *testing.T) {
	t.Setenv("MOAT_STATE_DIR", t.TempDir())
	for _, args := range [][]string{
		{"sandbox", "exec", "nosuch", "sh", "-c", "exit 3"},
		{"sandbox", "exec", "nosuch", "--tty", "--", "sh", "-c", "exit 3"},
		{"sandbox", "exec", "--tty", "nosuch", "sh", "-c", "exit 3"},
		{"sandbox", "exec", "nosuch", "-o", "json", "sh", "-c", "exit 3"},
	} {
		out, code := runCLI(t, args...)
		// The sandbox is looked up only once the arguments parsed.
		if code != ExitRefused || !strings.Contains(out, "no sandbox named nosuch") {
			t.Errorf("%v: exit %d, %q; want 125 naming the missing sandbox", args, code, out)
		}
	}
	if out, code := runCLI(t, "sandbox", "exec", "nosuch", "--bogus", "x"); code != ExitRefused || !strings.Contains(out, "unknown flag: --bogus") {
		t.Errorf("unknown flag after NAME: exit %d, %q", code, out)
	}
}
