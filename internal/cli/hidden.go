package cli

import (
	"os"
	"sync"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/boundary/gvisor"
	"github.com/moat-sandbox/moat/boundary/measure"
	"github.com/moat-sandbox/moat/boundary/native"
	"github.com/moat-sandbox/moat/broker"
	"github.com/moat-sandbox/moat/conformance"
	"github.com/moat-sandbox/moat/evidence"
	"github.com/moat-sandbox/moat/evidence/probe"
	"github.com/moat-sandbox/moat/internal/mcpcalc"
	"github.com/moat-sandbox/moat/internal/probekit"
	"github.com/moat-sandbox/moat/internal/reaper"
	"github.com/moat-sandbox/moat/internal/reexec"
	"github.com/moat-sandbox/moat/sandbox"
)

// hidden is every hidden helper of the moat binary: moat re-runs itself
// (os.Executable, or an fd of it) with the helper's name as the first
// argument, and Main dispatches here before any CLI parsing. Each package
// owns its helper's name (reexec.Prefix + "…") and exports its entry
// function; this list is the only place they meet. TestHiddenListed checks
// that every such name in the module is listed.
var hidden = []reexec.Helper{
	// The sandbox lifecycle (package sandbox, internal/reaper).
	{Name: sandbox.SupervisorHelper, Main: sandbox.SupervisorMain}, // per sandbox: namespaces, broker, journal, control socket
	{Name: reaper.Helper, Main: reaper.Main},                       // removes what moat owned if moat dies
	{Name: sandbox.MCPConfigHelper, Main: sandbox.MCPConfigMain},   // writes MOAT_MCP_CONFIG's file inside the sandbox

	// The native backend.
	{Name: native.InitHelper, Main: native.InitMain},   // pid 1 of the sandbox
	{Name: native.StageHelper, Main: native.StageMain}, // applies Landlock and seccomp, execs the workload

	// The gVisor backend.
	{Name: gvisor.InitHelper, Main: gvisor.InitMain},   // owns the namespaces, runs runsc
	{Name: gvisor.PauseHelper, Main: gvisor.PauseMain}, // the container's init inside the sentry
	{Name: gvisor.StageHelper, Main: gvisor.StageMain}, // moat's seccomp filter in front of each runsc exec

	// The kubernetes backend's helpers (its in-Pod ones and its host
	// watchdog) are moat-kubernetes's (Extension, internal/cli/k8sext);
	// this binary hands their names to it (kubernetesHelperPrefix).

	// The measurement, inside every sandbox before the workload starts.
	{Name: measure.Helper, Main: measure.Main},

	// moat demo: the agent, so that `go run ./cmd/moat demo` needs no second binary.
	{Name: evidence.DemoAgentHelper, Main: demoAgentMain},
	// moat demo and moat evidence run: the example MCP tool server (examples/mcp-calc).
	{Name: mcpcalc.Helper, Main: mcpcalc.HelperMain},
	// moat evidence run --suite faults: the model requests of the broker cases, inside their sandboxes.
	{Name: evidence.FaultsWorkerHelper, Main: evidence.FaultsWorkerMain},

	// moat conformance: the suite's probe and the test host's receiver.
	{Name: conformance.ProbeHelper, Main: conformance.ProbeMain},
	{Name: conformance.ReceiverHelper, Main: conformance.ReceiverMain},
	// Every probe's (internal/probekit) euid report: fork, exec-euid and
	// unshare-user run it, and conformance runs a setuid-root copy of moat
	// as it.
	{Name: probekit.EUIDHelper, Main: probekit.EUIDMain},
}

func demoAgentMain(args []string) int { return probe.Main(args, os.Stdout) }

// testHooks are the environment-gated hooks that only a binary built with
// the moat_test_hooks tag obeys (tests only, like the lying backend). Each
// checks its variables: a binary without the hook refuses to run when they
// are set, so that a test never believes it drove a hook that is not
// there. Main runs every check before anything else (exit 125).
var testHooks = []func() error{
	broker.CheckFaultHooks, // MOAT_FAULT_STAGE, MOAT_FAULT_MARKER, MOAT_FAULT_SKIP: stop the broker at an audit stage (the faults suite's interruption cases)
}

// checkTestHooks runs testHooks' checks.
func checkTestHooks() error {
	for _, check := range testHooks {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

// backends is every sandbox backend of this binary: native and gVisor,
// the extensions' (moat-kubernetes's kubernetes), and in builds tagged
// moat_lying_backend the lying one (lying.go).
func backends() []boundary.Backend {
	bs := []boundary.Backend{native.New(), gvisor.New()}
	for _, e := range extensions {
		bs = append(bs, e.Backends...)
	}
	return append(bs, testBackends()...)
}

// helpers is hidden and the extensions' helpers: what Main dispatches.
func helpers() []reexec.Helper {
	hs := hidden
	for _, e := range extensions {
		hs = append(hs[:len(hs):len(hs)], e.Helpers...)
	}
	return hs
}

var registerOnce sync.Once

// registerBackends makes backends known to boundary.Lookup, once; Main and
// NewRoot call it, before a helper (the supervisor looks its backend up)
// or a command runs.
func registerBackends() {
	registerOnce.Do(func() {
		for _, b := range backends() {
			boundary.Register(b)
		}
	})
}
