package cli

import (
	"fmt"
	"runtime/debug"

	"github.com/spf13/cobra"
)

func init() { addCommand(newVersionCmd) }

// versionInfo is `moat version -o json`: what debug.ReadBuildInfo knows of
// this binary. VCS fields appear only when the build recorded them (a
// build from a clone with git does; go run, and builds here, may not).
type versionInfo struct {
	Module    string            `json:"module"`
	Version   string            `json:"version"`
	GoVersion string            `json:"go_version"`
	Settings  map[string]string `json:"settings,omitempty"` // -trimpath, CGO_ENABLED, vcs.revision, …
}

func newVersionCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "version [-o json|yaml]",
		Short: "The module version and build settings of this binary",
		Example: `  moat version
  moat version -o json`,
		Args: cobra.NoArgs,
	}
	out := addOutput(cmd)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		info := versionInfo{Module: "unknown", Version: "unknown"}
		if bi, ok := debug.ReadBuildInfo(); ok {
			info.Module, info.Version, info.GoVersion = bi.Main.Path, bi.Main.Version, bi.GoVersion
			info.Settings = map[string]string{}
			for _, s := range bi.Settings {
				info.Settings[s.Key] = s.Value
			}
		}
		if out.machine() {
			return out.write(cmd.OutOrStdout(), info)
		}
		fmt.Fprintf(cmd.OutOrStdout(), "moat %s (%s, %s)\n", Version(), info.Module, info.GoVersion)
		return nil
	}
	return cmd
}
