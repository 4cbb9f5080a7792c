// Package cli holds moat's cobra commands. Each command lives in its own
// file, registers itself with addCommand, and only wires flags to the
// packages that do the work.
package cli

import (
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"

	"github.com/moat-sandbox/moat/internal/reexec"
	"github.com/moat-sandbox/moat/sandbox"
)

// Exit codes, as docker run / podman run use them (the first three are
// boundary's, through sandbox).
const (
	ExitRefused    = sandbox.ExitRefused // moat itself refused or failed
	ExitCannotExec = sandbox.ExitCannotExec
	ExitNotFound   = sandbox.ExitNotFound
	ExitIncomplete = 2 // verifiers: valid but incomplete
	ExitInvalid    = 1 // verifiers: invalid
	exitUsage      = ExitRefused
)

// ExitError carries an exit code out of a command. Its message, if any, has
// already been printed or is printed by Main.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("exit %d", e.Code)
	}
	return e.Err.Error()
}

func (e *ExitError) Unwrap() error { return e.Err }

// exitf returns an ExitError whose message Main prints as "moat: …".
func exitf(code int, format string, a ...any) error {
	return &ExitError{Code: code, Err: fmt.Errorf(format, a...)}
}

// exitCode returns an ExitError that prints nothing more, or nil for 0.
func exitCode(code int) error {
	if code == 0 {
		return nil
	}
	return &ExitError{Code: code}
}

var commands []func() *cobra.Command

// addCommand registers a top-level command constructor; called from init
// functions in this package, one file per command.
func addCommand(f func() *cobra.Command) { commands = append(commands, f) }

// NewRoot builds the root command.
func NewRoot() *cobra.Command {
	registerBackends()
	root := &cobra.Command{
		Use:   "moat",
		Short: "Run untrusted AI agents with one controlled way out, and signed evidence",
		Long: `moat runs an untrusted AI agent on Linux in a sandbox whose only way out is
moat's inference broker, and records every model request in a signed,
hash-chained journal before the request leaves.`,
		Example: `  moat demo
  moat run --policy examples/minimal.yaml -- sh -c 'id -u'
  moat audit verify .moat/runs/<run>/journal.jsonl --pubkey .moat/runs/<run>/pubkey.pem`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       Version(),
	}
	root.CompletionOptions.DisableDefaultCmd = true
	for _, f := range commands {
		root.AddCommand(f())
	}
	if c, _, err := root.Find([]string{"sandbox", "create"}); err == nil && c.Name() == "create" {
		addLogLevelFlag(c)
	}
	return root
}

// logLevelFlag is --log-level for the commands that run a broker (run,
// sandbox create). It checks the level and sets MOAT_LOG for this process,
// so that the level reaches moat run's broker and a sandbox's supervisor
// (which inherits moat's environment) alike.
type logLevelFlag struct{ name string }

func (f *logLevelFlag) String() string { return f.name }
func (f *logLevelFlag) Type() string   { return "level" }
func (f *logLevelFlag) Set(s string) error {
	if _, err := sandbox.ParseLogLevel(s); err != nil {
		return err
	}
	f.name = s
	return os.Setenv(sandbox.LogEnv, s)
}

func addLogLevelFlag(cmd *cobra.Command) {
	cmd.Flags().Var(&logLevelFlag{}, "log-level", "the broker's lines on stderr: quiet (only what ends the run), refusals (default: refused and failed requests), requests (also each completed one) or debug; default from $"+sandbox.LogEnv+". The journal has every request at any level")
}

// Main runs moat with args (without the program name) and returns the
// exit code. exts are what a second binary adds (cmd/moat-kubernetes:
// internal/cli/k8sext); cmd/moat passes none.
func Main(args []string, exts ...Extension) int {
	extend(exts)
	registerBackends()
	if err := checkTestHooks(); err != nil {
		fmt.Fprintf(os.Stderr, "moat: %v\n", err)
		return ExitRefused
	}
	if len(args) > 0 && strings.HasPrefix(args[0], kubernetesHelperPrefix) && !hasHelper(args[0]) {
		// A kubernetes helper asked of the lean binary: moat-kubernetes
		// has it (handOff returns only when it cannot run it).
		err := handOff("kubernetes")
		fmt.Fprintf(os.Stderr, "moat: %v\n", err)
		return ExitRefused
	}
	if code, ok := reexec.Dispatch(args, helpers()); ok {
		return code
	}
	root := NewRoot()
	root.SetArgs(args)
	err := root.Execute()
	if err == nil {
		return 0
	}
	var ee *ExitError
	if errors.As(err, &ee) {
		if ee.Err != nil {
			fmt.Fprintf(os.Stderr, "moat: %v\n", ee.Err)
		}
		return ee.Code
	}
	// Flag and argument errors from cobra.
	fmt.Fprintf(os.Stderr, "moat: %v\n", err)
	return exitUsage
}

// Version is the module version and VCS revision embedded at build time.
func Version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := bi.Main.Version
	rev, dirty := "", ""
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "+dirty"
			}
		}
	}
	if rev != "" {
		return fmt.Sprintf("%s (%s%s)", v, rev, dirty)
	}
	return v
}
