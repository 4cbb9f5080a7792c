package kubeapi

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/moat-sandbox/moat/internal/kubeapi/kubeopt"
)

// OpenCluster is the suites' view (kubeopt.Cluster) of the cluster that
// o's kubeconfig names; moat-kubernetes registers it with kubeopt.Register.
func OpenCluster(o *kubeopt.Options) (kubeopt.Cluster, error) {
	cfg, err := Config(o.Kubeconfig, false)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", o.Kubeconfig, err)
	}
	cfg.Timeout = 30 * time.Second
	c, err := New(cfg)
	if err != nil {
		return nil, err
	}
	return NewCluster(c, o.NamespaceOrDefault()), nil
}

// NewCluster is the suites' view of the cluster through c, in namespace ns.
func NewCluster(c Interface, ns string) kubeopt.Cluster { return &cluster{c: c, ns: ns} }

type cluster struct {
	c  Interface
	ns string
}

func (v *cluster) Namespace() string { return v.ns }

func (v *cluster) NodeAddress(ctx context.Context) (netip.Addr, error) {
	return NodeInternalIP(ctx, v.c)
}

func (v *cluster) PodUID(ctx context.Context, runID string) (string, error) {
	p, err := v.c.GetPod(ctx, v.ns, ObjectName(runID))
	if err != nil {
		return "", fmt.Errorf("the run's Pod %s/%s: %w", v.ns, ObjectName(runID), err)
	}
	return string(p.UID), nil
}

func (v *cluster) PodLive(ctx context.Context, runID string) (bool, error) {
	return PodLive(ctx, v.c, v.ns, ObjectName(runID))
}

func (v *cluster) ObjectsLeft(ctx context.Context, runID string) ([]string, error) {
	return ObjectsLeft(ctx, v.c, v.ns, ObjectName(runID))
}
