package conformance

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"syscall"
	"time"

	"github.com/moat-sandbox/moat/internal/kubeapi/kubeopt"
	"github.com/moat-sandbox/moat/internal/runinfo"
)

// The kubernetes backend's sandbox is a Pod of a cluster, and the suite
// observes it from where moat runs: the host receivers listen on the
// address the Pod reaches the host by (the broker's address, the single
// node's InternalIP), the workspace and the probe's directory are
// hostPath grants of the same paths (kubernetes.host_path_grants, so the
// node must be this host), and the Pod itself is looked up through the
// cluster's API by its name, moat-<run id>.

// hostAddress is the address of this host that the Pods reach: the
// configured broker address, else the only node's InternalIP (as the
// backend chooses it).
func hostAddress(ctx context.Context, c kubeopt.Cluster, configured string) (netip.Addr, error) {
	if configured != "" {
		return netip.ParseAddr(configured)
	}
	ip, err := c.NodeAddress(ctx)
	var nc *kubeopt.NodeCountError
	if errors.As(err, &nc) {
		return netip.Addr{}, fmt.Errorf("kubernetes: %w; give --k8s-broker-address", err)
	}
	if err != nil {
		return netip.Addr{}, fmt.Errorf("kubernetes: %w", err)
	}
	return ip, nil
}

// kubernetesPolicy is the policy's kubernetes section for the harness.
func (h *harness) kubernetesPolicy() string { return h.k8s.PolicySection() }

// cluster is the harness's view of the kubernetes cluster, from the same
// kubeconfig the policy names (kubeopt.Open: moat-kubernetes's client).
func (h *harness) cluster() (kubeopt.Cluster, error) {
	if h.k8sClient == nil {
		if h.k8s == nil || h.k8s.Kubeconfig == "" {
			return nil, fmt.Errorf("kubernetes: no kubeconfig (--kubeconfig or $KUBECONFIG)")
		}
		c, err := kubeopt.Open(h.k8s)
		if err != nil {
			return nil, fmt.Errorf("kubernetes: %w", err)
		}
		h.k8sClient = c
	}
	return h.k8sClient, nil
}

// supervisorLossKubernetes is supervisor-loss where the sandbox's
// processes are not the host's: they run in the Pod, under the node's
// container runtime, not below moat. What must not outlive moat is the
// Pod (and with it every process in it): after SIGKILL to moat run, the
// Pod moat-<run id> must be gone (or being deleted) and, once deleted,
// the NetworkPolicy too. Control: the Pod exists and is not being
// deleted while moat runs.
func supervisorLossKubernetes(ctx context.Context, h *harness) Result {
	v := &verdict{}
	c, err := h.cluster()
	if err != nil {
		return Result{Outcome: Invalid, Reason: err.Error()}
	}
	pol, err := h.policyFile()
	if err != nil {
		return Result{Outcome: Invalid, Reason: err.Error()}
	}
	ri := filepath.Join(h.dir, "run-info.json")
	cmd := h.command(ctx, "run", "--backend", h.backend, "--policy", pol, "--run-info", ri, "--",
		"sh", "-c", "sleep 300 & sleep 300")
	if err := cmd.Start(); err != nil {
		return Result{Outcome: Invalid, Reason: err.Error()}
	}
	defer cmd.Process.Kill()
	deadline := time.Now().Add(runTimeout)
	var info runinfo.Info
	for {
		if i, _, err := runinfo.Read(ri); err == nil {
			info = i
			break
		}
		if time.Now().After(deadline) {
			v.invalid("no run info within %v", runTimeout)
			return v.result()
		}
		time.Sleep(50 * time.Millisecond)
	}
	exists, err := c.PodLive(ctx, info.RunID)
	if err != nil {
		v.invalid("looking up the Pod: %v", err)
		return v.result()
	}
	v.control(exists, "the sandbox's Pod %s exists in %s while moat runs", kubeopt.ObjectName(info.RunID), c.Namespace())
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	// The watchdog deletes the Pod, waits for it to be gone, then the
	// NetworkPolicy; 60 s covers the Pod's grace period on a loaded node.
	var left []string
	for end := time.Now().Add(60 * time.Second); ; {
		left, err = c.ObjectsLeft(ctx, info.RunID)
		if err != nil {
			v.invalid("looking up the Pod: %v", err)
			return v.result()
		}
		if len(left) == 0 || time.Now().After(end) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	v.violation(len(left) == 0, "after SIGKILL to moat neither the Pod nor the NetworkPolicy is left (left: %v)", left)
	return v.result()
}
