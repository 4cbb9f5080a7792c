package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/moat-sandbox/moat/evidence"
)

func init() { addCommand(newEvidenceCmd) }

func newEvidenceCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "evidence",
		Short: "The containment evidence suite: attack a real sandbox, observe from outside, write a verifiable bundle",
	}
	cmd.AddCommand(newEvidenceRunCmd(), newEvidenceVerifyCmd())
	return cmd
}

func newEvidenceRunCmd() *cobra.Command {
	var o evidence.Options
	cmd := &cobra.Command{
		Use:   "run --out DIR [--case NAME]… [--backend B] [--probe F] [--expected-probe-sha256 H] [--binary F] [--expected-binary-sha256 H] [--source-commit C]",
		Short: "Run the containment evidence suite and write a signed bundle",
		Long: `Run the fixed hostile probe (moat-probe) in real sandboxes, one case at a
time, against a synthetic provider and host receivers that the sandbox
cannot touch, and write a bundle (report.json, report.dsse.json, report.md,
cases/, manifest.json). Outcomes come only from what the controller observes.

Exit codes: 0 every case passed; 1 some case did not pass; 125 harness error.
Print the manifest sha256 and the suite public key; pin them outside the
bundle.

Cases: ` + fmt.Sprint(evidence.CaseNames()),
		Example: `  CGO_ENABLED=0 go build -o bin/moat-probe ./cmd/moat-probe && go build -o bin/moat ./cmd/moat
  sudo bin/moat evidence run --out /var/tmp/moat-evidence
  bin/moat evidence run --out ./ev --case direct-network --case provider-redirect`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if o.Out == "" {
				return exitf(ExitRefused, "evidence run: --out DIR is required")
			}
			if o.Binary == "" {
				exe, err := os.Executable()
				if err != nil {
					return exitf(ExitRefused, "evidence run: cannot find the moat binary (%v); pass --binary", err)
				}
				o.Binary = exe
			}
			abs, err := filepath.Abs(o.Binary)
			if err != nil {
				return exitf(ExitRefused, "evidence run: %v", err)
			}
			o.Binary = abs
			if o.Probe == "" {
				o.Probe = filepath.Join(filepath.Dir(o.Binary), "moat-probe")
			}
			o.Progress = cmd.OutOrStdout()
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			res, err := evidence.Run(ctx, o)
			if err != nil {
				var he *evidence.HarnessError
				if errors.As(err, &he) {
					return exitf(ExitRefused, "evidence run: %v", err)
				}
				return exitf(ExitRefused, "evidence run: BUG: %v", err)
			}
			w := cmd.OutOrStdout()
			s := res.Report.Summary
			fmt.Fprintf(w, "\n%d pass, %d fail, %d invalid, %d insufficient; bundle %s", s.Pass, s.Fail, s.Invalid, s.Insufficient, o.Out)
			if !res.Report.Complete {
				fmt.Fprintf(w, " (a SUBSET of the cases: not full qualification)")
			}
			fmt.Fprintf(w, "\nmanifest sha256: %s\nsuite public key (keyid %s):\n%s", res.ManifestSHA256, res.Report.SuiteKeyID, res.SuitePublicKey)
			if res.Report.Source.Mismatch {
				fmt.Fprintf(w, "WARNING: declared source commit %q differs from the binary's embedded revision %q\n", res.Report.Source.Declared, res.Report.Source.Embedded)
			}
			if !res.Report.Binary.Unchanged {
				fmt.Fprintf(w, "FAILED: the moat binary changed during the run (sha256 %s at start, %s at end)\n", res.Report.Binary.SHA256, res.Report.Binary.SHA256End)
				return exitCode(1)
			}
			if s.Pass != len(res.Report.Cases) {
				return exitCode(1)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Out, "out", "", "new directory for the bundle (must not lie inside anything the sandbox can see)")
	f.StringArrayVar(&o.Cases, "case", nil, "run only this case (repeatable); the bundle is then a subset, never full qualification")
	f.StringVar(&o.Backend, "backend", "", "backend to test (default: the policy default, native)")
	f.StringVar(&o.Probe, "probe", "", "the moat-probe binary (default: moat-probe beside the moat binary)")
	f.StringVar(&o.ExpectedProbeSHA256, "expected-probe-sha256", "", "refuse to start unless the probe has this sha256")
	f.StringVar(&o.Binary, "binary", "", "the moat binary to test (default: this one)")
	f.StringVar(&o.ExpectedBinarySHA256, "expected-binary-sha256", "", "refuse to start unless the binary has this sha256")
	f.StringVar(&o.SourceCommit, "source-commit", "", "the source commit the binary is declared to come from (recorded; compared with the embedded one)")
	return cmd
}

func newEvidenceVerifyCmd() *cobra.Command {
	var pin, output string
	cmd := &cobra.Command{
		Use:   "verify DIR [--manifest-sha256 HEX]",
		Short: "Verify an evidence bundle offline and recompute every outcome",
		Long: `Check a bundle offline: the manifest (and its pinned sha256), the report's
DSSE signature, the planned case list, every journal against its pinned run
key, every provider event against the signed records, and every outcome
recomputed from the raw observations.

Exit codes: 0 valid and complete; 2 valid but a --case subset; 1 invalid.`,
		Example: `  moat evidence verify /var/tmp/moat-evidence --manifest-sha256 3f1c…`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			res := evidence.VerifyBundle(args[0], pin)
			w := cmd.OutOrStdout()
			if output == "json" {
				b, err := json.MarshalIndent(res, "", "  ")
				if err != nil {
					return exitf(ExitInvalid, "BUG: %v", err)
				}
				fmt.Fprintf(w, "%s\n", b)
				return exitCode(res.ExitCode())
			} else if output != "" {
				return exitf(ExitRefused, "evidence verify: -o %q: want json", output)
			}
			switch res.Verdict {
			case evidence.VerdictInvalid:
				for _, p := range res.Problems {
					fmt.Fprintf(cmd.ErrOrStderr(), "moat: evidence verify: %s\n", p)
				}
				fmt.Fprintf(w, "INVALID: %d problem(s); do not rely on this bundle\n", len(res.Problems))
			case evidence.VerdictSubset:
				fmt.Fprintf(w, "valid SUBSET (%d planned cases; not full qualification): %d pass, %d fail, %d invalid, %d insufficient; manifest sha256 %s; suite keyid %s\n",
					res.Planned, res.Summary.Pass, res.Summary.Fail, res.Summary.Invalid, res.Summary.Insufficient, res.ManifestSHA256, res.SuiteKeyID)
			default:
				fmt.Fprintf(w, "valid and complete: %d pass, %d fail, %d invalid, %d insufficient; manifest sha256 %s; suite keyid %s\n",
					res.Summary.Pass, res.Summary.Fail, res.Summary.Invalid, res.Summary.Insufficient, res.ManifestSHA256, res.SuiteKeyID)
			}
			return exitCode(res.ExitCode())
		},
	}
	cmd.Flags().StringVar(&pin, "manifest-sha256", "", "the manifest sha256 pinned outside the bundle")
	cmd.Flags().StringVarP(&output, "output", "o", "", "json: print the result as JSON")
	return cmd
}
