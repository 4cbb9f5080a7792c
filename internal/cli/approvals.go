package cli

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/moat-sandbox/moat/broker"
	"github.com/moat-sandbox/moat/policy"
	"github.com/moat-sandbox/moat/sandbox"
)

func init() { addCommand(newApprovalsCmd) }

// approvalsTarget is where an approvals command is sent: a sandbox's
// supervisor or a running moat run's control socket.
type approvalsTarget struct {
	sandbox, run string
}

func (a *approvalsTarget) flags(cmd *cobra.Command) {
	cmd.Flags().StringVar(&a.sandbox, "sandbox", "", "the sandbox N (moat sandbox create) whose held requests to decide")
	cmd.Flags().StringVar(&a.run, "run", "", "the run directory of a running moat run (default: the only one under ./"+policy.DefaultAuditDir+" whose control socket answers)")
}

// socket resolves the control socket.
func (a *approvalsTarget) socket() (string, error) {
	switch {
	case a.sandbox != "" && a.run != "":
		return "", exitf(ExitRefused, "refused: --sandbox and --run both given; give one")
	case a.sandbox != "":
		s, err := sandbox.SandboxControlSock(a.sandbox)
		if err != nil {
			return "", exitf(ExitRefused, "%v", err)
		}
		return s, nil
	case a.run != "":
		if fi, err := os.Stat(a.run); err == nil && fi.Mode()&os.ModeSocket != 0 {
			return a.run, nil
		}
		return filepath.Join(a.run, sandbox.RunControlSock), nil
	}
	socks, _ := filepath.Glob(filepath.Join(policy.DefaultAuditDir, "*", sandbox.RunControlSock))
	var live []string
	for _, s := range socks {
		if _, err := sandbox.SendApprovalCommand(s, broker.ApprovalCommand{Op: broker.ApprovalOpList}); err == nil {
			live = append(live, s)
		}
	}
	switch len(live) {
	case 1:
		return live[0], nil
	case 0:
		return "", exitf(ExitRefused, "no running moat run with approval rules under ./%s; give --run RUNDIR (the run directory moat run printed) or --sandbox N", policy.DefaultAuditDir)
	}
	return "", exitf(ExitRefused, "%d running runs with approval rules under ./%s (%s); give --run RUNDIR", len(live), policy.DefaultAuditDir, strings.Join(live, ", "))
}

func (a *approvalsTarget) send(cmd broker.ApprovalCommand) (broker.ApprovalReply, error) {
	sock, err := a.socket()
	if err != nil {
		return broker.ApprovalReply{}, err
	}
	rep, err := sandbox.SendApprovalCommand(sock, cmd)
	if err != nil {
		return rep, exitf(ExitRefused, "%v", err)
	}
	return rep, nil
}

func newApprovalsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "approvals",
		Short: "List, show, approve or deny requests held for approval (policy approvals.rules)",
		Long: `A request that matches one of the policy's approvals.rules is held by the
broker until an operator decides it here, or until approvals.timeout
(default 5m), when it is refused. These commands talk to a running
moat run (its control socket in the run directory: --run RUNDIR, or the
only one under ./.moat/runs) or to a sandbox (--sandbox N).

approve takes the approval id and the request digest that show printed:
the request leaves only if it is still exactly those bytes, for the same
principal and run. A digest that does not match, a second decision on
the same id, or bytes that changed are journaled as a substitution and
the held request is refused.`,
		Example: `  moat approvals list
  moat approvals show moatapr_0123456789abcdef01234567
  moat approvals approve moatapr_0123456789abcdef01234567 --digest 9f86d081…
  moat approvals deny moatapr_0123456789abcdef01234567 --sandbox agent1`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newApprovalsListCmd(), newApprovalsShowCmd(), newApprovalsDecideCmd(true), newApprovalsDecideCmd(false))
	return cmd
}

func newApprovalsListCmd() *cobra.Command {
	var t approvalsTarget
	var output *outputFlag
	cmd := &cobra.Command{
		Use:   "list [--sandbox N | --run RUNDIR] [-o json|yaml]",
		Short: "List the held requests, oldest first",
		Example: `  moat approvals list
  moat approvals list --sandbox agent1 -o json
  moat approvals list --run .moat/runs/run-20261201-020000-abcd`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rep, err := t.send(broker.ApprovalCommand{Op: broker.ApprovalOpList})
			if err != nil {
				return err
			}
			if rep.Held == nil {
				rep.Held = []broker.HeldRequest{}
			}
			if output.machine() {
				return output.write(cmd.OutOrStdout(), rep.Held)
			}
			writeHeldTable(cmd.OutOrStdout(), rep.Held)
			return nil
		},
	}
	t.flags(cmd)
	output = addOutput(cmd)
	return cmd
}

// shown makes a workload-chosen string safe for the operator's terminal:
// control characters (C0 but LF and tab, DEL, C1) and format characters
// (bidirectional overrides, zero-width marks) are written as \uXXXX,
// invalid UTF-8 bytes as \xNN, so that no request can drive or reorder
// the terminal that shows it. -o json gives the exact bytes.
func shown(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, "\\x%02x", s[i])
		case r == '\n' || r == '\t':
			b.WriteRune(r)
		case unicode.IsControl(r) || unicode.Is(unicode.Cf, r):
			fmt.Fprintf(&b, "\\u%04x", r)
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

func writeHeldTable(w io.Writer, held []broker.HeldRequest) {
	if len(held) == 0 {
		fmt.Fprintln(w, "no request is held")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tROAD\tTARGET\tNAME\tBYTES\tEXPIRES IN\tDIGEST")
	for _, h := range held {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", h.ID, h.Road, shown(h.Target), strings.ReplaceAll(shown(h.Name), "\n", `\n`), h.RequestBytes,
			time.Until(h.Expires).Round(time.Second), h.RequestSHA256)
	}
	tw.Flush()
}

func newApprovalsShowCmd() *cobra.Command {
	var t approvalsTarget
	var output *outputFlag
	cmd := &cobra.Command{
		Use:   "show ID [--sandbox N | --run RUNDIR] [-o json|yaml]",
		Short: "Show one held request: its principal, its digest and its exact canonical bytes",
		Example: `  moat approvals show moatapr_0123456789abcdef01234567
  moat approvals show moatapr_0123456789abcdef01234567 --sandbox agent1 -o json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			rep, err := t.send(broker.ApprovalCommand{Op: broker.ApprovalOpShow, ID: args[0]})
			if err != nil {
				return err
			}
			if len(rep.Held) != 1 {
				return exitf(ExitRefused, "BUG: show answered %d requests", len(rep.Held))
			}
			h := rep.Held[0]
			if output.machine() {
				return output.write(cmd.OutOrStdout(), h)
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "approval:   %s\nrequest:    %s\nroad:       %s\ntarget:     %s\nname:       %s\nprincipal:  %s\nheld:       %s\nexpires:    %s (in %s)\nbytes:      %d\ndigest:     %s\n",
				h.ID, h.RequestID, h.Road, shown(h.Target), shown(h.Name), shown(h.PrincipalLine), h.Held.Format(time.RFC3339), h.Expires.Format(time.RFC3339),
				time.Until(h.Expires).Round(time.Second), h.RequestBytes, h.RequestSHA256)
			if h.Truncated {
				fmt.Fprintf(w, "request bytes (the first %d of %d; control and format characters shown as \\uXXXX, invalid bytes as \\xNN):\n", len(h.Request), h.RequestBytes)
			} else {
				fmt.Fprintln(w, "request bytes (exactly what leaves if approved; control and format characters shown as \\uXXXX, invalid bytes as \\xNN):")
			}
			fmt.Fprintln(w, shown(h.Request))
			if h.RequestBase64 != "" {
				fmt.Fprintln(w, "(the request is not UTF-8: invalid bytes are shown as U+FFFD above; -o json has the exact bytes in request_base64)")
			}
			fmt.Fprintf(w, "approve with: moat approvals approve %s --digest %s\n", h.ID, h.RequestSHA256)
			return nil
		},
	}
	t.flags(cmd)
	output = addOutput(cmd)
	return cmd
}

func newApprovalsDecideCmd(approve bool) *cobra.Command {
	var t approvalsTarget
	var digest, principal, runID string
	var output *outputFlag
	op := broker.ApprovalOpDeny
	use := "deny ID [--digest D] [--sandbox N | --run RUNDIR] [-o json|yaml]"
	short := "Deny a held request: it is refused and never sent"
	if approve {
		op = broker.ApprovalOpApprove
		use = "approve ID --digest D [--principal P] [--run-id R] [--sandbox N | --run RUNDIR] [-o json|yaml]"
		short = "Approve a held request: it leaves only if it is exactly the bytes of digest D"
	}
	example := "  moat approvals deny moatapr_0123456789abcdef01234567"
	if approve {
		example = "  moat approvals approve moatapr_0123456789abcdef01234567 --digest 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
	}
	cmd := &cobra.Command{
		Use:     use,
		Short:   short,
		Example: example,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if approve && digest == "" {
				return exitf(ExitRefused, "refused: approve needs --digest D, the request digest that moat approvals show printed")
			}
			rep, err := t.send(broker.ApprovalCommand{Op: op, ID: args[0], Digest: digest, Principal: principal, Run: runID})
			if err != nil {
				return err
			}
			if output.machine() {
				return output.write(cmd.OutOrStdout(), rep)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: %s\n", args[0], rep.Decision)
			return nil
		},
	}
	t.flags(cmd)
	cmd.Flags().StringVar(&digest, "digest", "", "the request digest (sha256 of the exact canonical request) that show printed")
	if approve {
		cmd.Flags().StringVar(&principal, "principal", "", "optional: the principal line show printed; a different one refuses the request")
		cmd.Flags().StringVar(&runID, "run-id", "", "optional: the run id; a different one refuses the request")
	}
	output = addOutput(cmd)
	return cmd
}
