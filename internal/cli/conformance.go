package cli

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/moat-sandbox/moat/conformance"
)

func init() { addCommand(newConformanceCmd) }

func newConformanceCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "conformance",
		Short: "Backend-neutral property scenarios, driven through the moat CLI",
	}
	var (
		backend   string
		binary    string
		scenarios []string
		out       string
	)
	run := &cobra.Command{
		Use:   "run [--backend B] [--scenario S]… [-o json]",
		Short: "Attempt each violation against a backend; require it to fail and its positive control to work",
		Long: `Runs backend-neutral scenarios against the real CLI: egress-confinement,
filesystem-confinement, privilege-floor, attribution, supervisor-loss and
smoke. Each attempts a violation, requires it to fail, and requires its
positive control to succeed. Outcomes: pass, fail, invalid (evidence
missing, e.g. a root-only check run unprivileged) or unavailable (the
backend declared the property unavailable and the policy does not require
it). Exit 0 only when every scenario is pass or unavailable.`,
		Example: `  moat conformance run --backend native
  sudo moat conformance run --backend gvisor -o json
  moat conformance run --scenario filesystem-confinement --scenario egress-confinement`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			var progress = cmd.ErrOrStderr()
			rep, err := conformance.Run(context.Background(), conformance.Options{
				Backend: backend, Binary: binary, Scenarios: scenarios, Progress: progress,
			})
			if err != nil {
				return exitf(ExitRefused, "conformance: %v", err)
			}
			switch out {
			case "json":
				err = rep.WriteJSON(cmd.OutOrStdout())
			case "":
				err = rep.WriteTable(cmd.OutOrStdout())
			default:
				return exitf(ExitRefused, "unknown output format %q (use json)", out)
			}
			if err != nil {
				return err
			}
			if !rep.OK() {
				return exitCode(1)
			}
			return nil
		},
	}
	run.Flags().StringVar(&backend, "backend", "native", "backend to test")
	run.Flags().StringVar(&binary, "binary", "", "moat binary to drive (default: this one)")
	run.Flags().StringArrayVar(&scenarios, "scenario", nil, "scenario to run (repeatable; default: all)")
	run.Flags().StringVarP(&out, "output", "o", "", "output format: json")
	cmd.AddCommand(run)
	return cmd
}
