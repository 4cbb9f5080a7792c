package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/moat-sandbox/moat/sandbox"
)

func init() { addCommand(newSandboxCmd) }

func newSandboxCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "sandbox",
		Short: "Keep a sandbox alive and run many commands in it (create, get, list, exec, delete)",
		Long: `A sandbox created here keeps one policy, one broker allowance and one
journal across many commands: an agent harness creates it, runs its shell
tool, tests and builds in it with exec, and deletes it at the end. Each
sandbox has its own supervisor process, which owns the namespaces, the
broker and the journal's key; if the supervisor dies, the sandbox dies.

State lives in $MOAT_STATE_DIR, else /var/lib/moat for root and
$XDG_STATE_HOME/moat for users.`,
		Example: `  moat sandbox create --name agent1 --policy examples/agent-workspace.yaml
  moat sandbox exec agent1 -- sh -c 'echo hello'
  moat sandbox get agent1 -o json
  moat sandbox delete agent1`,
	}
	cmd.AddCommand(newSandboxCreateCmd(), newSandboxGetCmd(), newSandboxListCmd(), newSandboxExecCmd(), newSandboxDeleteCmd())
	return cmd
}

func sandboxErr(err error) error {
	var re *sandbox.RefusedError
	if errors.As(err, &re) {
		return exitf(ExitRefused, "%v", err)
	}
	if errors.Is(err, sandbox.ErrNotFound) {
		return exitf(1, "%v", err)
	}
	return exitf(ExitRefused, "%v", err)
}

func newSandboxCreateCmd() *cobra.Command {
	var name, pol, backend, out string
	cmd := &cobra.Command{
		Use:     "create --name N --policy F [--backend B]",
		Short:   "Create a sandbox and return once it is Ready (or failed, with the reason)",
		Example: `  moat sandbox create --name agent1 --policy examples/minimal.yaml`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if name == "" || pol == "" {
				return exitf(ExitRefused, "refused: --name and --policy are required (e.g. moat sandbox create --name agent1 --policy examples/minimal.yaml)")
			}
			if _, err := loadPolicy(pol); err != nil {
				return err
			}
			st, err := sandbox.Create(context.Background(), sandbox.CreateOptions{Name: name, PolicyPath: pol, Backend: backend})
			if err != nil {
				return sandboxErr(fmt.Errorf("sandbox %s: %w", name, err))
			}
			return printState(cmd.OutOrStdout(), out, st)
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "sandbox name (a-z, 0-9, '.', '_', '-')")
	cmd.Flags().StringVar(&pol, "policy", "", "policy file")
	cmd.Flags().StringVar(&backend, "backend", "", "backend (overrides the policy's; never falls back)")
	cmd.Flags().StringVarP(&out, "output", "o", "", "output format: json")
	return cmd
}

func newSandboxGetCmd() *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:     "get NAME [-o json]",
		Short:   "Show a sandbox: phase, backend, measured properties, journal, allowance, processes",
		Example: `  moat sandbox get agent1 -o json`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := sandbox.Get(args[0])
			if err != nil {
				return sandboxErr(fmt.Errorf("sandbox %s: %w", args[0], err))
			}
			return printState(cmd.OutOrStdout(), out, st)
		},
	}
	cmd.Flags().StringVarP(&out, "output", "o", "", "output format: json")
	return cmd
}

func newSandboxListCmd() *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:     "list [-o json]",
		Short:   "List sandboxes",
		Example: `  moat sandbox list -o json`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			all, err := sandbox.List()
			if err != nil {
				return sandboxErr(err)
			}
			if out == "json" {
				if all == nil {
					all = []*sandbox.State{}
				}
				return writeJSON(cmd.OutOrStdout(), all)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tPHASE\tBACKEND\tCREATED\tREQUESTS")
			for _, s := range all {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d/%d\n", s.Name, s.Phase, s.Backend, s.Created.Format(time.RFC3339), s.AllowanceUsed, s.AllowanceMax)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVarP(&out, "output", "o", "", "output format: json")
	return cmd
}

func newSandboxExecCmd() *cobra.Command {
	var tty bool
	cmd := &cobra.Command{
		Use:   "exec NAME [--tty] -- CMD [ARG…]",
		Short: "Run a command in a sandbox, under the same confinement as moat run; exit code is the command's",
		Example: `  moat sandbox exec agent1 -- sh -c 'go test ./...'
  moat sandbox exec agent1 --tty -- sh`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			argv := args[1:]
			if at := cmd.ArgsLenAtDash(); at >= 1 {
				argv = args[at:]
			}
			if len(argv) == 0 {
				return exitf(ExitRefused, "refused: no command given (usage: moat sandbox exec NAME -- CMD [ARG…])")
			}
			code, err := sandbox.Exec(context.Background(), args[0], argv, tty, os.Stdin, os.Stdout, os.Stderr)
			if err != nil {
				return sandboxErr(fmt.Errorf("sandbox %s: %w", args[0], err))
			}
			return exitCode(code)
		},
	}
	cmd.Flags().BoolVar(&tty, "tty", false, "give the command a pty that moat relays (automatic when stdin or stdout is a terminal; the caller's terminal never enters the sandbox)")
	return cmd
}

func newSandboxDeleteCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "delete NAME",
		Short:   "Terminate a sandbox's processes, close its journal and remove its state (idempotent)",
		Example: `  moat sandbox delete agent1`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			found, err := sandbox.Delete(args[0])
			if err != nil {
				return sandboxErr(fmt.Errorf("sandbox %s: %w", args[0], err))
			}
			if !found {
				fmt.Fprintf(cmd.ErrOrStderr(), "moat: sandbox %s does not exist; nothing to delete\n", args[0])
			}
			return nil
		},
	}
	return cmd
}

func printState(w io.Writer, out string, st *sandbox.State) error {
	if out == "json" {
		return writeJSON(w, st)
	}
	if out != "" {
		return exitf(ExitRefused, "unknown output format %q (use json)", out)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "name:\t%s\n", st.Name)
	fmt.Fprintf(tw, "phase:\t%s\n", st.Phase)
	if st.Error != "" {
		fmt.Fprintf(tw, "error:\t%s\n", st.Error)
	}
	fmt.Fprintf(tw, "backend:\t%s\n", st.Backend)
	for _, np := range st.Properties.Named() {
		state := "enforced"
		if np.Unavailable {
			state = "unavailable"
		} else if !np.Enforced {
			state = "NOT enforced"
		}
		fmt.Fprintf(tw, "  %s:\t%s (%s)\n", np.Name, state, np.Mechanism)
	}
	fmt.Fprintf(tw, "policy sha256:\t%s\n", st.PolicySHA256)
	fmt.Fprintf(tw, "journal:\t%s\n", st.Journal)
	fmt.Fprintf(tw, "key:\t%s\n", st.KeyID)
	fmt.Fprintf(tw, "requests:\t%d of %d\n", st.AllowanceUsed, st.AllowanceMax)
	fmt.Fprintf(tw, "created:\t%s\n", st.Created.Format(time.RFC3339))
	for id, pid := range st.Processes {
		fmt.Fprintf(tw, "process:\t%s (host pid %d)\n", id, pid)
	}
	return tw.Flush()
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
