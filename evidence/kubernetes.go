package evidence

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/moat-sandbox/moat/internal/kubeapi"
)

// Kubernetes is what the case policies need for --backend kubernetes (the
// policy's kubernetes section). The workspace and the probe's directory
// are hostPath grants (kubernetes.host_path_grants), so the cluster's
// node must be this host: the controller's host view of a Pod is then the
// node's view, where the Pod's processes (gVisor's sandbox and gofers)
// are found by the Pod's uid in their cgroup, and the Pod and its
// NetworkPolicy through the cluster's API.
type Kubernetes struct {
	Kubeconfig   string // required
	Image        string // required: holds the moat binary under test at /usr/local/bin/moat
	Namespace    string // default "default"
	RuntimeClass string // default: the policy's ("gvisor")
}

func (k *Kubernetes) namespace() string {
	if k.Namespace == "" {
		return "default"
	}
	return k.Namespace
}

// CheckKubernetes refuses --backend kubernetes without what the case
// policies need; it makes the kubeconfig's path absolute.
func CheckKubernetes(k *Kubernetes) error {
	if k == nil || k.Image == "" {
		return fmt.Errorf("--backend kubernetes needs the sandbox image (--k8s-image or $MOAT_K8S_IMAGE): an image holding the moat binary under test at /usr/local/bin/moat")
	}
	if k.Kubeconfig == "" {
		return fmt.Errorf("--backend kubernetes needs a kubeconfig (--kubeconfig or $KUBECONFIG)")
	}
	abs, err := filepath.Abs(k.Kubeconfig)
	if err != nil {
		return err
	}
	if _, err := os.Stat(abs); err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	k.Kubeconfig = abs
	return nil
}

// kubernetesPolicy is the case policy's kubernetes section.
func (k *Kubernetes) policy() string {
	s := fmt.Sprintf("kubernetes:\n  kubeconfig: %s\n  namespace: %s\n  image: %s\n  host_path_grants: true\n", k.Kubeconfig, k.namespace(), k.Image)
	if k.RuntimeClass != "" {
		s += fmt.Sprintf("  runtime_class_name: %s\n", k.RuntimeClass)
	}
	return s
}

// kubeView is the controller's client of the cluster.
type kubeView struct {
	cs kubeapi.Interface
	ns string
}

func newKubeView(k *Kubernetes) (*kubeView, error) {
	cfg, err := kubeapi.Config(k.Kubeconfig, false)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", k.Kubeconfig, err)
	}
	cfg.Timeout = 30 * time.Second
	cs, err := kubeapi.New(cfg)
	if err != nil {
		return nil, err
	}
	return &kubeView{cs: cs, ns: k.namespace()}, nil
}

// hostAddress is the address by which the Pods reach this host: the only
// node's InternalIP, as the backend chooses its broker address.
func (v *kubeView) hostAddress(ctx context.Context) (netip.Addr, error) {
	ip, err := kubeapi.NodeInternalIP(ctx, v.cs)
	var nc *kubeapi.NodeCountError
	if errors.As(err, &nc) {
		return netip.Addr{}, fmt.Errorf("kubernetes: %w; the suite needs the single node to be this host", err)
	}
	if err != nil {
		return netip.Addr{}, fmt.Errorf("kubernetes: %w", err)
	}
	return ip, nil
}

// podUID is the uid of the run's Pod.
func (v *kubeView) podUID(ctx context.Context, runID string) (string, error) {
	p, err := v.cs.GetPod(ctx, v.ns, kubeapi.ObjectName(runID))
	if err != nil {
		return "", fmt.Errorf("kubernetes: the run's Pod %s/%s: %w", v.ns, kubeapi.ObjectName(runID), err)
	}
	return string(p.UID), nil
}

// objectsLeft lists the run's Pod and NetworkPolicy while they exist.
func (v *kubeView) objectsLeft(ctx context.Context, runID string) ([]string, error) {
	return kubeapi.ObjectsLeft(ctx, v.cs, v.ns, kubeapi.ObjectName(runID))
}

// observePod records the host's view of the run's Pod once it is Ready:
// its processes on this host (the node), found by the Pod's uid in their
// cgroup, whose namespaces and no_new_privs are observed as a native
// worker's are. It returns those pids for the cleanup check.
func (r *caseRun) observePod(ctx context.Context, runID string) []int {
	uid, err := r.s.kube.podUID(ctx, runID)
	if err != nil {
		r.host.Missing = append(r.host.Missing, err.Error())
		return nil
	}
	pids, err := podPids(uid)
	if err != nil || len(pids) == 0 {
		r.host.Missing = append(r.host.Missing, fmt.Sprintf("no process of Pod uid %s found on this host (%v): the node must be this host", uid, err))
		return nil
	}
	r.host.Notes = append(r.host.Notes, fmt.Sprintf("kubernetes: Pod %s/%s uid %s: %d processes on this host (by cgroup), observed as the worker", r.s.kube.ns, kubeapi.ObjectName(runID), uid, len(pids)))
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
		left, err := r.s.kube.objectsLeft(ctx, runID)
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
	return r.s.Kubernetes.policy()
}
