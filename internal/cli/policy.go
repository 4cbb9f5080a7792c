package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/boundary/seccomp"
	"github.com/moat-sandbox/moat/policy"
	"github.com/moat-sandbox/moat/sandbox"
)

func init() { addCommand(newPolicyCmd) }

func newPolicyCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "policy",
		Short: "Check policy files and print their schema",
		Example: `  moat policy check examples/minimal.yaml
  moat policy schema`,
	}
	cmd.AddCommand(newPolicyCheckCmd(), newPolicySchemaCmd())
	return cmd
}

func newPolicySchemaCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "schema",
		Short: "Print the JSON Schema of policy files",
		Long: `Print the JSON Schema (draft 2020-12) of moat policy files, for editors and
linters. It covers keys, types and ranges; only "moat policy check" makes
the checks that need the file system (grants exist and hold no Unix socket,
the audit directory lies outside every grant).`,
		Example: `  moat policy schema > moat-policy.schema.json`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			_, err := cmd.OutOrStdout().Write(policy.Schema())
			return err
		},
	}
}

// policyCheckResult is what `moat policy check -o json` prints.
type policyCheckResult struct {
	Valid    bool             `json:"valid"`
	File     string           `json:"file"`
	SHA256   string           `json:"sha256,omitempty"`
	Policy   *policy.Policy   `json:"policy,omitempty"`
	Problems []policy.Problem `json:"problems,omitempty"`
	// Seccomp is the filter of the policy's backend on this host, one
	// rule a line (--explain only).
	Seccomp []string `json:"seccomp,omitempty"`
	// Egress says what each egress grant lets through, one line each.
	Egress []string `json:"egress,omitempty"`
}

func newPolicyCheckCmd() *cobra.Command {
	var output *outputFlag
	var explain bool
	cmd := &cobra.Command{
		Use:   "check FILE [--explain] [-o yaml|json]",
		Short: "Print the effective policy, or every error in it",
		Long: `Load FILE as moat would, and print the effective policy: every default
filled in, every relative path resolved against FILE's directory, sizes
normalized. The grants are checked against this machine (they must exist and
hold no Unix socket), as at the start of a run.

If the policy is not valid, every problem is printed on stderr with its
line and key path, and the exit code is 125.

With --explain, the rules of the seccomp filter that the policy's backend
puts every process behind on this host follow, one a line, in the order
the filter decides (as "moat run --explain" prints them).

Output formats:
  yaml (default)  the effective policy, loadable as a policy file (the
                  --explain lines are YAML comments)
  json            {"valid", "file", "sha256", "policy"} (with --explain
                  also "seccomp": the rules as strings) or, when invalid,
                  {"valid": false, "file", "problems": [{"code", "path",
                  "line", "column", "message"}]} (problems also on stderr)`,
		Example: `  moat policy check examples/minimal.yaml
  moat policy check -o json examples/agent-workspace.yaml | jq .sha256
  moat policy check --explain examples/minimal.yaml`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return policyCheck(cmd.OutOrStdout(), cmd.ErrOrStderr(), args[0], output.value, explain)
		},
	}
	output = addOutput(cmd, formatYAML, formatJSON)
	cmd.Flags().BoolVar(&explain, "explain", false, "also print the seccomp filter's rules for the policy's backend on this host")
	return cmd
}

func policyCheck(stdout, stderr io.Writer, file, format string, explain bool) error {
	pol, err := policy.Load(file)
	var pe *policy.Error
	switch {
	case errors.As(err, &pe):
		fmt.Fprintf(stderr, "moat: refused: invalid policy: %v\n", err)
		if format == "json" {
			writePolicyJSON(stdout, policyCheckResult{File: pe.File, Problems: pe.Problems})
		}
		return exitCode(ExitRefused)
	case err != nil:
		return exitf(ExitRefused, "policy check: %v", err)
	}
	sum := pol.SHA256()
	var filter []string
	if explain {
		if err := handOffBackend(pol.Backend); err != nil {
			return err
		}
		be, err := boundary.Lookup(pol.Backend)
		if err != nil {
			return exitf(ExitRefused, "policy check: %v", err)
		}
		var b strings.Builder
		if f, ok := be.(seccomp.Filtered); ok {
			sandbox.ExplainFilter(&b, f.SeccompOptions())
		} else {
			fmt.Fprintf(&b, "  seccomp filter: the %s backend installs none\n", be.Name())
		}
		filter = strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	}
	if format == "json" {
		res := policyCheckResult{Valid: true, File: pol.Source, SHA256: sum, Policy: pol, Egress: pol.ExplainEgress()}
		for _, l := range filter[min(1, len(filter)):] { // the rules, without the heading
			res.Seccomp = append(res.Seccomp, strings.TrimSpace(l))
		}
		return writePolicyJSON(stdout, res)
	}
	y, err := pol.YAML()
	if err != nil {
		return exitf(ExitRefused, "policy check: %v", err)
	}
	fmt.Fprintf(stdout, "# effective policy of %s\n# sha256 %s\n%s", pol.Source, sum, y)
	for _, l := range pol.ExplainEgress() {
		fmt.Fprintf(stdout, "# %s\n", l)
	}
	fmt.Fprintf(stdout, "# %s\n", pol.Process.ExplainSupervisorTimeout())
	if explain {
		fmt.Fprintf(stdout, "# backend %s:\n", pol.Backend)
		for _, l := range filter {
			fmt.Fprintf(stdout, "#%s\n", l)
		}
	}
	return nil
}

func writePolicyJSON(w io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return exitf(ExitRefused, "BUG: encode JSON: %v", err)
	}
	_, err = w.Write(append(b, '\n'))
	return err
}
