package cli

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/internal/term"
	"github.com/moat-sandbox/moat/policy"
	"github.com/moat-sandbox/moat/sandbox"
)

func init() { addCommand(newRunCmd) }

func newRunCmd() *cobra.Command {
	var (
		policyPath string
		backend    string
		runInfo    string
		auditDir   string
		explain    bool
		output     *outputFlag
	)
	cmd := &cobra.Command{
		Use:   "run [--policy F] [--backend B] [--audit-dir D] [--run-info F] [--explain] [-o json|yaml] [--] CMD [ARG…]",
		Short: "Run one workload in a confirmed sandbox; the exit code is the workload's",
		Long: `Run one workload in a sandbox built from the policy. Before the workload
starts, moat measures the boundary from inside (it tries each violation and
its allowed counterpart) and refuses with exit 125 unless every required
property holds. The workload's only way out is the inference broker on
127.0.0.1 inside the sandbox; every request is journaled and signed before
it leaves. Everything after the first argument that is not one of moat's
flags is the command; "--" may mark where it starts.

The journal goes to the policy's audit.dir (default: .moat/runs under the
current directory); --audit-dir replaces it for this run.

With -o json or -o yaml, moat prints a summary on its stdout after the
workload has exited (the workload's own output comes first, unchanged):
run id, run directory, journal, key fingerprint, exit code and the
journal's terminal reason.

Exit codes: the workload's own (128+n when signal n killed it); 125 when
moat refused or failed; 126 when the command cannot be executed; 127 when
it is not found.`,
		Example: `  moat run --policy examples/minimal.yaml -- sh -c 'id -u; grep -E "NoNewPrivs|CapEff|Seccomp:" /proc/self/status'
  moat run --explain --run-info /tmp/run.json /bin/true
  moat run --audit-dir /var/tmp/moat-runs -o json -- /bin/true`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			audit.Prewarm() // the journal's key is made in a moment
			if err := checkBackend(backend); err != nil {
				return err
			}
			pol, err := loadPolicy(policyPath)
			if err != nil {
				return err
			}
			if backend == "" {
				if err := handOffBackend(pol.Backend); err != nil {
					return err
				}
			}
			if err := setAuditDir(pol, auditDir); err != nil {
				return err
			}
			var runDir string
			opts := sandbox.RunOptions{
				Policy: pol, Backend: backend, Argv: args, RunInfoPath: runInfo,
				Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr,
				// The workload gets a pty of its own, relayed, whenever
				// moat is on a terminal: the caller's never enters.
				Terminal:  term.IsTerminal(os.Stdin) || term.IsTerminal(os.Stdout),
				OnJournal: func(dir string) { runDir = dir },
			}
			if explain {
				opts.Explain = os.Stderr
			}
			code, err := sandbox.Run(context.Background(), opts)
			if err != nil {
				var re *sandbox.RefusedError
				if errors.As(err, &re) {
					code = ExitRefused
				}
			}
			if output.machine() {
				if werr := output.write(cmd.OutOrStdout(), newRunSummary(runDir, code, err)); werr != nil {
					return werr
				}
			}
			if err != nil {
				return exitf(code, "%v", err)
			}
			return exitCode(code)
		},
	}
	f := cmd.Flags()
	f.SetInterspersed(false) // everything after the command is the command's
	f.StringVar(&policyPath, "policy", "", "policy file (default: the built-in default policy)")
	f.StringVar(&backend, "backend", "", "backend to use (overrides the policy's; never falls back)")
	f.StringVar(&auditDir, "audit-dir", "", "directory for the run's journal (overrides the policy's audit.dir; must lie outside every grant)")
	f.StringVar(&runInfo, "run-info", "", "write run info (run id, journal, public key, host pid, properties) here once Ready")
	f.BoolVar(&explain, "explain", false, "print the measured properties and their mechanisms before the workload starts")
	addLogLevelFlag(cmd)
	output = addOutput(cmd)
	return cmd
}

// runSummary is what moat run -o and moat sandbox exec -o print after the
// command has exited.
type runSummary struct {
	RunID    string `json:"run_id,omitempty"`
	Sandbox  string `json:"sandbox,omitempty"` // sandbox exec only
	RunDir   string `json:"run_dir,omitempty"`
	Journal  string `json:"journal,omitempty"`
	KeyID    string `json:"keyid,omitempty"`
	ExitCode int    `json:"exit_code"`
	// Reason is the journal's terminal reason for moat run ("completed",
	// "exec_failed", "refused", …; "incomplete" if it has none) and the
	// command's outcome for sandbox exec, whose journal stays open.
	Reason audit.TerminalReason `json:"reason"`
	Error  string               `json:"error,omitempty"` // moat's own message, as on stderr
}

// newRunSummary reads the run directory's journal (if the run got that
// far) for moat run -o.
func newRunSummary(runDir string, code int, err error) runSummary {
	s := runSummary{ExitCode: code, Reason: audit.ReasonRefused}
	if err != nil {
		s.Error = err.Error()
	}
	if runDir == "" {
		return s
	}
	sum := audit.Summarize(runDir)
	s.RunID, s.RunDir, s.KeyID, s.Reason = sum.ID, runDir, sum.KeyID, sum.Reason
	s.Journal = filepath.Join(runDir, audit.JournalFile)
	return s
}

// checkBackend refuses a backend name that is not registered, before any
// work, listing the known ones (boundary's registry, and the backends of
// moat-kubernetes); a backend of moat-kubernetes that this binary lacks
// hands the command to it (handOff).
func checkBackend(name string) error {
	if name == "" {
		return nil
	}
	_, err := boundary.Lookup(name)
	var ue *boundary.UnknownBackendError
	if errors.As(err, &ue) {
		if _, ok := elsewhere[name]; ok {
			return handOff(name)
		}
		return exitf(ExitRefused, "refused: --backend: unknown backend %q (known: %s)", ue.Name, joinNames(knownBackends()))
	}
	if err != nil {
		return exitf(ExitRefused, "refused: --backend: %v", err)
	}
	return nil
}

// joinNames lists names as every refusal of an unknown value lists the
// known ones: "a, b, c".
func joinNames(names []string) string { return strings.Join(names, ", ") }

// setAuditDir applies --audit-dir to a loaded policy and checks, before
// any work, that it lies outside every grant and can be created.
func setAuditDir(pol *policy.Policy, dir string) error {
	if dir != "" {
		abs, err := filepath.Abs(dir)
		if err != nil {
			return exitf(ExitRefused, "refused: --audit-dir %s: %v", dir, err)
		}
		pol.Audit.Dir = abs
	}
	// Checked against the grants before it is created, as the run will.
	if _, err := pol.ResolveGrants(); err != nil {
		if dir != "" {
			return exitf(ExitRefused, "refused: --audit-dir %s: %v", dir, err)
		}
		return exitf(ExitRefused, "refused: %v", err)
	}
	if err := os.MkdirAll(pol.Audit.Dir, 0o700); err != nil {
		return exitf(ExitRefused, "refused: cannot create the audit directory %s: %v; run moat from a directory you can write to, or pass --audit-dir DIR (or set audit.dir in the policy; default: %s under the current directory)",
			pol.Audit.Dir, err, policy.DefaultAuditDir)
	}
	return nil
}

// loadPolicy loads a policy file, or the built-in default when path is "".
// A bad policy is a refusal before the journal opens: exit 125 with every
// error on stderr.
func loadPolicy(path string) (*policy.Policy, error) {
	if path == "" {
		return policy.Default(), nil
	}
	pol, err := policy.Load(path)
	if err != nil {
		return nil, exitf(ExitRefused, "refused: policy %s: %v", path, err)
	}
	return pol, nil
}
