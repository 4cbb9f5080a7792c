package cli

import (
	"context"
	"errors"
	"os"

	"github.com/spf13/cobra"

	_ "github.com/moat-sandbox/moat/boundary/gvisor" // registers the gvisor backend
	_ "github.com/moat-sandbox/moat/boundary/native" // registers the native backend
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
		explain    bool
	)
	cmd := &cobra.Command{
		Use:   "run [--policy F] [--backend B] [--run-info F] [--explain] -- CMD [ARG…]",
		Short: "Run one workload in a confirmed sandbox; the exit code is the workload's",
		Long: `Run one workload in a sandbox built from the policy. Before the workload
starts, moat measures the boundary from inside (it tries each violation and
its allowed counterpart) and refuses with exit 125 unless every required
property holds. The workload's only way out is the inference broker on
127.0.0.1 inside the sandbox; every request is journaled and signed before
it leaves.

Exit codes: the workload's own; 125 when moat refused or failed; 126 when
the command cannot be executed; 127 when it is not found.`,
		Example: `  moat run --policy examples/minimal.yaml -- sh -c 'id -u; grep -E "NoNewPrivs|CapEff|Seccomp:" /proc/self/status'
  moat run --explain --run-info /tmp/run.json -- /bin/true`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			pol, err := loadPolicy(policyPath)
			if err != nil {
				return err
			}
			opts := sandbox.RunOptions{
				Policy: pol, Backend: backend, Argv: args, RunInfoPath: runInfo,
				Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr,
				// The workload gets a pty of its own, relayed, whenever
				// moat is on a terminal: the caller's never enters.
				Terminal: term.IsTerminal(os.Stdin) || term.IsTerminal(os.Stdout),
			}
			if explain {
				opts.Explain = os.Stderr
			}
			code, err := sandbox.Run(context.Background(), opts)
			if err != nil {
				var re *sandbox.RefusedError
				if errors.As(err, &re) {
					return exitf(ExitRefused, "%v", err)
				}
				return exitf(code, "%v", err)
			}
			return exitCode(code)
		},
	}
	f := cmd.Flags()
	f.SetInterspersed(false) // everything after the command is the command's
	f.StringVar(&policyPath, "policy", "", "policy file (default: the built-in default policy)")
	f.StringVar(&backend, "backend", "", "backend to use (overrides the policy's; never falls back)")
	f.StringVar(&runInfo, "run-info", "", "write run info (run id, journal, public key, host pid, properties) here once Ready")
	f.BoolVar(&explain, "explain", false, "print the measured properties and their mechanisms before the workload starts")
	addLogLevelFlag(cmd)
	return cmd
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
