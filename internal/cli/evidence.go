package cli

import (
	"context"
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
		Example: `  sudo moat evidence run --out /var/tmp/moat-evidence
  moat evidence verify /var/tmp/moat-evidence --suite-key-fingerprint 5d0e…(64 hex digits)`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newEvidenceRunCmd(), newEvidenceVerifyCmd())
	return cmd
}

func newEvidenceRunCmd() *cobra.Command {
	var o evidence.Options
	var k8s evidence.Kubernetes
	var output *outputFlag
	var suite string
	cmd := &cobra.Command{
		Use:   "run --out DIR [--suite containment|faults] [--case NAME]… [--backend B] [--probe F] [--expected-probe-sha256 H] [--binary F] [--expected-binary-sha256 H] [--hooks-binary F] [--source-commit C] [-o json|yaml]",
		Short: "Run the containment evidence suite and write a signed bundle",
		Long: `Run the fixed hostile probe (moat-probe) in real sandboxes, one case at a
time, against a synthetic provider and host receivers that the sandbox
cannot touch, and write a bundle (report.json, report.dsse.json, report.md,
cases/, manifest.json). Outcomes come only from what the controller observes.

Exit codes: 0 every case passed; 1 some case did not pass; 125 harness error
(and an unknown --case or --backend, refused before anything runs).
It prints the manifest sha256 and the suite key fingerprint: pin them
outside the bundle and pass them to "moat evidence verify". With -o json or
yaml, the progress goes to stderr and stdout holds only the result:
bundle, summary, manifest sha256, suite keyid and public key, exit code.

The egress case (egress-grants) is run by moat built with -tags
moat_test_hooks (--hooks-binary, default $MOAT_HOOKS_BIN), whose guard can
be told that the case's loopback registry is global; this binary has no
such setting. Without it that case is invalid.

--suite faults runs the second report instead (moat-faults-evidence, its
own bundle, never merged into the containment count), judged from the
host: the supervisor of a moat sandbox is stopped (SIGSTOP) or killed
(SIGKILL) and the workload must die; eight child sandboxes under one
parent budget fire requests at a local fake provider until refused, which
must receive exactly the budget; moat is killed at three audit stages of a
request (the interrupt-* cases, run by the --hooks-binary build, whose
test-only fault hook stops the broker there; without it they are invalid,
not run); a request substituted during a pending approval must never reach
the provider. Its cases: ` + joinNames(evidence.FaultCaseNames()) + `.

--backend kubernetes needs the cluster: --kubeconfig (default $KUBECONFIG)
and --k8s-image (default $MOAT_K8S_IMAGE), an image holding the
moat-kubernetes under test at /usr/local/bin/moat (moat hands the run to
the moat-kubernetes beside it); --k8s-namespace, --k8s-runtime-class. The
grants are hostPath volumes, so the cluster's single node must be this
host: the host's view of a Pod is its processes on the node (found by the
Pod's uid in their cgroup: namespaces, no_new_privs, gone after the run)
and the Pod and NetworkPolicy through the cluster's API (gone after the
run); the host receivers listen on the node's address. Cases whose attack
has no counterpart there are reported not-applicable with the reason,
from a fixed list that the verifier checks.

Cases: ` + joinNames(evidence.CaseNames()),
		Example: `  CGO_ENABLED=0 go build -o bin/moat-probe ./cmd/moat-probe && go build -o bin/moat ./cmd/moat
  go build -tags moat_test_hooks -o bin/moat-hooks ./cmd/moat   # runs the egress case alone
  sudo bin/moat evidence run --out /var/tmp/moat-evidence --hooks-binary bin/moat-hooks
  bin/moat evidence run --out ./ev --case direct-network --case provider-redirect
  bin/moat evidence run --out ./ev -o json | jq .manifest_sha256
  bin/moat evidence run --suite faults --out ./faults && bin/moat evidence verify ./faults
  sudo KUBECONFIG=/etc/moat/kube.conf bin/moat evidence run --backend kubernetes --k8s-image registry.example/moat-sandbox:1 --out ./ev-k8s`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if o.Out == "" {
				return exitf(ExitRefused, "evidence run: --out DIR is required")
			}
			if suite != "containment" && suite != "faults" {
				return exitf(ExitRefused, "evidence run: --suite %q: want containment or faults", suite)
			}
			if suite == "faults" && (o.Backend != "" && o.Backend != "native" || o.Probe != "" || o.ExpectedProbeSHA256 != "") {
				return exitf(ExitRefused, "evidence run: --suite faults runs moat sandbox on the native backend, without the probe; drop --backend, --probe and --expected-probe-sha256")
			}
			// The controller itself observes a kubernetes run through
			// the cluster's API: moat-kubernetes runs the suite.
			if err := handOffBackend(o.Backend); err != nil {
				return err
			}
			if o.Binary == "" {
				// The backends of this binary are the ones the suite runs.
				if err := checkBackend(o.Backend); err != nil {
					return err
				}
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
			if o.HooksBinary == "" {
				o.HooksBinary = os.Getenv("MOAT_HOOKS_BIN")
			}
			if o.HooksBinary != "" {
				if o.HooksBinary, err = filepath.Abs(o.HooksBinary); err != nil {
					return exitf(ExitRefused, "evidence run: %v", err)
				}
			}
			o.Progress = cmd.OutOrStdout()
			if output.machine() {
				o.Progress = cmd.ErrOrStderr()
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			if suite == "faults" {
				return runFaultsSuite(ctx, cmd, o, output)
			}
			if o.Backend == "kubernetes" {
				o.Kubernetes = &k8s
			}
			res, err := evidence.Run(ctx, o)
			if err != nil {
				var he *evidence.HarnessError
				if errors.As(err, &he) {
					return exitf(ExitRefused, "evidence run: %v", err)
				}
				return exitf(ExitRefused, "evidence run: BUG: %v", err)
			}
			code := 0
			// A case the fixed list exempts on this backend is not run
			// (evidence.NotApplicable); every other case must pass.
			if !res.Report.Binary.Unchanged || res.Report.Summary.Pass+res.Report.Summary.NotApplicable != len(res.Report.Cases) {
				code = ExitInvalid
			}
			if output.machine() {
				r := res.Report
				if err := output.write(cmd.OutOrStdout(), evidenceRunJSON{
					Bundle: o.Out, Complete: r.Complete, Summary: r.Summary, ManifestSHA256: res.ManifestSHA256,
					SuiteKeyID: r.SuiteKeyID, SuitePublicKey: string(res.SuitePublicKey),
					BinaryUnchanged: r.Binary.Unchanged, Source: r.Source, ExitCode: code,
				}); err != nil {
					return err
				}
				return exitCode(code)
			}
			w := cmd.OutOrStdout()
			s := res.Report.Summary
			fmt.Fprintf(w, "\n%d pass, %d fail, %d invalid, %d insufficient, %d not applicable on backend %s; bundle %s", s.Pass, s.Fail, s.Invalid, s.Insufficient, s.NotApplicable, res.Report.Backend, o.Out)
			if !res.Report.Complete {
				fmt.Fprintf(w, " (a SUBSET of the cases: not full qualification)")
			}
			fmt.Fprintf(w, "\nmanifest sha256: %s\nsuite key fingerprint (keyid): %s\nsuite public key:\n%s", res.ManifestSHA256, res.Report.SuiteKeyID, res.SuitePublicKey)
			fmt.Fprintf(w, "Pin both outside the bundle; check it with:\n  moat evidence verify %s --suite-key-fingerprint %s --manifest-sha256 %s\n", o.Out, res.Report.SuiteKeyID, res.ManifestSHA256)
			if res.Report.Source.Mismatch {
				fmt.Fprintf(w, "WARNING: declared source commit %q differs from the binary's embedded revision %q\n", res.Report.Source.Declared, res.Report.Source.Embedded)
			}
			if !res.Report.Binary.Unchanged {
				fmt.Fprintf(w, "FAILED: the moat binary changed during the run (sha256 %s at start, %s at end)\n", res.Report.Binary.SHA256, res.Report.Binary.SHA256End)
			}
			return exitCode(code)
		},
	}
	f := cmd.Flags()
	f.StringVar(&suite, "suite", "containment", "containment (the hostile probe) or faults (supervisor loss: a second report in its own bundle)")
	f.StringVar(&o.Out, "out", "", "new directory for the bundle (must not lie inside anything the sandbox can see)")
	f.StringArrayVar(&o.Cases, "case", nil, "run only this case (repeatable); the bundle is then a subset, never full qualification")
	f.StringVar(&o.Backend, "backend", "", "backend to test (default: the policy default, native)")
	f.StringVar(&k8s.Kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "kubernetes: the cluster's kubeconfig")
	f.StringVar(&k8s.Image, "k8s-image", os.Getenv("MOAT_K8S_IMAGE"), "kubernetes: the sandbox image (the moat-kubernetes under test at /usr/local/bin/moat)")
	f.StringVar(&k8s.Namespace, "k8s-namespace", os.Getenv("MOAT_K8S_NAMESPACE"), "kubernetes: namespace of the Pods (empty: default)")
	f.StringVar(&k8s.RuntimeClass, "k8s-runtime-class", os.Getenv("MOAT_K8S_RUNTIMECLASS"), "kubernetes: RuntimeClass (empty: gvisor)")
	f.StringVar(&o.Probe, "probe", "", "the moat-probe binary (default: moat-probe beside the moat binary)")
	f.StringVar(&o.ExpectedProbeSHA256, "expected-probe-sha256", "", "refuse to start unless the probe has this sha256")
	f.StringVar(&o.Binary, "binary", "", "the moat binary to test (default: this one)")
	f.StringVar(&o.ExpectedBinarySHA256, "expected-binary-sha256", "", "refuse to start unless the binary has this sha256")
	f.StringVar(&o.HooksBinary, "hooks-binary", "", "moat built with -tags moat_test_hooks, which runs the egress case and the faults suite's interrupt-* cases (default: $MOAT_HOOKS_BIN; without it those cases are invalid)")
	f.StringVar(&o.SourceCommit, "source-commit", "", "the source commit the binary is declared to come from (recorded; compared with the embedded one)")
	output = addOutput(cmd)
	return cmd
}

func newEvidenceVerifyCmd() *cobra.Command {
	var pins evidence.Pins
	var output *outputFlag
	var requirePin bool
	cmd := &cobra.Command{
		Use:   "verify DIR [--suite-key-fingerprint HEX] [--manifest-sha256 HEX] [--require-pin] [-o json|yaml]",
		Short: "Verify an evidence bundle offline and recompute every outcome",
		Long: `Check a bundle offline: the pins, the manifest, the exact set of files (no
file added, none missing), the report's DSSE signature by the suite key that
report.json names, the case files that the signed report lists, report.md
regenerated from report.json, the planned case list, every journal against
its pinned run key, every provider event against the signed records, and
every outcome recomputed from the raw observations. A faults bundle
(moat evidence run --suite faults; report.json names the suite
moat-faults-evidence) is recognized and checked the same way, its outcomes
recomputed from each case's host.json, journal and key.

A bundle is only as authentic as its suite key: anyone can edit a bundle,
recompute its outcomes and re-sign it with a fresh key, and it is then
consistent on its own. Pin it with what "moat evidence run" printed:
--suite-key-fingerprint HEX (the suite keyid: sha256 of the raw Ed25519
key) or --manifest-sha256 HEX; either pin covers every file. Without a pin,
verify still reports the bundle's own state but prints
"` + unpinnedWarning + `" on stderr and "pinned": false with -o json or yaml.

Exit codes:
  0  valid and complete
  2  valid but a --case subset (not full qualification)
  1  invalid: tampered, inconsistent, unreadable, or not matching a pin
  3  unpinned: with --require-pin, a bundle that would exit 0 or 2 but was
     checked without a pin`,
		Example: `  moat evidence verify /var/tmp/moat-evidence --suite-key-fingerprint 5d0e…(64 hex digits) --manifest-sha256 3f1c…(64 hex digits)
  moat evidence verify ./ev --suite-key-fingerprint 5d0e… --require-pin -o json
  moat evidence verify ./faults   # a --suite faults bundle`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if pins.SuiteKeyFingerprint, err = parseFingerprint(pins.SuiteKeyFingerprint); err != nil {
				return exitf(exitUsage, "--suite-key-fingerprint: %v", err)
			}
			if pins.ManifestSHA256, err = parseFingerprint(pins.ManifestSHA256); err != nil {
				return exitf(exitUsage, "--manifest-sha256: %v", err)
			}
			res := evidence.VerifyBundlePinned(args[0], pins)
			code := res.ExitCode()
			if !res.Pinned && code != ExitInvalid {
				fmt.Fprintf(cmd.ErrOrStderr(), "moat: %s: the bundle is consistent, but nothing outside it says who made it; pass --suite-key-fingerprint or --manifest-sha256 as moat evidence run printed them (this bundle's suite keyid is %s)\n", unpinnedWarning, res.SuiteKeyID)
				if requirePin {
					fmt.Fprintf(cmd.ErrOrStderr(), "moat: evidence verify: --require-pin: exit %d instead of %d\n", exitUnpinned, code)
					code = exitUnpinned
				}
			}
			w := cmd.OutOrStdout()
			if output.machine() {
				if err := output.write(w, struct {
					evidence.VerifyResult
					ExitCode int `json:"exit_code"`
				}{res, code}); err != nil {
					return err
				}
				return exitCode(code)
			}
			pinned := "UNPINNED"
			if res.Pinned {
				pinned = "pinned"
			}
			switch res.Verdict {
			case evidence.VerdictInvalid:
				for _, p := range res.Problems {
					fmt.Fprintf(cmd.ErrOrStderr(), "moat: evidence verify: %s\n", p)
				}
				fmt.Fprintf(w, "INVALID: %d problem(s); do not rely on this bundle\n", len(res.Problems))
			case evidence.VerdictSubset:
				fmt.Fprintf(w, "valid SUBSET (%d planned cases; not full qualification): %d pass, %d fail, %d invalid, %d insufficient, %d not applicable; manifest sha256 %s; suite keyid %s (%s)\n",
					res.Planned, res.Summary.Pass, res.Summary.Fail, res.Summary.Invalid, res.Summary.Insufficient, res.Summary.NotApplicable, res.ManifestSHA256, res.SuiteKeyID, pinned)
			default:
				fmt.Fprintf(w, "valid and complete: %d pass, %d fail, %d invalid, %d insufficient, %d not applicable; manifest sha256 %s; suite keyid %s (%s)\n",
					res.Summary.Pass, res.Summary.Fail, res.Summary.Invalid, res.Summary.Insufficient, res.Summary.NotApplicable, res.ManifestSHA256, res.SuiteKeyID, pinned)
			}
			return exitCode(code)
		},
	}
	cmd.Flags().StringVar(&pins.SuiteKeyFingerprint, "suite-key-fingerprint", "", "the suite keyid that moat evidence run printed (sha256 of the raw Ed25519 key, 64 hex digits)")
	cmd.Flags().StringVar(&pins.ManifestSHA256, "manifest-sha256", "", "the manifest sha256 that moat evidence run printed (64 hex digits)")
	cmd.Flags().BoolVar(&requirePin, "require-pin", false, "exit 3 instead of 0 or 2 when no pin is given")
	output = addOutput(cmd)
	return cmd
}

// evidenceRunJSON is what moat evidence run -o prints.
type evidenceRunJSON struct {
	Bundle          string              `json:"bundle"`
	Complete        bool                `json:"complete"` // every case planned, not a --case subset
	Summary         evidence.Summary    `json:"summary"`
	ManifestSHA256  string              `json:"manifest_sha256"`
	SuiteKeyID      string              `json:"suite_keyid"`
	SuitePublicKey  string              `json:"suite_public_key"`
	BinaryUnchanged bool                `json:"binary_unchanged"`
	Source          evidence.SourceInfo `json:"source"`
	ExitCode        int                 `json:"exit_code"`
}

// runFaultsSuite is moat evidence run --suite faults.
func runFaultsSuite(ctx context.Context, cmd *cobra.Command, o evidence.Options, output *outputFlag) error {
	res, err := evidence.RunFaults(ctx, o)
	if err != nil {
		return exitf(ExitRefused, "evidence run: %v", err)
	}
	r := res.Report
	code := 0
	if !r.Binary.Unchanged || r.Summary.Pass != len(r.Cases) {
		code = ExitInvalid
	}
	if output.machine() {
		if err := output.write(cmd.OutOrStdout(), evidenceRunJSON{
			Bundle: o.Out, Complete: r.Complete, Summary: r.Summary, ManifestSHA256: res.ManifestSHA256,
			SuiteKeyID: r.SuiteKeyID, SuitePublicKey: string(res.SuitePublicKey),
			BinaryUnchanged: r.Binary.Unchanged, ExitCode: code,
		}); err != nil {
			return err
		}
		return exitCode(code)
	}
	w := cmd.OutOrStdout()
	fmt.Fprintf(w, "\nfaults: %d pass, %d fail, %d invalid; bundle %s\nmanifest sha256: %s\nsuite key fingerprint (keyid): %s\n", r.Summary.Pass, r.Summary.Fail, r.Summary.Invalid, o.Out, res.ManifestSHA256, r.SuiteKeyID)
	fmt.Fprintf(w, "Pin both outside the bundle; check it with:\n  moat evidence verify %s --suite-key-fingerprint %s --manifest-sha256 %s\n", o.Out, r.SuiteKeyID, res.ManifestSHA256)
	if !r.Binary.Unchanged {
		fmt.Fprintf(w, "FAILED: the moat binary changed during the run\n")
	}
	return exitCode(code)
}
