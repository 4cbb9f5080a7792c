package kubernetes

// Red team of the kubernetes backend (issue 20): unit tests against
// client-go's fake clientset. The attacks run against the real cluster are
// in e2e/kubernetes_redteam_test.go, with the list of attacks that did not
// work.

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/moat-sandbox/moat/boundary"
)

func runningPod(ns, name string, uid types.UID, ip string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: uid},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip,
			ContainerStatuses: []corev1.ContainerStatus{{Name: containerName, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}},
	}
}

func tcpFrom(ip string) net.Addr {
	return &net.TCPAddr{IP: net.ParseIP(ip), Port: 40000}
}

// TestRedteamWatchGap (attack: the sandbox's Pod deleted, or replaced
// by someone else's Pod of the same name, while the watch is down): the
// API server ends watches now and then and the backend starts a new one,
// which reports only the Pods that exist from then on. A Pod deleted in
// the gap was never seen to go: the broker kept admitting its IP, which
// the next Pod on the node can get. A Pod made again under the same name
// (another UID, another IP) was taken for the sandbox's from its first
// event, and its IP admitted. The positive control, in the same sandbox:
// across a first gap the Pod lives on and stays admitted, another source
// refused, and the sandbox does not end.
func TestRedteamWatchGap(t *testing.T) {
	for _, tc := range []struct {
		name     string
		impostor bool
	}{{"deleted", false}, {"replaced", true}} {
		t.Run(tc.name, func(t *testing.T) { watchGap(t, tc.impostor) })
	}
}

func watchGap(t *testing.T, impostor bool) {
	const ns, name = "ns", "moat-run1"
	cs := fake.NewClientset(runningPod(ns, name, "uid-1", "10.244.0.9"))
	watchers := make(chan *watch.FakeWatcher, 4)
	cs.PrependWatchReactor("pods", func(k8stesting.Action) (bool, watch.Interface, error) {
		w := watch.NewFakeWithChanSize(8, false)
		watchers <- w
		return true, w, nil
	})
	s := &sandbox{cs: fakeAPI{cs}, ns: ns, name: name, gone: make(chan struct{}), stopWatch: make(chan struct{})}
	s.uid = "uid-1"
	s.podIP = netip.MustParseAddr("10.244.0.9")
	go s.watch()
	defer close(s.stopWatch)
	next := func() *watch.FakeWatcher {
		t.Helper()
		select {
		case w := <-watchers:
			return w
		case <-time.After(10 * time.Second):
			t.Fatal("no new watch")
		}
		return nil
	}
	w := next()
	if err := s.admit(tcpFrom("10.244.0.9")); err != nil {
		t.Fatalf("the sandbox's own Pod refused: %v", err)
	}
	if err := s.admit(tcpFrom("10.244.0.10")); err == nil {
		t.Fatal("another source admitted")
	}
	// Control: the watch ends, the Pod lives on (a new watch reports it).
	w.Stop()
	w = next()
	w.Add(runningPod(ns, name, "uid-1", "10.244.0.9"))
	time.Sleep(300 * time.Millisecond)
	if err := s.admit(tcpFrom("10.244.0.9")); err != nil {
		t.Fatalf("after a watch gap with the Pod alive: %v", err)
	}
	select {
	case <-s.Ended():
		t.Fatalf("ended after a watch gap with the Pod alive: %s", s.EndReason())
	default:
	}

	// The attack: the running watch misses the deletion (and the
	// impostor's creation), then ends; a new one reports what exists.
	pods := corev1.SchemeGroupVersion.WithResource("pods")
	if err := cs.Tracker().Delete(pods, ns, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	imp := runningPod(ns, name, "uid-2", "10.244.0.10")
	if impostor {
		if err := cs.Tracker().Add(imp); err != nil {
			t.Fatal(err)
		}
	}
	w.Stop()
	select {
	case w = <-watchers:
		// A new watch started without a look at the Pod.
		if impostor {
			w.Add(imp)
		}
	case <-s.Ended():
	case <-time.After(5 * time.Second):
	}
	select {
	case <-s.Ended():
	case <-time.After(5 * time.Second):
		t.Errorf("the sandbox never noticed that its Pod was %s in a watch gap", map[bool]string{false: "deleted", true: "replaced"}[impostor])
	}
	for _, ip := range []string{"10.244.0.9", "10.244.0.10"} {
		if err := s.admit(tcpFrom(ip)); err == nil {
			t.Errorf("after its Pod was gone in a watch gap, the broker admits %s", ip)
		}
	}
}

// TestRedteamKubeconfigInGrant (attack: the workload rewrites the
// cluster credentials): with host_path_grants a read_write grant is the
// host's directory, so a kubeconfig there, or an exec credential plugin's
// command there, is the workload's to rewrite; moat's watchdog loads the
// kubeconfig afresh when the supervisor dies (and the next run does), and
// client-go runs the exec plugin on the host, outside any sandbox.
// Prepare refuses both before anything is made; the controls in the same
// setup: the same kubeconfig outside the grant, and the grant as an
// emptyDir (host_path_grants off), pass this check (and fail later, at
// the fake cluster's missing node).
func TestRedteamKubeconfigInGrant(t *testing.T) {
	cs := fake.NewClientset()
	be := &backend{clients: fakeClients(cs)}
	outside := t.TempDir()
	kubeconfig := func(dir, command string) string {
		p := filepath.Join(dir, "kube.conf")
		y := `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {exec: {apiVersion: client.authentication.k8s.io/v1, command: "` + command + `", interactiveMode: Never}}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`
		if err := os.WriteFile(p, []byte(y), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// testPolicy makes a fresh grant each call: build the policy here.
	pol := testPolicy(t, "")
	grant := pol.Filesystem.ReadWrite[0]
	run := func(hostPath bool, kc string) error {
		p := *pol
		p.Kubernetes.HostPathGrants = hostPath
		p.Kubernetes.Kubeconfig = kc
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		sb, err := be.Prepare(ctx, boundary.Spec{RunID: "r", Policy: &p, StateDir: t.TempDir()})
		if err == nil {
			sb.Terminate()
		}
		return err
	}
	for _, tc := range []struct {
		name     string
		hostPath bool
		kc       string
		refused  bool
	}{
		{"kubeconfig in the grant", true, kubeconfig(grant, "/bin/true"), true},
		{"exec plugin in the grant", true, kubeconfig(outside, filepath.Join(grant, "cred-helper")), true},
		{"control: kubeconfig and plugin outside", true, kubeconfig(t.TempDir(), "/bin/true"), false},
		{"control: grants are emptyDir", false, filepath.Join(grant, "kube.conf"), false},
	} {
		err := run(tc.hostPath, tc.kc)
		if got := err != nil && strings.Contains(err.Error(), "lies in the read_write grant"); got != tc.refused {
			t.Errorf("%s: refused %v, want %v (%v)", tc.name, got, tc.refused, err)
		}
		if !tc.refused && err == nil {
			t.Errorf("%s: Prepare succeeded against a cluster without a node", tc.name)
		}
	}
}

// TestRedteamWatchdogRetry (attack: the supervisor dies while the API
// server is away): the watchdog deleted the Pod once and, on an error,
// gave up, leaving the Pod running for good. retry tries again until a
// delete succeeds (or the object is already gone); the control: a delete
// that keeps failing gives up with its error when the time is up.
func TestRedteamWatchdogRetry(t *testing.T) {
	n := 0
	err := retry(context.Background(), func() error {
		n++
		if n < 3 {
			return errors.New("connection refused")
		}
		return nil
	})
	if err != nil || n != 3 {
		t.Errorf("retry: %v after %d calls, want success on the third", err, n)
	}
	gone := apierrors.NewNotFound(corev1.Resource("pods"), "moat-x")
	if err := retry(context.Background(), func() error { return gone }); err != nil {
		t.Errorf("NotFound is success: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	if err := retry(ctx, func() error { return errors.New("connection refused") }); err == nil {
		t.Error("a delete that always fails succeeded")
	}
}

// TestRedteamHostPathOtherNode (attack: symlinks on another node): the
// hostPath grants are checked against this host's files, but the kubelet
// resolves them on the Pod's node. With broker_address set the node may
// be another machine, where a grant's path may be a symlink (made by a
// workload that had that directory) to anything of the node. Prepare
// refuses host_path_grants with broker_address; the control in the same
// setup: host_path_grants without broker_address passes this check (and
// stops at the fake cluster's missing node), and broker_address without
// host_path_grants too.
func TestRedteamHostPathOtherNode(t *testing.T) {
	cs := fake.NewClientset()
	be := &backend{clients: fakeClients(cs)}
	pol := testPolicy(t, "")
	// A kubeconfig of its own: the credential check reads the one in
	// force, and $HOME's may be unreadable (the uid 65534 pass).
	kc := filepath.Join(t.TempDir(), "kube.conf")
	if err := os.WriteFile(kc, []byte("apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: \"https://127.0.0.1:1\"}}]\nusers: [{name: u, user: {token: x}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	pol.Kubernetes.Kubeconfig = kc
	for _, tc := range []struct {
		hostPath bool
		broker   string
		refused  bool
	}{{true, "127.0.0.1", true}, {true, "", false}, {false, "127.0.0.1", false}} {
		p := *pol
		p.Kubernetes.HostPathGrants, p.Kubernetes.BrokerAddress = tc.hostPath, tc.broker
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		sb, err := be.Prepare(ctx, boundary.Spec{RunID: "r", Policy: &p, StateDir: t.TempDir()})
		cancel()
		if sb != nil {
			sb.Terminate()
		}
		if got := err != nil && strings.Contains(err.Error(), "host_path_grants with kubernetes.broker_address"); got != tc.refused {
			t.Errorf("host_path_grants %v, broker_address %q: refused %v, want %v (%v)", tc.hostPath, tc.broker, got, tc.refused, err)
		}
	}
}

// TestRedteamTerminationMessage (attack: the workload writes moat's
// output): /dev/termination-log is a host file any uid in the Pod can
// write, and when the Pod's main process ends (the workload can end it:
// same uid) its content becomes the container's termination message,
// which podReason put as is into the sandbox's end reason: moat sandbox
// get printed the workload's terminal escapes and forged lines
// (seen on the cluster: "error: ... Completed (exit 0) ^[[31mFAKE: all
// good"). Now every status text is quoted when it is not plain printable
// text, and bounded; the control: a plain message reads as it was.
func TestRedteamTerminationMessage(t *testing.T) {
	pod := func(msg string) *corev1.Pod {
		return &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodSucceeded, ContainerStatuses: []corev1.ContainerStatus{{Name: containerName,
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "Completed", ExitCode: 0, Message: msg}}}}}}
	}
	got := podReason(pod("\x1b[2J\x1b[31mmoat: sandbox Ready\nphase:  Ready\r"))
	if strings.ContainsAny(got, "\x1b\n\r") || !strings.Contains(got, `\x1b[31mmoat: sandbox Ready\nphase:`) {
		t.Errorf("a message with escapes and newlines: %q", got)
	}
	if got := podReason(pod(strings.Repeat("A", 5000))); len(got) > 400 {
		t.Errorf("a 5000-byte message gave %d bytes", len(got))
	}
	if got := podReason(pod("out of memory in step 3")); !strings.HasSuffix(got, "container sandbox terminated: Completed (exit 0) message out of memory in step 3") {
		t.Errorf("a plain message: %q", got)
	}
}

// TestRedteamDualStackNode: a dual-stack node that lists its IPv6
// InternalIP first gives the broker its IPv4 one (the Pod may open IPv4
// sockets only); a node with IPv6 alone is refused, saying why.
func TestRedteamDualStackNode(t *testing.T) {
	for _, tc := range []struct {
		addrs []string
		want  string
	}{{[]string{"fd00::2", "192.0.2.2"}, "192.0.2.2"}, {[]string{"192.0.2.3"}, "192.0.2.3"}, {[]string{"fd00::2"}, ""}} {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
		for _, a := range tc.addrs {
			node.Status.Addresses = append(node.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: a})
		}
		cs := fake.NewClientset(node)
		s := &sandbox{cs: fakeAPI{cs}}
		got, err := s.brokerAddress(context.Background(), "")
		if err != nil {
			t.Fatal(err)
		}
		if tc.want != "" && got.String() != tc.want {
			t.Errorf("%v: broker address %s, want %s", tc.addrs, got, tc.want)
		}
		if tc.want == "" {
			be := &backend{clients: fakeClients(cs)}
			_, err := be.Prepare(context.Background(), boundary.Spec{RunID: "r", Policy: testPolicy(t, ""), StateDir: t.TempDir()})
			if err == nil || !strings.Contains(err.Error(), "is not IPv4") {
				t.Errorf("%v: Prepare: %v, want the IPv6 broker address refused", tc.addrs, err)
			}
		}
	}
}

// TestRedteamOtherPolicies (attack: a namespace policy widens the Pod's
// egress where the measurement does not look): NetworkPolicies add up,
// and a namespace's "allow egress to 0.0.0.0/0 except the node" gave the
// sandbox's Pod every destination but the broker's host, the only one
// the measurement can probe: Ready, and the workload reached another Pod
// (seen on the test cluster). checkOtherPolicies refuses a policy that
// selects the Pod and allows traffic; the controls in the same
// namespace: a default deny (selects it, allows nothing), a policy for
// other Pods, and moat's own are accepted.
func TestRedteamOtherPolicies(t *testing.T) {
	const ns, name = "agents", "moat-run1"
	np := func(n string, sel map[string]string, egress bool) *networkingv1.NetworkPolicy {
		p := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: n, Namespace: ns},
			Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: sel}, PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}}}
		if egress {
			p.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "0.0.0.0/0", Except: []string{"192.0.2.2/32"}}}}}}
		}
		return p
	}
	own := buildNetworkPolicy(ns, name, netip.MustParseAddr("192.0.2.2"), 4000)
	accepted := []runtime.Object{own, np("default-deny", nil, false), np("web", map[string]string{"app": "web"}, true)}
	s := &sandbox{cs: fakeAPI{fake.NewClientset(accepted...)}, ns: ns, name: name}
	if err := s.checkOtherPolicies(context.Background()); err != nil {
		t.Errorf("moat's own, a default deny and another app's policy: %v", err)
	}
	for _, bad := range []*networkingv1.NetworkPolicy{np("allow-egress-but-node", nil, true), np("by-label", map[string]string{RunLabel: name}, true)} {
		s := &sandbox{cs: fakeAPI{fake.NewClientset(append(accepted, bad)...)}, ns: ns, name: name}
		if err := s.checkOtherPolicies(context.Background()); err == nil || !strings.Contains(err.Error(), bad.Name) {
			t.Errorf("%s: %v, want it refused by name", bad.Name, err)
		}
	}
}

// TestRedteamGrantOverMoat (attack: the measurement's binary from a
// grant): the image's moat runs the Pod's main process, the stage and the
// measurement that decides Ready. A grant covering it served another
// file there: with host_path_grants a read_write grant of its directory
// let one run's workload write the moat that measures the next run. Now
// buildPod refuses a read_write grant covering moat's binary, with or
// without host_path_grants; the controls: read_only grants of /usr (the
// image's own files, or with host_path_grants the host's root-owned
// ones) and a read_write grant beside moat's directory are accepted.
func TestRedteamGrantOverMoat(t *testing.T) {
	for _, tc := range []struct {
		ro, rw   []string
		hostPath bool
		refused  bool
	}{
		{rw: []string{"/usr/local/bin"}, refused: true},
		{rw: []string{"/usr/local"}, hostPath: true, refused: true},
		{ro: []string{"/usr"}, hostPath: true, refused: false},
		{ro: []string{"/usr"}, refused: false},
		{rw: []string{"/usr/local/lib"}, refused: false},
	} {
		pol := testPolicy(t, "")
		pol.Filesystem.ReadOnly, pol.Filesystem.ReadWrite, pol.Kubernetes.HostPathGrants = tc.ro, tc.rw, tc.hostPath
		_, err := buildPod(pol, podSpec{Name: "moat-x", UID: 1000, GID: 1000})
		got := err != nil && strings.Contains(err.Error(), "moat's binary in the image")
		if got != tc.refused {
			t.Errorf("ro %v rw %v host_path_grants %v: refused %v, want %v (%v)", tc.ro, tc.rw, tc.hostPath, got, tc.refused, err)
		}
	}
}
