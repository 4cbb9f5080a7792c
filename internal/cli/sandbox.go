package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/sandbox"
)

func init() { addCommand(newSandboxCmd) }

func newSandboxCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "sandbox",
		Short: "Keep a sandbox alive and run many commands in it (create, get, list, exec, delete, reload-lockfiles)",
		Long: `A sandbox created here keeps one policy, one broker allowance and one
journal across many commands: an agent harness creates it, runs its shell
tool, tests and builds in it with exec, and deletes it at the end. Each
sandbox has its own supervisor process, which owns the namespaces, the
broker and the journal's key; if the supervisor dies, the sandbox dies.

A sandbox that does not exist is refused with exit 125 ("no sandbox named
N") by get, exec and delete alike; delete --ignore-not-found makes that 0.

State lives in $MOAT_STATE_DIR, else /var/lib/moat for root and
$XDG_STATE_HOME/moat for users.`,
		Example: `  moat sandbox create agent1 --policy examples/agent-workspace.yaml
  moat sandbox exec agent1 sh -c 'echo hello'
  moat sandbox get agent1 -o json
  moat sandbox reload-lockfiles agent1
  moat sandbox delete agent1`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newSandboxCreateCmd(), newSandboxGetCmd(), newSandboxListCmd(), newSandboxExecCmd(), newSandboxDeleteCmd(), newSandboxReloadLockfilesCmd())
	return cmd
}

// sandboxErr maps a sandbox package error to its exit code: 125 for every
// refusal and failure of moat's own, a missing sandbox included.
func sandboxErr(err error) error { return exitf(ExitRefused, "%v", err) }

func newSandboxCreateCmd() *cobra.Command {
	var name, pol, backend, auditDir, parent string
	var maxTokens int64
	var output *outputFlag
	cmd := &cobra.Command{
		Use:   "create NAME --policy F [--backend B] [--audit-dir D] [--parent P] [--max-tokens N] [-o json|yaml]",
		Short: "Create a sandbox and return once it is Ready (or failed, with the reason)",
		Long: `Create a sandbox named NAME (1-63 characters of a-z, 0-9, '.', '_', '-')
from the policy F, and return once it is Ready, or with exit 125 and the
reason. --name N is accepted in place of NAME. The journal goes to the
policy's audit.dir, or to --audit-dir D.

Budgets: every sandbox has an account in a budget ledger, capped by its
policy's inference.max_requests and by --max-tokens N output tokens (0,
the default: no token cap of its own). With --parent P the sandbox is a
child of the Ready sandbox P: each of its model requests is also charged
to P and to P's ancestors, reserved (one request and its max_tokens)
atomically against every one of them before it leaves and settled with
the provider's reported output tokens, so children running at the same
time can never spend more than P's budget together. A request whose
outcome is uncertain (the provider failed after the send, a timeout, a
crash) stays charged in full.`,
		Example: `  moat sandbox create agent1 --policy examples/minimal.yaml
  moat sandbox create agent1 --policy examples/agent-workspace.yaml --audit-dir /var/tmp/moat-runs -o json
  moat sandbox create lead --policy team.yaml --max-tokens 200000
  moat sandbox create worker1 --policy worker.yaml --parent lead`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 {
				if name != "" && name != args[0] {
					return exitf(ExitRefused, "refused: two names given (%s and --name %s); give one", args[0], name)
				}
				name = args[0]
			}
			if name == "" || pol == "" {
				return exitf(ExitRefused, "refused: a name and --policy are required (e.g. moat sandbox create agent1 --policy examples/minimal.yaml)")
			}
			if err := sandbox.ValidateName(name); err != nil {
				return exitf(ExitRefused, "refused: %v", err)
			}
			if err := checkBackend(backend); err != nil {
				return err
			}
			p, err := loadPolicy(pol)
			if err != nil {
				return err
			}
			if backend == "" {
				// The supervisor is this binary: it must have the backend.
				if err := handOffBackend(p.Backend); err != nil {
					return err
				}
			}
			if err := setAuditDir(p, auditDir); err != nil {
				return err
			}
			if auditDir != "" {
				auditDir = p.Audit.Dir // absolute
			}
			if maxTokens < 0 {
				return exitf(ExitRefused, "refused: --max-tokens %d: want a count of output tokens, 0 for no cap of the sandbox's own", maxTokens)
			}
			st, err := sandbox.Create(context.Background(), sandbox.CreateOptions{Name: name, PolicyPath: pol, Backend: backend, AuditDir: auditDir,
				Parent: parent, MaxTokens: maxTokens})
			if err != nil {
				return sandboxErr(fmt.Errorf("sandbox %s: %w", name, err))
			}
			return printState(cmd.OutOrStdout(), output, st)
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "sandbox name (the same as NAME; a-z, 0-9, '.', '_', '-')")
	cmd.Flags().StringVar(&pol, "policy", "", "policy file")
	cmd.Flags().StringVar(&backend, "backend", "", "backend (overrides the policy's; never falls back)")
	cmd.Flags().StringVar(&auditDir, "audit-dir", "", "directory for the sandbox's journal (overrides the policy's audit.dir; must lie outside every grant)")
	cmd.Flags().StringVar(&parent, "parent", "", "a Ready sandbox whose budget this one draws on: its requests and output tokens are charged to the parent and every ancestor too")
	cmd.Flags().Int64Var(&maxTokens, "max-tokens", 0, "cap on this sandbox's output tokens (its children's included); 0: no cap of its own")
	output = addOutput(cmd)
	return cmd
}

func newSandboxGetCmd() *cobra.Command {
	var output *outputFlag
	cmd := &cobra.Command{
		Use:   "get NAME [-o json|yaml]",
		Short: "Show a sandbox: phase, backend, measured properties, journal, allowance, processes",
		Example: `  moat sandbox get agent1
  moat sandbox get agent1 -o json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := sandbox.Get(args[0])
			if err != nil {
				return sandboxErr(err)
			}
			return printState(cmd.OutOrStdout(), output, st)
		},
	}
	output = addOutput(cmd)
	return cmd
}

func newSandboxListCmd() *cobra.Command {
	var output *outputFlag
	cmd := &cobra.Command{
		Use:   "list [-o json|yaml]",
		Short: "List sandboxes",
		Example: `  moat sandbox list
  moat sandbox list -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			all, err := sandbox.List()
			if err != nil && !errors.Is(err, os.ErrNotExist) {
				return sandboxErr(err)
			}
			if all == nil {
				all = []*sandbox.State{}
			}
			if output.machine() {
				return output.write(cmd.OutOrStdout(), all)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tPHASE\tBACKEND\tCREATED\tREQUESTS")
			for _, s := range all {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d/%d\n", s.Name, s.Phase, s.Backend, s.Created.Format(time.RFC3339), s.AllowanceUsed, s.AllowanceMax)
			}
			return tw.Flush()
		},
	}
	output = addOutput(cmd)
	return cmd
}

func newSandboxExecCmd() *cobra.Command {
	var tty bool
	var output *outputFlag
	cmd := &cobra.Command{
		Use:   "exec NAME [--tty] [-o json|yaml] [--] CMD [ARG…]",
		Short: "Run a command in a sandbox, under the same confinement as moat run; exit code is the command's",
		Long: `Run CMD in the sandbox NAME under exactly the confinement of a moat run
workload. As with moat run, everything after NAME and moat's own flags is
the command; "--" may mark where it starts (needed only when the command
itself begins with "-").

With -o json or -o yaml, a summary follows the command's own output on
stdout: sandbox, run id, journal, key fingerprint, exit code and outcome.

Exit codes, as moat run: the command's own (128+n when signal n killed
it); 125 when moat refused or failed (including a sandbox that does not
exist or is not Ready); 126 when the command cannot be executed; 127 when
it is not found.`,
		Example: `  moat sandbox exec agent1 go test ./...
  moat sandbox exec agent1 -- sh -c 'go test ./...'
  moat sandbox exec agent1 --tty -- sh
  moat sandbox exec agent1 -o json -- make`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			// Flags may also follow NAME (exec N --tty -- sh): parse
			// them up to the command, which keeps its own flags.
			f := cmd.Flags()
			if err := f.Parse(args[1:]); err != nil {
				return exitf(exitUsage, "%v", err)
			}
			if help, _ := f.GetBool("help"); help {
				return cmd.Help()
			}
			argv := f.Args()
			if len(argv) == 0 {
				return exitf(ExitRefused, "refused: no command given (usage: moat sandbox exec NAME [--] CMD [ARG…])")
			}
			var st *sandbox.State
			if output.machine() {
				var err error
				if st, err = sandbox.Get(name); err != nil {
					return sandboxErr(err)
				}
			}
			code, err := sandbox.Exec(context.Background(), name, argv, tty, os.Stdin, os.Stdout, os.Stderr)
			if output.machine() {
				if werr := output.write(cmd.OutOrStdout(), newExecSummary(name, st, code, err)); werr != nil {
					return werr
				}
			}
			if err != nil {
				if code == ExitNotFound || code == ExitCannotExec {
					return exitf(code, "sandbox %s: %v", name, err)
				}
				if errors.Is(err, sandbox.ErrNotFound) {
					return sandboxErr(err)
				}
				return sandboxErr(fmt.Errorf("sandbox %s: %w", name, err))
			}
			return exitCode(code)
		},
	}
	cmd.Flags().SetInterspersed(false)
	cmd.Flags().BoolVar(&tty, "tty", false, "give the command a pty that moat relays (automatic when stdin or stdout is a terminal; the caller's terminal never enters the sandbox)")
	output = addOutput(cmd)
	return cmd
}

// newExecSummary is sandbox exec's -o summary.
func newExecSummary(name string, st *sandbox.State, code int, err error) runSummary {
	s := runSummary{Sandbox: name, ExitCode: code, Reason: audit.ReasonCompleted}
	if st != nil {
		s.RunID, s.Journal, s.KeyID = st.RunID, st.Journal, st.KeyID
		if st.Journal != "" {
			s.RunDir = filepath.Dir(st.Journal)
		}
	}
	if err != nil {
		s.Error = err.Error()
		switch code {
		case ExitNotFound, ExitCannotExec:
			s.Reason = audit.ReasonExecFailed
		default:
			s.Reason = audit.ReasonRefused
			var re *sandbox.RefusedError
			if !errors.As(err, &re) {
				s.Reason = audit.ReasonFailed
			}
		}
	}
	return s
}

func newSandboxDeleteCmd() *cobra.Command {
	var ignoreNotFound bool
	cmd := &cobra.Command{
		Use:   "delete NAME [--ignore-not-found]",
		Short: "Terminate a sandbox's processes, close its journal and remove its state",
		Long: `Terminate the sandbox's processes, have its supervisor write the journal's
terminal record, and remove its state. A sandbox that does not exist is
refused with exit 125, as get and exec refuse it; with --ignore-not-found
that is exit 0 (for clean-up scripts).`,
		Example: `  moat sandbox delete agent1
  moat sandbox delete agent1 --ignore-not-found`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			found, err := sandbox.Delete(args[0])
			if err != nil {
				return sandboxErr(fmt.Errorf("sandbox %s: %w", args[0], err))
			}
			if !found {
				nf := &sandbox.NotFoundError{Name: args[0]}
				if !ignoreNotFound {
					return sandboxErr(nf)
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "moat: %v; nothing to delete\n", nf)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&ignoreNotFound, "ignore-not-found", false, "exit 0 when there is no such sandbox")
	return cmd
}

func newSandboxReloadLockfilesCmd() *cobra.Command {
	var output *outputFlag
	cmd := &cobra.Command{
		Use:   "reload-lockfiles NAME [-o json|yaml]",
		Short: "Re-read the lockfiles of a sandbox's package grants (egress.packages), journaled before they take effect",
		Long: `A sandbox reads the lockfiles of its package grants once, when it is
created: a lockfile changed later (by you, or by the workload) changes
nothing it admits. reload-lockfiles asks the sandbox's supervisor, over
its control socket (only the sandbox's owner or root is answered; the
workload cannot reach it), to read every lockfile again by the rule of
the start: opened without following a symlink, the lockfile trust rule
(outside every read_write grant, or its sha256 pinned in lockfile_sha256,
or lockfile_trust: workspace) and the pinned sha256 checked. A
package.reload record, with each lockfile's old and new sha256 and who
asked, is journaled, durably, before the new pins take effect.

It fails closed: a lockfile that cannot be read, fails the trust rule or
does not parse leaves the lockfiles in force unchanged; that is journaled
as a refused package.reload and the command exits 125 with the reason.`,
		Example: `  # after updating package-lock.json (outside every read_write grant):
  moat sandbox reload-lockfiles agent1
  moat sandbox reload-lockfiles agent1 -o json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			rec, err := sandbox.ReloadLockfiles(args[0])
			if rec != nil {
				if output.machine() {
					if werr := output.write(cmd.OutOrStdout(), rec); werr != nil {
						return werr
					}
				} else {
					tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
					fmt.Fprintf(tw, "outcome:\t%s\n", rec.Outcome)
					for _, lf := range rec.Lockfiles {
						now := lf.SHA256
						if now == "" {
							now = "(not read)"
						}
						fmt.Fprintf(tw, "%s:\t%s -> %s\n", lf.Path, lf.OldSHA256, now)
					}
					tw.Flush()
				}
			}
			if err != nil {
				return sandboxErr(err)
			}
			return nil
		},
	}
	output = addOutput(cmd)
	return cmd
}

func printState(w io.Writer, output *outputFlag, st *sandbox.State) error {
	if output.machine() {
		return output.write(w, st)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "name:\t%s\n", st.Name)
	fmt.Fprintf(tw, "phase:\t%s\n", st.Phase)
	if st.Error != "" {
		fmt.Fprintf(tw, "error:\t%s\n", st.Error)
	}
	fmt.Fprintf(tw, "backend:\t%s\n", st.Backend)
	for _, np := range st.Properties.Named() {
		fmt.Fprintf(tw, "  %s:\t%s (%s)\n", np.Name, propertyState(np), np.Mechanism)
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

func propertyState(np boundary.NamedProperty) string {
	switch {
	case np.Unavailable:
		return "unavailable"
	case !np.Enforced:
		return "NOT enforced"
	}
	return "enforced"
}
