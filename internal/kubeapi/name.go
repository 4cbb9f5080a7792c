package kubeapi

import "github.com/moat-sandbox/moat/internal/kubeapi/kubeopt"

// ObjectName is kubeopt.ObjectName: the name the kubernetes backend gives
// a run's Pod and NetworkPolicy. The rule lives in kubeopt, which links no
// Kubernetes client, so that the suites find a run's objects by the same
// name in either binary.
func ObjectName(runID string) string { return kubeopt.ObjectName(runID) }
