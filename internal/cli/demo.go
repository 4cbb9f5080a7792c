package cli

import (
	"context"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/moat-sandbox/moat/evidence"
)

func init() { addCommand(newDemoCmd) }

func newDemoCmd() *cobra.Command {
	var out, backend string
	cmd := &cobra.Command{
		Use:   "demo [--out DIR]",
		Short: "The quick start: a contained agent against a local synthetic provider",
		Long: `Run a small agent in a moat sandbox. Its only way out is moat's inference
broker, which forwards to a synthetic provider on this host's 127.0.0.1, so
the demo needs no API key and no network. The agent makes a few allowed
requests, tries a few escapes that fail, and moat prints what happened, the
verified journal, and where the evidence lies.

Exit codes: 0 every check passed; 1 a check did not pass; 125 moat failed.`,
		Example: `  go run ./cmd/moat demo
  moat demo --out /var/tmp/moat-demo`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			exe, err := os.Executable()
			if err != nil {
				return exitf(ExitRefused, "demo: cannot find the moat binary: %v", err)
			}
			if out == "" {
				out = filepath.Join(".moat", "demo", time.Now().UTC().Format("20060102T150405Z"))
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			ok, err := evidence.Demo(ctx, evidence.DemoOptions{Out: out, Binary: exe, Backend: backend, Stdout: cmd.OutOrStdout()})
			if err != nil {
				return exitf(ExitRefused, "demo: %v", err)
			}
			if !ok {
				return exitCode(1)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "new directory for the evidence (default: .moat/demo/<time>)")
	cmd.Flags().StringVar(&backend, "backend", "", "backend to use (default: native)")
	return cmd
}
