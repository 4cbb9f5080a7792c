package evidence

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/moat-sandbox/moat/internal/kubeapi/kubeopt"
)

// Kubernetes is what the case policies need for --backend kubernetes (the
// policy's kubernetes section; BrokerAddress is not used: the broker's
// address is the single node's InternalIP). The workspace and the
// probe's directory are hostPath grants (kubernetes.host_path_grants), so
// the cluster's node must be this host: the controller's host view of a
// Pod is then the node's view, where the Pod's processes (gVisor's
// sandbox and gofers) are found by the Pod's uid in their cgroup, and the
// Pod and its NetworkPolicy through the cluster's API (kubeopt.Cluster,
// which only moat-kubernetes links a client for).
type Kubernetes = kubeopt.Options

// CheckKubernetes refuses --backend kubernetes without what the case
// policies need; it makes the kubeconfig's path absolute.
func CheckKubernetes(k *Kubernetes) error { return kubeopt.Check(k) }

// kubeHostAddress is the address by which the Pods reach this host: the
// only node's InternalIP, as the backend chooses its broker address.
func kubeHostAddress(ctx context.Context, c kubeopt.Cluster) (netip.Addr, error) {
	ip, err := c.NodeAddress(ctx)
	var nc *kubeopt.NodeCountError
	if errors.As(err, &nc) {
		return netip.Addr{}, fmt.Errorf("kubernetes: %w; the suite needs the single node to be this host", err)
	}
	if err != nil {
		return netip.Addr{}, fmt.Errorf("kubernetes: %w", err)
	}
	return ip, nil
}

// observePod records the host's view of the run's Pod once it is Ready:
// its processes on this host (the node), found by the Pod's uid in their
// cgroup, whose namespaces and no_new_privs are observed as a native
// worker's are. It returns those pids for the cleanup check.
func (r *caseRun) observePod(ctx context.Context, runID string) []int {
	uid, err := r.s.kube.PodUID(ctx, runID)
	if err != nil {
		r.host.Missing = append(r.host.Missing, "kubernetes: "+err.Error())
		return nil
	}
	pids, err := podPids(uid)
	if err != nil || len(pids) == 0 {
		r.host.Missing = append(r.host.Missing, fmt.Sprintf("no process of Pod uid %s found on this host (%v): the node must be this host", uid, err))
		return nil
	}
	r.host.Notes = append(r.host.Notes, fmt.Sprintf("kubernetes: Pod %s/%s uid %s: %d processes on this host (by cgroup), observed as the worker", r.s.kube.Namespace(), kubeopt.ObjectName(runID), uid, len(pids)))
	observeNamespaces(&r.host, pids)
	return pids
}

// podGoneWait bounds the wait for a run's Pod to be deleted (its grace
// period on a loaded node included).
const podGoneWait = 60 * time.Second

// observePodGone waits (at most podGoneWait) for
// the run's Pod and NetworkPolicy to be gone from the cluster; either
// left makes the worker not gone.
func (r *caseRun) observePodGone(ctx context.Context, h *HostRecord, runID string) {
	deadline := time.Now().Add(podGoneWait)
	for {
		left, err := r.s.kube.ObjectsLeft(ctx, runID)
		if err != nil {
			h.Missing = append(h.Missing, "kubernetes: "+err.Error())
			return
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			h.WorkerGone = boolp(false)
			h.Notes = append(h.Notes, fmt.Sprintf("kubernetes: left in the cluster after the run: %v", left))
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// kubernetesPolicy is the case policy's kubernetes section, or "".
func (r *caseRun) kubernetesPolicy() string {
	if r.s.kube == nil {
		return ""
	}
	return r.s.Kubernetes.PolicySection()
}
