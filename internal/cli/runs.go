package cli

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/policy"
)

func init() { addCommand(newRunsCmd) }

func newRunsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "runs",
		Short: "List the runs in an audit directory and show one, with its journal verified",
		Long: `Every moat run and every sandbox writes a run directory (journal.jsonl and
pubkey.pem) into its audit directory: the policy's audit.dir, by default
` + policy.DefaultAuditDir + ` under the current directory. These commands read them.`,
		Example: `  moat runs list
  moat runs show 20261130T120000Z-0123456789ab --key-fingerprint 9f2c…(64 hex digits)`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newRunsListCmd(), newRunsShowCmd())
	return cmd
}

// auditDirFlag adds --audit-dir with the default audit directory.
func auditDirFlag(cmd *cobra.Command, dir *string) {
	cmd.Flags().StringVar(dir, "audit-dir", policy.DefaultAuditDir, "the audit directory that holds the run directories")
}

func newRunsListCmd() *cobra.Command {
	var dir string
	var output *outputFlag
	cmd := &cobra.Command{
		Use:   "list [--audit-dir D] [-o json|yaml]",
		Short: "List the runs of an audit directory, oldest first",
		Long: `List each run directory of the audit directory: run id, start time,
backend, how it ended (the journal's terminal reason and exit code, or
"incomplete" while it runs or after it was killed) and its number of
inference requests. The journals are read, not verified: "moat runs show"
verifies one.`,
		Example: `  moat runs list
  moat runs list --audit-dir /var/tmp/moat-runs -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			runs, err := audit.ListRuns(dir)
			if err != nil {
				return exitf(ExitRefused, "runs list: %v", err)
			}
			if output.machine() {
				return output.write(cmd.OutOrStdout(), runs)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "RUN\tSTARTED\tBACKEND\tENDED\tREQUESTS")
			for _, r := range runs {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\n", r.ID, started(r), dash(r.Backend), ended(r), r.Counts.Requested)
			}
			return tw.Flush()
		},
	}
	auditDirFlag(cmd, &dir)
	output = addOutput(cmd)
	return cmd
}

func newRunsShowCmd() *cobra.Command {
	var dir, fingerprint string
	var requirePin bool
	var output *outputFlag
	cmd := &cobra.Command{
		Use:   "show RUN [--audit-dir D] [--key-fingerprint HEX] [--require-pin] [-o json|yaml]",
		Short: "Show one run and verify its journal: exit 0 complete, 2 incomplete, 1 invalid, 3 unpinned",
		Long: `Show the run RUN (a run id in the audit directory, or a run directory's
path): its summary, as "moat runs list" reads it, then its journal verified
as "moat audit verify" does, against pubkey.pem in the run directory. Pin
the key with --key-fingerprint HEX (what moat run printed); without it the
verdict is printed with "` + unpinnedWarning + `" on stderr.

Exit codes are "moat audit verify"'s: 0 complete, 2 incomplete, 1 invalid,
3 unpinned with --require-pin; 125 when there is no such run.`,
		Example: `  moat runs show 20261130T120000Z-0123456789ab
  moat runs show .moat/runs/20261130T120000Z-0123456789ab --key-fingerprint 9f2c…(64 hex digits) -o json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			pin, err := parseFingerprint(fingerprint)
			if err != nil {
				return exitf(exitUsage, "--key-fingerprint: %v", err)
			}
			runDir, err := findRun(dir, args[0])
			if err != nil {
				return err
			}
			sum := audit.Summarize(runDir)
			journal := filepath.Join(runDir, audit.JournalFile)
			key := filepath.Join(runDir, audit.PublicKeyFile)
			res, pinned := audit.VerifyFiles(journal, key, pin)
			code := res.Status.ExitCode()
			if !pinned && code != ExitInvalid {
				fmt.Fprintf(cmd.ErrOrStderr(), "moat: %s: the key came from %s, not from a pin; pass --key-fingerprint with the keyid that moat run printed (this key's is %s)\n", unpinnedWarning, key, res.KeyID)
				if requirePin {
					fmt.Fprintf(cmd.ErrOrStderr(), "moat: runs show: --require-pin: exit %d instead of %d\n", exitUnpinned, code)
					code = exitUnpinned
				}
			}
			if output.machine() {
				if err := output.write(cmd.OutOrStdout(), runShowJSON{RunSummary: sum,
					Verify: verifyJSON{Result: res, ExitCode: code, Journal: journal, Pinned: pinned}}); err != nil {
					return err
				}
				return exitCode(code)
			}
			var verdict string
			switch res.Status {
			case audit.Complete:
				verdict = fmt.Sprintf("complete, %d records, key %s%s", res.Records, res.KeyID, pinNote(pinned))
			case audit.Incomplete:
				verdict = fmt.Sprintf("incomplete: %s (key %s%s)", res.Reason, res.KeyID, pinNote(pinned))
			default:
				verdict = "INVALID: " + res.Reason
			}
			if err := printRun(cmd.OutOrStdout(), sum, verdict); err != nil {
				return err
			}
			return exitCode(code)
		},
	}
	auditDirFlag(cmd, &dir)
	cmd.Flags().StringVar(&fingerprint, "key-fingerprint", "", "the run key's fingerprint as moat run printed it: sha256 of the raw Ed25519 key, 64 hex digits")
	cmd.Flags().BoolVar(&requirePin, "require-pin", false, "exit 3 instead of 0 or 2 when no --key-fingerprint is given")
	output = addOutput(cmd)
	return cmd
}

// runShowJSON is what moat runs show -o prints.
type runShowJSON struct {
	audit.RunSummary
	Verify verifyJSON `json:"verify"`
}

// findRun resolves RUN: a run id inside the audit directory, or the path
// of a run directory.
func findRun(auditDir, run string) (string, error) {
	cands := []string{run}
	if !strings.ContainsRune(run, filepath.Separator) && run != "." && run != ".." {
		cands = []string{filepath.Join(auditDir, run), run}
	}
	for _, c := range cands {
		fi, err := os.Stat(c)
		if err == nil && fi.IsDir() {
			return c, nil
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return "", exitf(ExitRefused, "runs show: %v", err)
		}
	}
	return "", exitf(ExitRefused, "no run %s in %s (moat runs list --audit-dir %s shows the runs)", run, auditDir, auditDir)
}

func printRun(w io.Writer, r audit.RunSummary, verdict string) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "run:\t%s\n", r.ID)
	fmt.Fprintf(tw, "dir:\t%s\n", r.Dir)
	fmt.Fprintf(tw, "started:\t%s\n", started(r))
	fmt.Fprintf(tw, "backend:\t%s\n", dash(r.Backend))
	fmt.Fprintf(tw, "ended:\t%s\n", ended(r))
	c := r.Counts
	fmt.Fprintf(tw, "requests:\t%d (completed %d, refused %d, failed %d)\n", c.Requested, c.Completed, c.Refused, c.Failed)
	fmt.Fprintf(tw, "processes:\t%d\n", c.Processes)
	if r.Problem != "" {
		fmt.Fprintf(tw, "read:\t%s\n", r.Problem)
	}
	fmt.Fprintf(tw, "verified:\t%s\n", verdict)
	return tw.Flush()
}

func started(r audit.RunSummary) string {
	if r.Started.IsZero() {
		return "-"
	}
	return r.Started.Format(time.RFC3339)
}

func ended(r audit.RunSummary) string {
	if r.ExitCode == nil {
		return string(r.Reason)
	}
	return fmt.Sprintf("%s (exit %d)", r.Reason, *r.ExitCode)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
