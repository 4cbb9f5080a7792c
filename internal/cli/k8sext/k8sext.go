// Package k8sext is the kubernetes backend as an extension of moat's CLI
// (cli.Extension): the backend, the hidden helpers it re-runs moat as (in
// the sandbox's Pod: pause, stage, signal, dial; on the host: the
// watchdog), and the suites' client of a cluster (internal/kubeapi). Only
// cmd/moat-kubernetes imports it, so that cmd/moat links no Kubernetes
// client (deps_test.go); the lean moat hands kubernetes commands to
// moat-kubernetes.
package k8sext

import (
	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/boundary/kubernetes"
	"github.com/moat-sandbox/moat/internal/cli"
	"github.com/moat-sandbox/moat/internal/kubeapi"
	"github.com/moat-sandbox/moat/internal/reexec"
)

// Helpers are the kubernetes backend's hidden helpers. Every name starts
// with reexec.Prefix + "k8s-", by which the lean moat knows to hand it off
// (TestHelperNames).
var Helpers = []reexec.Helper{
	// Inside the sandbox's Pod (moat-kubernetes is the image's /usr/local/bin/moat).
	{Name: kubernetes.PauseHelper, Main: kubernetes.PauseMain},   // the container's main process
	{Name: kubernetes.StageHelper, Main: kubernetes.StageMain},   // env, dir and moat's seccomp filter in front of each exec
	{Name: kubernetes.SignalHelper, Main: kubernetes.SignalMain}, // a signal to a process a stage started
	{Name: kubernetes.DialHelper, Main: kubernetes.DialMain},     // Prepare's wait for the NetworkPolicy to take effect
	// On the host: removes the Pod and NetworkPolicy if their supervisor dies.
	{Name: kubernetes.WatchdogHelper, Main: kubernetes.WatchdogMain},
}

// Extension is the kubernetes backend for cli.Main.
func Extension() cli.Extension {
	return cli.Extension{
		Backends: []boundary.Backend{kubernetes.New()},
		Helpers:  Helpers,
		Cluster:  kubeapi.OpenCluster,
	}
}
