package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/moat-sandbox/moat/policy"
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
}

func newPolicyCheckCmd() *cobra.Command {
	var output *outputFlag
	cmd := &cobra.Command{
		Use:   "check FILE [-o yaml|json]",
		Short: "Print the effective policy, or every error in it",
		Long: `Load FILE as moat would, and print the effective policy: every default
filled in, every relative path resolved against FILE's directory, sizes
normalized. The grants are checked against this machine (they must exist and
hold no Unix socket), as at the start of a run.

If the policy is not valid, every problem is printed on stderr with its
line and key path, and the exit code is 125.

Output formats:
  yaml (default)  the effective policy, loadable as a policy file
  json            {"valid", "file", "sha256", "policy"} or, when invalid,
                  {"valid": false, "file", "problems": [{"code", "path",
                  "line", "column", "message"}]} (problems also on stderr)`,
		Example: `  moat policy check examples/minimal.yaml
  moat policy check -o json examples/agent-workspace.yaml | jq .sha256`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return policyCheck(cmd.OutOrStdout(), cmd.ErrOrStderr(), args[0], output.value)
		},
	}
	output = addOutput(cmd, formatYAML, formatJSON)
	return cmd
}

func policyCheck(stdout, stderr io.Writer, file, format string) error {
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
	if format == "json" {
		return writePolicyJSON(stdout, policyCheckResult{Valid: true, File: pol.Source, SHA256: sum, Policy: pol})
	}
	y, err := pol.YAML()
	if err != nil {
		return exitf(ExitRefused, "policy check: %v", err)
	}
	fmt.Fprintf(stdout, "# effective policy of %s\n# sha256 %s\n%s", pol.Source, sum, y)
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
