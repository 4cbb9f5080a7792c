// Package kubeopt is what of the kubernetes backend the suites (evidence,
// conformance) and the lean moat binary may know without a Kubernetes
// client: the suites' cluster options and their check, the name of a
// run's objects, and the Cluster the suites observe a run through.
//
// It imports no k8s.io package, so that cmd/moat (which links evidence
// and conformance) stays free of client-go (deps_test.go). The Cluster is
// implemented by internal/kubeapi, which only cmd/moat-kubernetes links:
// it registers its opener (Register) before any command runs; in the lean
// binary Open refuses, and the CLI hands a kubernetes command to
// moat-kubernetes before it gets there.
package kubeopt

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
)

// MoatInImage is where the sandbox image holds the moat binary under
// test (boundary/kubernetes runs its in-Pod helpers from there).
const MoatInImage = "/usr/local/bin/moat"

// Options is what the suites' policies need for the kubernetes backend
// (the policy's kubernetes section). The workspace and the probe's
// directory are hostPath grants (kubernetes.host_path_grants), so the
// cluster's node must be this host (as scripts/k8s-cluster's is).
type Options struct {
	Kubeconfig    string // required
	Image         string // required: holds the moat-kubernetes binary under test at MoatInImage
	Namespace     string // default "default"
	RuntimeClass  string // default: the policy's ("gvisor")
	BrokerAddress string // default: the single node's InternalIP
}

// NamespaceOrDefault is the Pods' namespace.
func (o *Options) NamespaceOrDefault() string {
	if o.Namespace == "" {
		return "default"
	}
	return o.Namespace
}

// Check refuses a kubernetes run that lacks what the policy needs, before
// any case or scenario runs; it makes the kubeconfig's path absolute.
func Check(o *Options) error {
	if o == nil || o.Image == "" {
		return fmt.Errorf("--backend kubernetes needs the sandbox image (--k8s-image or $MOAT_K8S_IMAGE): an image holding the moat-kubernetes binary under test at %s", MoatInImage)
	}
	if o.Kubeconfig == "" {
		return fmt.Errorf("--backend kubernetes needs a kubeconfig (--kubeconfig or $KUBECONFIG)")
	}
	abs, err := filepath.Abs(o.Kubeconfig)
	if err != nil {
		return err
	}
	if _, err := os.Stat(abs); err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	o.Kubeconfig = abs
	return nil
}

// PolicySection is the policy's kubernetes section for these options,
// with hostPath grants.
func (o *Options) PolicySection() string {
	s := fmt.Sprintf("kubernetes:\n  kubeconfig: %s\n  namespace: %s\n  image: %s\n  host_path_grants: true\n", o.Kubeconfig, o.NamespaceOrDefault(), o.Image)
	if o.RuntimeClass != "" {
		s += fmt.Sprintf("  runtime_class_name: %s\n", o.RuntimeClass)
	}
	if o.BrokerAddress != "" {
		s += fmt.Sprintf("  broker_address: %s\n", o.BrokerAddress)
	}
	return s
}

// Cluster is the suites' view of the cluster that runs a run's Pod: what
// they observe of a run from outside, by its objects' name
// (ObjectName(runID)).
type Cluster interface {
	// Namespace is the namespace of the run's objects.
	Namespace() string
	// NodeAddress is the InternalIP of the cluster's only node (IPv4
	// first): the address of the host the Pods reach. A cluster of any
	// other number of nodes is a *NodeCountError.
	NodeAddress(ctx context.Context) (netip.Addr, error)
	// PodUID is the uid of the run's Pod.
	PodUID(ctx context.Context, runID string) (string, error)
	// PodLive reports whether the run's Pod exists and is not being
	// deleted.
	PodLive(ctx context.Context, runID string) (bool, error)
	// ObjectsLeft lists the run's Pod and NetworkPolicy while they exist
	// ("pod/NAME", "networkpolicy/NAME"); an object that cannot be seen
	// is an error, never gone.
	ObjectsLeft(ctx context.Context, runID string) ([]string, error)
}

// NodeCountError is a cluster without exactly one node, where the node's
// address is not the host's.
type NodeCountError struct{ Nodes int }

func (e *NodeCountError) Error() string {
	return fmt.Sprintf("the cluster has %d nodes", e.Nodes)
}

// ErrNoClient is Open's refusal in a binary that links no Kubernetes
// client (the lean moat; moat-kubernetes has one).
var ErrNoClient = errors.New("this moat binary has no Kubernetes client: the kubernetes backend and its suites are in moat-kubernetes (go build ./cmd/moat-kubernetes)")

var (
	mu     sync.Mutex
	opener func(*Options) (Cluster, error)
)

// Register sets how Open reaches a cluster; moat-kubernetes calls it
// (through internal/cli's Extension) before any command runs.
func Register(open func(*Options) (Cluster, error)) {
	mu.Lock()
	defer mu.Unlock()
	opener = open
}

// Open is the cluster's view from the options' kubeconfig, or ErrNoClient.
func Open(o *Options) (Cluster, error) {
	mu.Lock()
	open := opener
	mu.Unlock()
	if open == nil {
		return nil, ErrNoClient
	}
	return open(o)
}
