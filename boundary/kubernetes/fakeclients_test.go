package kubernetes

import (
	"context"
	"net/url"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/moat-sandbox/moat/internal/kubeapi"
	"github.com/moat-sandbox/moat/policy"
)

// fakeAPI is kubeapi.Interface over client-go's fake clientset (its
// object tracker and reactors), for the unit tests: moat itself links
// kubeapi's REST client, not the typed clientset.
type fakeAPI struct{ cs kubernetes.Interface }

var _ kubeapi.Interface = fakeAPI{}

// fakeClients is a backend's clients hook over cs. No REST
// configuration: Prepare then neither execs nor waits for the policy.
func fakeClients(cs kubernetes.Interface) func(*policy.Kubernetes) (kubeapi.Interface, *rest.Config, error) {
	return func(*policy.Kubernetes) (kubeapi.Interface, *rest.Config, error) { return fakeAPI{cs}, nil, nil }
}

func (f fakeAPI) CreatePod(ctx context.Context, ns string, pod *corev1.Pod) (*corev1.Pod, error) {
	return f.cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
}

func (f fakeAPI) GetPod(ctx context.Context, ns, name string) (*corev1.Pod, error) {
	return f.cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
}

func (f fakeAPI) ListPods(ctx context.Context, ns string, opts metav1.ListOptions) (*corev1.PodList, error) {
	return f.cs.CoreV1().Pods(ns).List(ctx, opts)
}

func (f fakeAPI) WatchPods(ctx context.Context, ns string, opts metav1.ListOptions) (watch.Interface, error) {
	return f.cs.CoreV1().Pods(ns).Watch(ctx, opts)
}

func (f fakeAPI) DeletePod(ctx context.Context, ns, name string, opts metav1.DeleteOptions) error {
	return f.cs.CoreV1().Pods(ns).Delete(ctx, name, opts)
}

func (f fakeAPI) CreateNetworkPolicy(ctx context.Context, ns string, np *networkingv1.NetworkPolicy) (*networkingv1.NetworkPolicy, error) {
	return f.cs.NetworkingV1().NetworkPolicies(ns).Create(ctx, np, metav1.CreateOptions{})
}

func (f fakeAPI) GetNetworkPolicy(ctx context.Context, ns, name string) (*networkingv1.NetworkPolicy, error) {
	return f.cs.NetworkingV1().NetworkPolicies(ns).Get(ctx, name, metav1.GetOptions{})
}

func (f fakeAPI) DeleteNetworkPolicy(ctx context.Context, ns, name string, opts metav1.DeleteOptions) error {
	return f.cs.NetworkingV1().NetworkPolicies(ns).Delete(ctx, name, opts)
}

func (f fakeAPI) ListNetworkPolicies(ctx context.Context, ns string, opts metav1.ListOptions) (*networkingv1.NetworkPolicyList, error) {
	return f.cs.NetworkingV1().NetworkPolicies(ns).List(ctx, opts)
}

func (f fakeAPI) ListNodes(ctx context.Context, opts metav1.ListOptions) (*corev1.NodeList, error) {
	return f.cs.CoreV1().Nodes().List(ctx, opts)
}

// ExecURL names the exec the fake cannot run (the backend refuses exec
// without a REST configuration before asking).
func (f fakeAPI) ExecURL(ns, pod string, opts *corev1.PodExecOptions) *url.URL {
	return &url.URL{Scheme: "https", Host: "fake.invalid", Path: "/api/v1/namespaces/" + ns + "/pods/" + pod + "/exec"}
}
