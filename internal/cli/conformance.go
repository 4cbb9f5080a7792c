package cli

import (
	"context"
	"os"

	"github.com/spf13/cobra"

	"github.com/moat-sandbox/moat/conformance"
)

func init() { addCommand(newConformanceCmd) }

func newConformanceCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "conformance",
		Short: "Backend-neutral property scenarios, driven through the moat CLI",
		Example: `  moat conformance run
  sudo moat conformance run --backend gvisor -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	var (
		backend   string
		binary    string
		scenarios []string
		output    *outputFlag
		k8s       conformance.Kubernetes
	)
	run := &cobra.Command{
		Use:   "run [--backend B] [--scenario S]… [--binary F] [-o json|yaml]",
		Short: "Attempt each violation against a backend; require it to fail and its positive control to work",
		Long: `Runs backend-neutral scenarios against the real CLI: ` + joinNames(conformance.Names()) + `.
Each attempts a violation, requires it to fail, and requires its positive
control to succeed. Outcomes: pass, fail, invalid (evidence missing) or
unavailable (the backend declared the property unavailable and the policy
does not require it).

Some checks need root (a network namespace for the test host, a
setuid-root file). Run unprivileged, a scenario that lacks only those is
invalid with "unprivileged": true ("needs root" in the table): that is not
a failure of the host or the backend, and does not change the exit code.

--backend kubernetes needs the cluster: --kubeconfig (default $KUBECONFIG)
and --k8s-image (default $MOAT_K8S_IMAGE), an image holding this moat's
moat-kubernetes at /usr/local/bin/moat (moat hands the run to the
moat-kubernetes beside it); --k8s-namespace (default
$MOAT_K8S_NAMESPACE, else "default"), --k8s-runtime-class (default
$MOAT_K8S_RUNTIMECLASS, else the policy's "gvisor"). The scenarios' grants
are hostPath volumes (kubernetes.host_path_grants), so the cluster's node
must be this host. A scenario whose attack has no counterpart on a
backend is "not-applicable" with the reason, from the suite's fixed list.

An unknown --backend or --scenario is refused at once (exit 125). Exit 0
when every scenario is pass or unavailable (or, unprivileged, invalid only
for want of root); 1 otherwise; 125 when the suite itself could not run.`,
		Example: `  moat conformance run --backend native
  sudo moat conformance run --backend gvisor -o json
  moat conformance run --scenario filesystem-confinement --scenario egress-confinement
  sudo KUBECONFIG=/etc/moat/kube.conf moat conformance run --backend kubernetes --k8s-image registry.example/moat-sandbox:1`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			// The suite itself observes a kubernetes run through the
			// cluster's API: moat-kubernetes runs it.
			if err := handOffBackend(backend); err != nil {
				return err
			}
			if binary == "" {
				// This binary's registry is the one the scenarios will
				// use; another --binary checks its own at its first run.
				if err := checkBackend(backend); err != nil {
					return err
				}
			}
			if err := conformance.CheckScenarios(scenarios); err != nil {
				return exitf(ExitRefused, "refused: --scenario: %v", err)
			}
			o := conformance.Options{
				Backend: backend, Binary: binary, Scenarios: scenarios, Progress: cmd.ErrOrStderr(),
			}
			if backend == "kubernetes" {
				o.Kubernetes = &k8s
			}
			rep, err := conformance.Run(context.Background(), o)
			if err != nil {
				return exitf(ExitRefused, "conformance: %v", err)
			}
			if output.machine() {
				err = output.write(cmd.OutOrStdout(), rep)
			} else {
				err = rep.WriteTable(cmd.OutOrStdout())
			}
			if err != nil {
				return err
			}
			if !rep.OK() {
				return exitCode(ExitInvalid)
			}
			return nil
		},
	}
	run.Flags().StringVar(&backend, "backend", "native", "backend to test")
	run.Flags().StringVar(&binary, "binary", "", "moat binary to drive (default: this one)")
	run.Flags().StringArrayVar(&scenarios, "scenario", nil, "scenario to run (repeatable; default: all)")
	run.Flags().StringVar(&k8s.Kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "kubernetes: the cluster's kubeconfig")
	run.Flags().StringVar(&k8s.Image, "k8s-image", os.Getenv("MOAT_K8S_IMAGE"), "kubernetes: the sandbox image (this moat's moat-kubernetes at /usr/local/bin/moat)")
	run.Flags().StringVar(&k8s.Namespace, "k8s-namespace", os.Getenv("MOAT_K8S_NAMESPACE"), "kubernetes: namespace of the Pods (empty: default)")
	run.Flags().StringVar(&k8s.RuntimeClass, "k8s-runtime-class", os.Getenv("MOAT_K8S_RUNTIMECLASS"), "kubernetes: RuntimeClass (empty: gvisor)")
	output = addOutput(run)
	cmd.AddCommand(run)
	return cmd
}
