package cli

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/internal/hostinfo"
	"github.com/moat-sandbox/moat/policy"
	"github.com/moat-sandbox/moat/sandbox"
)

func init() { addCommand(newDoctorCmd) }

// doctorCheck is one line of the report.
type doctorCheck struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
	Fix    string `json:"fix,omitempty"`
}

type doctorReport struct {
	Kernel   string                `json:"kernel"`
	Arch     string                `json:"arch"`
	Checks   []doctorCheck         `json:"checks"`
	Backends []sandbox.ProbeResult `json:"backends"`
	Runnable bool                  `json:"runnable"` // moat can run here: some backend reaches Ready
}

func newDoctorCmd() *cobra.Command {
	var output *outputFlag
	cmd := &cobra.Command{
		Use:   "doctor [-o json|yaml]",
		Short: "What this host supports, and which backends reach Ready here",
		Long: `Checks what moat needs from this host (Landlock ABI, user namespaces,
seccomp, cgroup delegation, runsc, openssl) and then, for each registered
backend, prepares a throwaway sandbox and confirms it by measurement, as
moat run would. For each gap it says what to change. Exit 0 when moat can
run here (some backend reaches Ready), 1 otherwise.`,
		Example: `  moat doctor
  sudo moat doctor -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			rep := doctor(context.Background())
			if output.machine() {
				if err := output.write(cmd.OutOrStdout(), rep); err != nil {
					return err
				}
			} else {
				printDoctor(cmd.OutOrStdout(), rep)
			}
			if !rep.Runnable {
				return exitCode(ExitInvalid)
			}
			return nil
		},
	}
	output = addOutput(cmd)
	return cmd
}

func fixOf(err error) string {
	var he *hostinfo.Error
	if errors.As(err, &he) {
		return he.Hint
	}
	return ""
}

func doctor(ctx context.Context) doctorReport {
	rep := doctorReport{Kernel: hostinfo.Kernel(), Arch: hostinfo.Arch()}
	add := func(name string, err error, okDetail, fix string) {
		c := doctorCheck{Name: name, OK: err == nil, Detail: okDetail}
		if err != nil {
			c.Detail = err.Error()
			if c.Fix = fixOf(err); c.Fix == "" {
				c.Fix = fix
			}
		}
		rep.Checks = append(rep.Checks, c)
	}
	abi, err := hostinfo.LandlockABI()
	if err == nil && abi < policy.DefaultABIFloor {
		err = fmt.Errorf("Landlock ABI %d is below the default floor %d", abi, policy.DefaultABIFloor)
	}
	add("landlock", err, fmt.Sprintf("ABI %d (default floor %d)", abi, policy.DefaultABIFloor),
		"use a kernel with Landlock ABI 6 or later (Linux 6.7+) and lsm=landlock enabled, or lower landlock.abi_floor knowingly")
	add("user namespaces", hostinfo.UserNamespaces(), "unprivileged user namespaces work",
		"allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1 / user.max_user_namespaces > 0)")
	add("seccomp", hostinfo.Seccomp(), "seccomp filters are available", "use a kernel built with CONFIG_SECCOMP_FILTER")
	cg := hostinfo.Cgroups()
	var cgErr error
	if !cg.Delegated {
		cgErr = fmt.Errorf("memory and pids limits cannot be enforced: %s", cg.Reason)
	}
	add("cgroups", cgErr, fmt.Sprintf("cgroup v%d%s, memory and pids limits enforceable", cg.Version, map[bool]string{true: " (hybrid)"}[cg.Hybrid]), cg.Fix())
	if p, v, err := hostinfo.Runsc(); err == nil {
		add("runsc", nil, fmt.Sprintf("%s (%s; minimum %s)", p, v, hostinfo.RunscMinimumDate), "")
	} else {
		add("runsc", err, "", hostinfo.RunscBuild)
	}
	if p, v, err := hostinfo.OpenSSL(); err == nil {
		add("openssl", nil, fmt.Sprintf("%s (%s)", p, v), "")
	} else {
		add("openssl", err, "", "install openssl to check journal signatures without moat")
	}
	for _, name := range boundary.Names() {
		res := sandbox.Probe(ctx, name)
		rep.Backends = append(rep.Backends, res)
		if res.Ready {
			rep.Runnable = true
		}
	}
	for _, name := range knownBackends() {
		if _, err := boundary.Lookup(name); err != nil {
			// Not in this binary: its own binary's doctor probes it.
			rep.Backends = append(rep.Backends, sandbox.ProbeResult{Backend: name,
				Reason: fmt.Sprintf("in %s, beside moat: run `%s doctor`", elsewhere[name], elsewhere[name])})
		}
	}
	return rep
}

func printDoctor(w io.Writer, rep doctorReport) {
	fmt.Fprintf(w, "host: %s %s\n", rep.Kernel, rep.Arch)
	for _, c := range rep.Checks {
		mark := "ok  "
		if !c.OK {
			mark = "GAP "
		}
		fmt.Fprintf(w, "  %s %-16s %s\n", mark, c.Name, c.Detail)
		if !c.OK && c.Fix != "" {
			fmt.Fprintf(w, "       %-16s fix: %s\n", "", c.Fix)
		}
	}
	fmt.Fprintln(w, "backends (a throwaway sandbox, confirmed by measurement):")
	for _, b := range rep.Backends {
		if b.Ready {
			fmt.Fprintf(w, "  ok   %-8s reaches Ready\n", b.Backend)
		} else {
			fmt.Fprintf(w, "  GAP  %-8s does not reach Ready: %s\n", b.Backend, b.Reason)
		}
		for _, np := range b.Properties.Named() {
			state := "enforced"
			if np.Unavailable {
				state = "unavailable"
			} else if !np.Enforced {
				state = "NOT enforced"
			}
			if np.Mechanism != "" || np.Enforced {
				fmt.Fprintf(w, "         %-24s %-12s %s\n", np.Name, state, np.Mechanism)
			}
		}
	}
	if rep.Runnable {
		fmt.Fprintln(w, "moat can run here.")
	} else {
		fmt.Fprintln(w, "moat cannot run here: no backend reaches Ready (see the gaps above).")
	}
}
