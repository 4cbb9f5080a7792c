package conformance

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"syscall"
	"time"

	"github.com/moat-sandbox/moat/internal/kubeapi"
	"github.com/moat-sandbox/moat/internal/runinfo"
)

// The kubernetes backend's sandbox is a Pod of a cluster, and the suite
// observes it from where moat runs: the host receivers listen on the
// address the Pod reaches the host by (the broker's address, the single
// node's InternalIP), the workspace and the probe's directory are
// hostPath grants of the same paths (kubernetes.host_path_grants, so the
// node must be this host), and the Pod itself is looked up through the
// cluster's API by its name, moat-<run id>.

// k8sCluster is the suite's own view of the cluster, from the same
// kubeconfig the policy names.
type k8sCluster struct {
	cs kubeapi.Interface
	ns string
}

func newK8sCluster(k *Kubernetes) (*k8sCluster, error) {
	kc := k.Kubeconfig
	if kc == "" {
		return nil, fmt.Errorf("kubernetes: no kubeconfig (--kubeconfig or $KUBECONFIG)")
	}
	cfg, err := kubeapi.Config(kc, false)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: kubeconfig %s: %w", kc, err)
	}
	cfg.Timeout = 30 * time.Second
	cs, err := kubeapi.New(cfg)
	if err != nil {
		return nil, err
	}
	return &k8sCluster{cs: cs, ns: k.namespace()}, nil
}

// hostAddress is the address of this host that the Pods reach: the
// configured broker address, else the only node's InternalIP (as the
// backend chooses it).
func (c *k8sCluster) hostAddress(ctx context.Context, configured string) (netip.Addr, error) {
	if configured != "" {
		return netip.ParseAddr(configured)
	}
	ip, err := kubeapi.NodeInternalIP(ctx, c.cs)
	var nc *kubeapi.NodeCountError
	if errors.As(err, &nc) {
		return netip.Addr{}, fmt.Errorf("kubernetes: %w; give --k8s-broker-address", err)
	}
	if err != nil {
		return netip.Addr{}, fmt.Errorf("kubernetes: %w", err)
	}
	return ip, nil
}

// podExists reports whether the run's Pod exists and is not being
// deleted.
func (c *k8sCluster) podExists(ctx context.Context, runID string) (bool, error) {
	return kubeapi.PodLive(ctx, c.cs, c.ns, kubeapi.ObjectName(runID))
}

// objectsLeft lists the Pods and NetworkPolicies of the run still in the
// namespace.
func (c *k8sCluster) objectsLeft(ctx context.Context, runID string) ([]string, error) {
	return kubeapi.ObjectsLeft(ctx, c.cs, c.ns, kubeapi.ObjectName(runID))
}

// kubernetesPolicy is the policy's kubernetes section for the harness.
func (h *harness) kubernetesPolicy() string {
	k := h.k8s
	s := fmt.Sprintf("kubernetes:\n  kubeconfig: %s\n  namespace: %s\n  image: %s\n  host_path_grants: true\n", k.Kubeconfig, k.namespace(), k.Image)
	if k.RuntimeClass != "" {
		s += fmt.Sprintf("  runtime_class_name: %s\n", k.RuntimeClass)
	}
	if k.BrokerAddress != "" {
		s += fmt.Sprintf("  broker_address: %s\n", k.BrokerAddress)
	}
	return s
}

// cluster is the harness's client of the kubernetes cluster.
func (h *harness) cluster() (*k8sCluster, error) {
	if h.k8sClient == nil {
		c, err := newK8sCluster(h.k8s)
		if err != nil {
			return nil, err
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
	exists, err := c.podExists(ctx, info.RunID)
	if err != nil {
		v.invalid("looking up the Pod: %v", err)
		return v.result()
	}
	v.control(exists, "the sandbox's Pod %s exists in %s while moat runs", kubeapi.ObjectName(info.RunID), c.ns)
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	// The watchdog deletes the Pod, waits for it to be gone, then the
	// NetworkPolicy; 60 s covers the Pod's grace period on a loaded node.
	var left []string
	for end := time.Now().Add(60 * time.Second); ; {
		left, err = c.objectsLeft(ctx, info.RunID)
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
