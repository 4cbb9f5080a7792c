// Package kubeapi is moat's client of a Kubernetes cluster's API: the few
// calls the kubernetes backend, the evidence controller and the
// conformance suite make (Pods create/get/list/watch/delete,
// NetworkPolicies create/get/delete, Nodes list, the pods/exec URL), with
// typed k8s.io/api objects, over client-go's REST client.
//
// It exists instead of client-go's typed clientset (k8s.io/client-go/kubernetes)
// because that clientset's scheme registers every API group at package
// initialisation: linked into moat, it cost every moat process (the CLI,
// the supervisor, the init, the stage, the helpers: several per run)
// about 3 ms and 17,000 allocations before main, and doubled the binary.
// This package's scheme holds core/v1, networking/v1 and the meta types
// only, and is built on first use, so a moat process that never talks to
// a cluster pays nothing for it.
package kubeapi

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/moat-sandbox/moat/internal/kubeapi/kubeopt"
)

// Interface is what moat asks of a cluster. *Client implements it against
// an API server; tests may implement it over a fake.
type Interface interface {
	CreatePod(ctx context.Context, ns string, pod *corev1.Pod) (*corev1.Pod, error)
	GetPod(ctx context.Context, ns, name string) (*corev1.Pod, error)
	ListPods(ctx context.Context, ns string, opts metav1.ListOptions) (*corev1.PodList, error)
	// WatchPods watches the namespace's Pods that opts selects.
	WatchPods(ctx context.Context, ns string, opts metav1.ListOptions) (watch.Interface, error)
	DeletePod(ctx context.Context, ns, name string, opts metav1.DeleteOptions) error

	CreateNetworkPolicy(ctx context.Context, ns string, np *networkingv1.NetworkPolicy) (*networkingv1.NetworkPolicy, error)
	GetNetworkPolicy(ctx context.Context, ns, name string) (*networkingv1.NetworkPolicy, error)
	DeleteNetworkPolicy(ctx context.Context, ns, name string, opts metav1.DeleteOptions) error
	// ListNetworkPolicies lists the namespace's NetworkPolicies.
	ListNetworkPolicies(ctx context.Context, ns string, opts metav1.ListOptions) (*networkingv1.NetworkPolicyList, error)

	ListNodes(ctx context.Context, opts metav1.ListOptions) (*corev1.NodeList, error)

	// ExecURL is the URL of an exec into the Pod (pods/exec, POSTed by
	// a remotecommand executor) with opts as its query.
	ExecURL(ns, pod string, opts *corev1.PodExecOptions) *url.URL
}

// codecs is the scheme of the types this package speaks and its
// serializers, built once, on first use.
type codecs struct {
	scheme *runtime.Scheme
	codecs serializer.CodecFactory
	params runtime.ParameterCodec
}

var schemeOnce = sync.OnceValues(func() (*codecs, error) {
	s := runtime.NewScheme()
	// The meta types (Status, WatchEvent, the options) in the
	// unversioned "v1" as client-go's own scheme has them; core/v1 and
	// networking/v1 register them in their group versions too.
	metav1.AddToGroupVersion(s, schema.GroupVersion{Version: "v1"})
	if err := corev1.AddToScheme(s); err != nil {
		return nil, err
	}
	if err := networkingv1.AddToScheme(s); err != nil {
		return nil, err
	}
	return &codecs{scheme: s, codecs: serializer.NewCodecFactory(s), params: runtime.NewParameterCodec(s)}, nil
})

// Client is a cluster's API server.
type Client struct {
	cfg        *rest.Config
	core       *rest.RESTClient // /api/v1
	networking *rest.RESTClient // /apis/networking.k8s.io/v1
	params     runtime.ParameterCodec
}

var _ Interface = (*Client)(nil)

// Config loads a client configuration: the Pod's service account when
// inCluster, else the kubeconfig at path, else client-go's default
// loading rules ($KUBECONFIG, else ~/.kube/config), each with its current
// context.
func Config(path string, inCluster bool) (*rest.Config, error) {
	if inCluster {
		return rest.InClusterConfig()
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if path != "" {
		rules.ExplicitPath = path
	}
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
}

// New returns the client of the API server that cfg names. cfg is
// copied; its Timeout, if any, bounds every request but watches.
func New(cfg *rest.Config) (*Client, error) {
	cs, err := schemeOnce()
	if err != nil {
		return nil, fmt.Errorf("kubernetes: building the API scheme: %w", err)
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	core, err := restClient(cfg, hc, cs, corev1.SchemeGroupVersion, "/api")
	if err != nil {
		return nil, err
	}
	networking, err := restClient(cfg, hc, cs, networkingv1.SchemeGroupVersion, "/apis")
	if err != nil {
		return nil, err
	}
	return &Client{cfg: rest.CopyConfig(cfg), core: core, networking: networking, params: cs.params}, nil
}

// restClient is a REST client of one group version, configured as
// client-go's generated clients configure theirs (JSON, no conversion).
func restClient(cfg *rest.Config, hc *http.Client, cs *codecs, gv schema.GroupVersion, apiPath string) (*rest.RESTClient, error) {
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &gv
	c.APIPath = apiPath
	c.NegotiatedSerializer = cs.codecs.WithoutConversion()
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	return rest.RESTClientForConfigAndClient(c, hc)
}

// RESTConfig is a copy of the configuration the client was made with
// (remotecommand's executors want it).
func (c *Client) RESTConfig() *rest.Config { return rest.CopyConfig(c.cfg) }

func (c *Client) CreatePod(ctx context.Context, ns string, pod *corev1.Pod) (*corev1.Pod, error) {
	out := &corev1.Pod{}
	err := c.core.Post().Namespace(ns).Resource("pods").
		VersionedParams(&metav1.CreateOptions{}, c.params).Body(pod).Do(ctx).Into(out)
	return out, err
}

func (c *Client) GetPod(ctx context.Context, ns, name string) (*corev1.Pod, error) {
	out := &corev1.Pod{}
	err := c.core.Get().Namespace(ns).Resource("pods").Name(name).
		VersionedParams(&metav1.GetOptions{}, c.params).Do(ctx).Into(out)
	return out, err
}

func (c *Client) ListPods(ctx context.Context, ns string, opts metav1.ListOptions) (*corev1.PodList, error) {
	out := &corev1.PodList{}
	err := c.core.Get().Namespace(ns).Resource("pods").
		VersionedParams(&opts, c.params).Timeout(timeoutOf(opts)).Do(ctx).Into(out)
	return out, err
}

func (c *Client) WatchPods(ctx context.Context, ns string, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	return c.core.Get().Namespace(ns).Resource("pods").
		VersionedParams(&opts, c.params).Timeout(timeoutOf(opts)).Watch(ctx)
}

func (c *Client) DeletePod(ctx context.Context, ns, name string, opts metav1.DeleteOptions) error {
	return c.core.Delete().Namespace(ns).Resource("pods").Name(name).Body(&opts).Do(ctx).Error()
}

func (c *Client) CreateNetworkPolicy(ctx context.Context, ns string, np *networkingv1.NetworkPolicy) (*networkingv1.NetworkPolicy, error) {
	out := &networkingv1.NetworkPolicy{}
	err := c.networking.Post().Namespace(ns).Resource("networkpolicies").
		VersionedParams(&metav1.CreateOptions{}, c.params).Body(np).Do(ctx).Into(out)
	return out, err
}

func (c *Client) GetNetworkPolicy(ctx context.Context, ns, name string) (*networkingv1.NetworkPolicy, error) {
	out := &networkingv1.NetworkPolicy{}
	err := c.networking.Get().Namespace(ns).Resource("networkpolicies").Name(name).
		VersionedParams(&metav1.GetOptions{}, c.params).Do(ctx).Into(out)
	return out, err
}

func (c *Client) DeleteNetworkPolicy(ctx context.Context, ns, name string, opts metav1.DeleteOptions) error {
	return c.networking.Delete().Namespace(ns).Resource("networkpolicies").Name(name).Body(&opts).Do(ctx).Error()
}

func (c *Client) ListNetworkPolicies(ctx context.Context, ns string, opts metav1.ListOptions) (*networkingv1.NetworkPolicyList, error) {
	out := &networkingv1.NetworkPolicyList{}
	err := c.networking.Get().Namespace(ns).Resource("networkpolicies").
		VersionedParams(&opts, c.params).Timeout(timeoutOf(opts)).Do(ctx).Into(out)
	return out, err
}

func (c *Client) ListNodes(ctx context.Context, opts metav1.ListOptions) (*corev1.NodeList, error) {
	out := &corev1.NodeList{}
	err := c.core.Get().Resource("nodes").
		VersionedParams(&opts, c.params).Timeout(timeoutOf(opts)).Do(ctx).Into(out)
	return out, err
}

func (c *Client) ExecURL(ns, pod string, opts *corev1.PodExecOptions) *url.URL {
	return c.core.Post().Namespace(ns).Resource("pods").Name(pod).SubResource("exec").
		VersionedParams(opts, c.params).URL()
}

func timeoutOf(opts metav1.ListOptions) time.Duration {
	if opts.TimeoutSeconds != nil {
		return time.Duration(*opts.TimeoutSeconds) * time.Second
	}
	return 0
}

// NodeInternalIP is the InternalIP of the cluster's only node (its IPv4
// one when it has one): the
// address of the host the Pods reach when the node is moat's host. A
// cluster of any other number of nodes is a *NodeCountError.
func NodeInternalIP(ctx context.Context, c Interface) (netip.Addr, error) {
	nodes, err := c.ListNodes(ctx, metav1.ListOptions{})
	if err != nil {
		return netip.Addr{}, fmt.Errorf("listing nodes: %w", err)
	}
	if len(nodes.Items) != 1 {
		return netip.Addr{}, &NodeCountError{Nodes: len(nodes.Items)}
	}
	// An IPv4 InternalIP first, as the kubernetes backend chooses its
	// broker's address: a dual-stack node may list its IPv6 one first.
	var other netip.Addr
	for _, a := range nodes.Items[0].Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			if ip, err := netip.ParseAddr(a.Address); err == nil {
				if ip = ip.Unmap(); ip.Is4() {
					return ip, nil
				}
				if !other.IsValid() {
					other = ip
				}
			}
		}
	}
	if other.IsValid() {
		return other, nil
	}
	return netip.Addr{}, fmt.Errorf("node %s has no InternalIP", nodes.Items[0].Name)
}

// NodeCountError is a cluster without exactly one node, where the node's
// address is not the host's (kubeopt's, which the suites see).
type NodeCountError = kubeopt.NodeCountError
