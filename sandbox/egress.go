package sandbox

import (
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/broker"
	"github.com/moat-sandbox/moat/internal/netguard"
	"github.com/moat-sandbox/moat/policy"
)

// Egress tunnels (the policy's egress.hosts): the broker serves them on a
// second listener on the sandbox's loopback, the egress port, which the
// backend makes only when the policy has egress hosts
// (boundary.EgressListening). The workload finds it through the usual
// proxy variables (egressEnv).

// NoProxyLoopback are the NO_PROXY entries every workload with a proxy
// gets, so that the SDKs' own traffic to the broker (MOAT_BROKER_URL,
// ANTHROPIC_BASE_URL, ...) never goes through the egress port.
var NoProxyLoopback = []string{"127.0.0.1", "localhost", "::1"}

// egressListener returns the egress port's listener when the policy has
// egress hosts; a backend that cannot make one refuses the run.
func egressListener(sb boundary.Sandbox, backend string, pol *policy.Policy) (boundary.ListenerInfo, bool, error) {
	if len(pol.Egress.Hosts) == 0 {
		return boundary.ListenerInfo{}, false, nil
	}
	el, ok := sb.(boundary.EgressListening)
	if !ok {
		return boundary.ListenerInfo{}, false, &RefusedError{Msg: fmt.Sprintf("backend %s cannot serve egress.hosts (no egress port); remove egress.hosts or use another backend", backend)}
	}
	li, ok, err := el.EgressListener()
	if err != nil || !ok {
		return boundary.ListenerInfo{}, false, &RefusedError{Msg: fmt.Sprintf("backend %s gave no egress listener for egress.hosts: %v", backend, err)}
	}
	return li, true, nil
}

// testResolver, when set, is the tunnels' resolver: only in binaries
// built with the moat_test_hooks tag (egresstunnel_hooks.go), never by
// the policy or the CLI.
var testResolver netguard.Resolver

// tunnelGuard is the run's SSRF guard for tunnels: newEgressGuard's (the
// one test-global address of a hooks binary included), with a hooks
// binary's test resolver.
func tunnelGuard() *netguard.Guard {
	var opts []netguard.Option
	if testGlobalAddr.IsValid() {
		opts = append(opts, netguard.WithTestGlobal(testGlobalAddr))
	}
	if testResolver != nil {
		opts = append(opts, netguard.WithResolver(testResolver))
	}
	return netguard.New(opts...)
}

// openEgress builds the broker's egress state (the run's SSRF guard, the
// policy's grants) and the listener to serve it on.
func openEgress(pol *policy.Policy, li boundary.ListenerInfo) (*broker.Egress, net.Listener, error) {
	eg, err := broker.NewEgress(broker.EgressConfig{Policy: &pol.Egress, Guard: tunnelGuard()})
	if err != nil {
		li.File.Close()
		return nil, nil, err
	}
	ln, err := fileListener(li.File)
	if err != nil {
		return nil, nil, fmt.Errorf("egress listener: %w", err)
	}
	return eg, ln, nil
}

// egressEnv is the workload's proxy environment. With an egress port:
// HTTPS_PROXY and https_proxy (curl, Python, Go, most tools),
// npm_config_https_proxy (npm) and PIP_PROXY (pip) point at it, and
// NO_PROXY and no_proxy hold the policy's own entries plus
// NoProxyLoopback. HTTP_PROXY is not set: the egress port carries TLS
// tunnels only. Without an egress port, a policy env that names a
// NO_PROXY or no_proxy still gets NoProxyLoopback added to it.
func egressEnv(port int, pol *policy.Policy) []string {
	var env []string
	if port > 0 {
		u := "http://127.0.0.1:" + strconv.Itoa(port)
		env = append(env, "HTTPS_PROXY="+u, "https_proxy="+u, "npm_config_https_proxy="+u, "PIP_PROXY="+u)
	}
	for _, k := range []string{"NO_PROXY", "no_proxy"} {
		v, set := pol.Process.Env[k]
		if port == 0 && !set {
			continue
		}
		env = append(env, k+"="+noProxy(v))
	}
	return env
}

// explainEgress lists the policy's egress grants, one line each, for
// moat run --explain (policy.ExplainEgress; nothing without egress).
func explainEgress(w io.Writer, pol *policy.Policy) {
	for _, l := range pol.ExplainEgress() {
		fmt.Fprintf(w, "  %s\n", l)
	}
}

// noProxy is v (a comma-separated NO_PROXY list) with NoProxyLoopback
// added where missing.
func noProxy(v string) string {
	var out []string
	for _, e := range strings.Split(v, ",") {
		if e = strings.TrimSpace(e); e != "" && !slices.Contains(out, e) {
			out = append(out, e)
		}
	}
	for _, e := range NoProxyLoopback {
		if !slices.Contains(out, e) {
			out = append(out, e)
		}
	}
	return strings.Join(out, ",")
}
