package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/klog/v2"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/internal/kubeapi"
	"github.com/moat-sandbox/moat/internal/reexec"
	"github.com/moat-sandbox/moat/policy"
)

// Hidden helpers of the moat binary that run inside the Pod
// (internal/cli/hidden.go lists them).
const (
	PauseHelper  = reexec.Prefix + "k8s-pause"  // the container's main process
	StageHelper  = reexec.Prefix + "k8s-stage"  // in front of every exec: env, dir, seccomp, then the command
	SignalHelper = reexec.Prefix + "k8s-signal" // delivers a signal to a process a stage started
)

// New returns the kubernetes backend; internal/cli/hidden.go registers it.
func New() boundary.Backend { return &backend{} }

type backend struct {
	// clients, when set (tests), replaces the API client built from the
	// policy.
	clients func(*policy.Kubernetes) (kubeapi.Interface, *rest.Config, error)
}

func (*backend) Name() string { return "kubernetes" }

// readyTimeout bounds how long Prepare waits for the Pod to run.
const readyTimeout = 3 * time.Minute

// attributionUnavailable is the backend's declaration: the broker sees
// the Pod's address, never a process.
const attributionUnavailable = "Kubernetes Pod with the broker off the Pod: a broker connection shows only the Pod's IP address, so the process inside cannot be identified"

// restConfig loads the cluster's client configuration from the policy:
// in_cluster, else kubeconfig, else $KUBECONFIG or ~/.kube/config.
func restConfig(k *policy.Kubernetes) (*rest.Config, error) {
	cfg, err := kubeapi.Config(k.Kubeconfig, k.InCluster)
	if k.InCluster {
		return cfg, err
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes: no cluster configuration (kubernetes.kubeconfig, in_cluster, $KUBECONFIG or ~/.kube/config): %w", err)
	}
	return cfg, nil
}

// quietOnce silences client-go's own log (klog): its lines (a stream's
// stdin copy ending, retries) would land on moat's stderr, which is the
// user's; every error that matters is returned and reported by moat.
var quietOnce sync.Once

func defaultClients(k *policy.Kubernetes) (kubeapi.Interface, *rest.Config, error) {
	quietOnce.Do(func() {
		klog.SetLogger(logr.Discard())
	})
	cfg, err := restConfig(k)
	if err != nil {
		return nil, nil, err
	}
	cfg.Timeout = 30 * time.Second
	cs, err := kubeapi.New(cfg)
	if err != nil {
		return nil, nil, err
	}
	return cs, cfg, nil
}

// Prepare opens the broker's listener on the host address the Pod
// reaches, creates the NetworkPolicy that allows the Pod nothing but
// that listener, then the Pod, and returns once the Pod runs (nothing
// but moat's pause runs in it until Start).
func (b *backend) Prepare(ctx context.Context, spec boundary.Spec) (boundary.Sandbox, error) {
	pol := spec.Policy
	k := pol.Kubernetes
	if k.Image == "" {
		return nil, errors.New("the kubernetes backend needs kubernetes.image in the policy (an image that holds moat's binary at " + MoatInImage + ")")
	}
	if msg := refuseUnsupported(pol); msg != "" {
		return nil, errors.New(msg)
	}
	if pol.Process.UID <= 0 || pol.Process.GID <= 0 {
		return nil, fmt.Errorf("BUG: policy ids %d:%d reached the kubernetes backend", pol.Process.UID, pol.Process.GID)
	}
	if err := checkCredentialFiles(pol); err != nil {
		return nil, err
	}
	if k.HostPathGrants && k.BrokerAddress != "" {
		// checkHostPath looks at this host's files, the kubelet follows the
		// node's: they are the same only when the Pod runs here, which moat
		// knows only when it listens on the single node's own address.
		return nil, errors.New("kubernetes: host_path_grants with kubernetes.broker_address set: the grants' paths are checked on this host, but the kubelet resolves them on the Pod's node (following symlinks), which may be another machine; leave broker_address unset (moat then listens on the single node's InternalIP, an address of this host) or leave host_path_grants off (emptyDir)")
	}
	clients := b.clients
	if clients == nil {
		clients = defaultClients
	}
	cs, cfg, err := clients(&k)
	if err != nil {
		return nil, err
	}
	name := objectName(spec.RunID)
	s := &sandbox{pol: pol, cs: cs, cfg: cfg, ns: k.Namespace, name: name, gone: make(chan struct{}), stopWatch: make(chan struct{})}
	host, err := s.brokerAddress(ctx, k.BrokerAddress)
	if err != nil {
		return nil, err
	}
	if !host.Unmap().Is4() {
		return nil, fmt.Errorf("kubernetes: the broker's address %s is not IPv4: the Pod's processes may open IPv4 sockets only (an IPv6 link-local address passes a NetworkPolicy enforced for IPv4); set kubernetes.broker_address to an IPv4 address of this host that the Pod reaches", host)
	}
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: host.AsSlice(), Port: 0})
	if err != nil {
		return nil, fmt.Errorf("kubernetes: the broker cannot listen on %s (it must be an address of this host that the Pod reaches; set kubernetes.broker_address): %w", host, err)
	}
	s.host, s.port = host, ln.Addr().(*net.TCPAddr).Port
	if b.clients == nil {
		// Before anything exists in the cluster: whatever this process
		// makes there is removed if it dies.
		var exited <-chan struct{}
		if s.watchdog, exited, err = startWatchdog(k, name); err != nil {
			ln.Close()
			return nil, err
		}
		go s.keepWatchdog(k, exited)
	}
	if s.listener, err = ln.File(); err != nil {
		ln.Close()
		return nil, err
	}
	ln.Close() // the file is a dup
	np, err := cs.CreateNetworkPolicy(ctx, s.ns, buildNetworkPolicy(s.ns, name, host, s.port))
	if err != nil {
		s.Terminate()
		return nil, fmt.Errorf("kubernetes: creating the NetworkPolicy %s/%s: %w", s.ns, name, err)
	}
	s.npMade = true
	s.evidence = fmt.Sprintf("networkpolicy %s/%s uid=%s egress-rules=%d", s.ns, name, np.UID, len(np.Spec.Egress))
	pod, err := buildPod(pol, podSpec{Name: name, UID: int64(pol.Process.UID), GID: int64(pol.Process.GID)})
	if err != nil {
		s.Terminate()
		return nil, err
	}
	made, err := cs.CreatePod(ctx, s.ns, pod)
	if err != nil {
		s.Terminate()
		return nil, fmt.Errorf("kubernetes: creating the Pod %s/%s: %w", s.ns, name, err)
	}
	s.podMade, s.uid = true, made.UID
	if err := s.waitRunning(ctx); err != nil {
		s.Terminate()
		return nil, err
	}
	// After the Pod runs, so that a policy made while it started is seen.
	if err := s.checkOtherPolicies(ctx); err != nil {
		s.Terminate()
		return nil, err
	}
	go s.watch()
	if s.cfg != nil {
		s.waitConfined(ctx)
	}
	return s, nil
}

// brokerAddress is the policy's broker_address, else the InternalIP of
// the cluster's only node.
func (s *sandbox) brokerAddress(ctx context.Context, configured string) (netip.Addr, error) {
	if configured != "" {
		return netip.ParseAddr(configured) // the policy checked it
	}
	nodes, err := s.cs.ListNodes(ctx, metav1.ListOptions{})
	if err != nil {
		return netip.Addr{}, fmt.Errorf("kubernetes: listing nodes to find the broker's address: %w (set kubernetes.broker_address)", err)
	}
	if len(nodes.Items) != 1 {
		return netip.Addr{}, fmt.Errorf("kubernetes: the cluster has %d nodes; set kubernetes.broker_address to this host's address that the Pods reach (and node_selector to keep the Pod where it does)", len(nodes.Items))
	}
	// An IPv4 InternalIP first: the Pod's processes may open IPv4 sockets
	// only (the stage's filter, IPv4Only), and a dual-stack node may list
	// its IPv6 address first.
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
		return other, nil // refused by Prepare, saying why
	}
	return netip.Addr{}, fmt.Errorf("kubernetes: node %s has no InternalIP; set kubernetes.broker_address", nodes.Items[0].Name)
}

type sandbox struct {
	pol  *policy.Policy
	cs   kubeapi.Interface
	cfg  *rest.Config
	ns   string
	name string

	host     netip.Addr
	port     int
	listener *os.File
	evidence string // the NetworkPolicy as created: recorded, never authorizes

	npMade, podMade bool
	// uid is the UID of the Pod this run created: a Pod of the same name
	// with another UID is someone else's, never the sandbox.
	uid types.UID

	mu       sync.Mutex
	podIP    netip.Addr // the Pod's current IP; invalid once it is gone
	goneWhy  string     // why the Pod ended, when it did from outside
	gone     chan struct{}
	goneOnce sync.Once

	watchdog *os.File // the write end of the watchdog's stdin (watchdog.go); mu guards it

	nextID    int
	stopWatch chan struct{}
	termOnce  sync.Once

	// newExecutor, when set (tests), makes the exec requests in place
	// of the SPDY executor over cfg.
	newExecutor func(*corev1.PodExecOptions) (remotecommand.Executor, error)
}

// waitRunning waits until the Pod runs and has an IP.
func (s *sandbox) waitRunning(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	for {
		pod, err := s.cs.GetPod(ctx, s.ns, s.name)
		if err != nil {
			return fmt.Errorf("kubernetes: Pod %s/%s: %w", s.ns, s.name, err)
		}
		if s.replaced(pod) {
			return fmt.Errorf("kubernetes: Pod %s/%s was replaced by another of the same name (uid %s, this run made %s)", s.ns, s.name, pod.UID, s.uid)
		}
		switch pod.Status.Phase {
		case corev1.PodRunning:
			if ip, err := netip.ParseAddr(pod.Status.PodIP); err == nil && ready(pod) {
				s.mu.Lock()
				s.podIP = ip.Unmap()
				s.mu.Unlock()
				return nil
			}
		case corev1.PodFailed, corev1.PodSucceeded:
			return fmt.Errorf("kubernetes: Pod %s/%s ended before it ran: %s", s.ns, s.name, podReason(pod))
		}
		if msg := waitingProblem(pod); msg != "" {
			return fmt.Errorf("kubernetes: Pod %s/%s cannot start: %s", s.ns, s.name, msg)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kubernetes: Pod %s/%s not running after %s (phase %s: %s)", s.ns, s.name, readyTimeout, pod.Status.Phase, podReason(pod))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func ready(pod *corev1.Pod) bool {
	for _, c := range pod.Status.ContainerStatuses {
		if c.Name == containerName {
			return c.State.Running != nil
		}
	}
	return false
}

// waitingProblem names a container state that will not resolve by
// waiting (a missing image, a bad runtime class), or "".
func waitingProblem(pod *corev1.Pod) string {
	for _, c := range pod.Status.ContainerStatuses {
		if w := c.State.Waiting; w != nil {
			switch w.Reason {
			case "ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName", "CreateContainerConfigError", "CreateContainerError", "RunContainerError":
				return w.Reason + ": " + w.Message
			}
		}
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return "unschedulable: " + c.Message
		}
	}
	return ""
}

// podReason says why the Pod is where it is, from its status. Every
// text in it is quoted by statusText: a terminated container's message
// is the content of its termination-log file, which the workload writes
// (/dev/termination-log is writable by any uid), and this text reaches
// the journal, moat's stderr and moat sandbox get.
func podReason(pod *corev1.Pod) string {
	r := statusText(pod.Status.Reason)
	if pod.Status.Message != "" {
		r += " " + statusText(pod.Status.Message)
	}
	for _, c := range pod.Status.ContainerStatuses {
		if t := c.State.Terminated; t != nil {
			r += fmt.Sprintf(" container %s terminated: %s (exit %d)", statusText(c.Name), statusText(t.Reason), t.ExitCode)
			if t.Message != "" {
				r += " message " + statusText(t.Message)
			}
		}
		if w := c.State.Waiting; w != nil {
			r += fmt.Sprintf(" container %s waiting: %s %s", statusText(c.Name), statusText(w.Reason), statusText(w.Message))
		}
	}
	if strings.TrimSpace(r) == "" {
		return "no reason given"
	}
	return strings.TrimSpace(r)
}

// maxStatusText bounds one text of a Pod's status in podReason.
const maxStatusText = 256

// statusText is s, at most maxStatusText bytes, as is when it is plain
// printable text, else Go-quoted: no control character (a terminal
// escape, a newline that forges a line of moat's output) passes.
func statusText(s string) string {
	cut := ""
	if len(s) > maxStatusText {
		s, cut = strings.ToValidUTF8(s[:maxStatusText], ""), "…"
	}
	plain := utf8.ValidString(s)
	for _, r := range s {
		if !unicode.IsPrint(r) {
			plain = false
			break
		}
	}
	if plain {
		return s + cut
	}
	return strconv.Quote(s) + cut
}

// replaced reports whether pod, named as the sandbox's, is another Pod
// than the one this run created.
func (s *sandbox) replaced(pod *corev1.Pod) bool {
	return s.uid != "" && pod.UID != s.uid
}

// watch follows the Pod until Terminate: its IP (re-read when it
// changes) and its end, from outside (deleted, evicted, failed, or
// replaced by another Pod of the same name). Each watch starts from a
// fresh read of the Pod, at that read's resource version: a watch started
// anew reports nothing of what happened while none ran (the API server
// ends watches now and then), so a Pod deleted in that gap, or made
// again by someone else under the same name, would go unseen and its IP
// stay admitted.
func (s *sandbox) watch() {
	for {
		select {
		case <-s.stopWatch:
			return
		default:
		}
		rv, done, err := s.resync()
		if done {
			return
		}
		var w watch.Interface
		if err == nil {
			w, err = s.cs.WatchPods(context.Background(), s.ns, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", s.name).String(), ResourceVersion: rv})
		}
		if err != nil {
			select {
			case <-s.stopWatch:
				return
			case <-time.After(time.Second):
				continue
			}
		}
		if s.follow(w) {
			return
		}
	}
}

// resync reads the Pod and applies what it says (observe): its resource
// version, to watch from, and true when the Pod is gone.
func (s *sandbox) resync() (string, bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pod, err := s.cs.GetPod(ctx, s.ns, s.name)
	switch {
	case apierrors.IsNotFound(err):
		s.ended("the Pod was deleted from outside moat")
		return "", true, nil
	case err != nil:
		return "", false, err
	}
	return pod.ResourceVersion, s.observe(pod), nil
}

// observe applies one state of the Pod: its end, or its IP. True when
// the Pod is gone.
func (s *sandbox) observe(pod *corev1.Pod) bool {
	switch {
	case s.replaced(pod):
		s.ended(fmt.Sprintf("the Pod was replaced from outside moat by another of the same name (uid %s, not %s)", pod.UID, s.uid))
		return true
	case pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded:
		why := "the Pod ended: " + podReason(pod)
		if pod.Status.Reason == "Evicted" {
			why = "the Pod was evicted: " + podReason(pod)
		}
		s.ended(why)
		return true
	case pod.DeletionTimestamp != nil:
		s.ended("the Pod is being deleted from outside moat")
		return true
	}
	ip, err := netip.ParseAddr(pod.Status.PodIP)
	s.mu.Lock()
	if err == nil {
		s.podIP = ip.Unmap()
	} else {
		s.podIP = netip.Addr{}
	}
	s.mu.Unlock()
	return false
}

// follow reads one watch; true when the Pod is gone or Terminate ran.
func (s *sandbox) follow(w watch.Interface) bool {
	defer w.Stop()
	for {
		select {
		case <-s.stopWatch:
			return true
		case ev, ok := <-w.ResultChan():
			if !ok {
				return false
			}
			pod, isPod := ev.Object.(*corev1.Pod)
			if isPod && pod.Name != s.name {
				continue
			}
			switch {
			case ev.Type == watch.Deleted && isPod:
				s.ended("the Pod was deleted from outside moat")
				return true
			case !isPod:
				continue
			case s.observe(pod):
				return true
			}
		}
	}
}

// checkEnded asks the API whether the Pod ended from outside moat (the
// watch may not have told yet) and records it; not once Terminate runs.
func (s *sandbox) checkEnded() {
	select {
	case <-s.stopWatch:
		return
	case <-s.gone:
		return
	default:
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pod, err := s.cs.GetPod(ctx, s.ns, s.name)
	switch {
	case apierrors.IsNotFound(err):
		s.ended("the Pod was deleted from outside moat")
	case err != nil:
	default:
		s.observe(pod)
	}
}

// ended records that the Pod is gone: the broker admits nobody after.
func (s *sandbox) ended(why string) {
	s.mu.Lock()
	s.podIP = netip.Addr{}
	if s.goneWhy == "" {
		s.goneWhy = why
	}
	s.mu.Unlock()
	s.goneOnce.Do(func() { close(s.gone) })
}

// Ended is closed when the Pod ended from outside moat (deleted,
// evicted, failed); EndReason says how (boundary.Ending).
func (s *sandbox) Ended() <-chan struct{} { return s.gone }

// EndReason says how the Pod ended, or "".
func (s *sandbox) EndReason() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.goneWhy
}

// admit accepts a broker connection only from the Pod's current IP.
func (s *sandbox) admit(remote net.Addr) error {
	ta, ok := remote.(*net.TCPAddr)
	if !ok {
		return fmt.Errorf("not a TCP connection (%s)", remote)
	}
	ip, _ := netip.AddrFromSlice(ta.IP)
	ip = ip.Unmap()
	s.mu.Lock()
	cur, why := s.podIP, s.goneWhy
	s.mu.Unlock()
	switch {
	case !cur.IsValid() && why != "":
		return fmt.Errorf("the sandbox's Pod is gone (%s)", why)
	case !cur.IsValid():
		return errors.New("the sandbox's Pod has no IP")
	case ip != cur:
		return fmt.Errorf("source %s is not the sandbox Pod's IP %s", ip, cur)
	}
	return nil
}

func (s *sandbox) Listener() (boundary.ListenerInfo, error) {
	if s.listener == nil {
		return boundary.ListenerInfo{}, errors.New("no listener")
	}
	f, err := dupFile(s.listener, "broker-listener")
	if err != nil {
		return boundary.ListenerInfo{}, err
	}
	return boundary.ListenerInfo{File: f, Port: s.port, Host: s.host.String(), Admit: s.admit}, nil
}

func (s *sandbox) Attributor() boundary.Attributor { return endpointOnly{} }

type endpointOnly struct{}

func (endpointOnly) Attribute(net.Conn) boundary.Attribution {
	return boundary.Attribution{Status: boundary.AttributionUnavailable, Reason: attributionUnavailable}
}

// Mechanisms names what enforces each property; the NetworkPolicy's
// identity and rule count ride along as evidence for the journal. None of
// it authorizes anything: the measurement decides.
func (s *sandbox) Mechanisms() boundary.Mechanisms {
	return boundary.Mechanisms{
		FilesystemConfinement:  "pod-mountns+readonly-rootfs+" + s.pol.Kubernetes.RuntimeClassName,
		EgressInterception:     "pod-netns+networkpolicy+broker-off-pod (" + s.evidence + ")",
		RequestAttribution:     "endpoint-only",
		PrivilegeFloor:         "runasnonroot+capdrop-all+nnp+seccomp-runtimedefault+moat-seccomp+" + s.pol.Kubernetes.RuntimeClassName,
		AttributionUnavailable: attributionUnavailable,
	}
}

// FilesFromImage is true unless the grants are hostPath volumes: the
// Pod's files are the image's and its emptyDir volumes', not the host's
// at the same paths (boundary.ImageFiles).
func (s *sandbox) FilesFromImage() bool { return !s.pol.Kubernetes.HostPathGrants }

// HostPID is 0: the Pod's processes are not processes of this host that
// moat can name (the node may be another machine).
func (s *sandbox) HostPID() int { return 0 }

func (s *sandbox) Limits() boundary.LimitsStatus {
	return boundary.LimitsStatus{DiskDetail: boundary.DiskUnlimited,
		Detail: "the container's resources.limits are set from the policy, but moat does not measure what the node enforces"}
}

// Terminate deletes the Pod (and waits, bounded, until it is gone), then
// the NetworkPolicy, and closes the listener. Idempotent.
func (s *sandbox) Terminate() error {
	var errs []error
	s.termOnce.Do(func() {
		close(s.stopWatch)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		zero := int64(0)
		if s.podMade {
			err := s.cs.DeletePod(ctx, s.ns, s.name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
			if err != nil && !apierrors.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("deleting Pod %s/%s: %w", s.ns, s.name, err))
			} else {
				s.waitGone(ctx)
			}
		}
		if s.npMade {
			err := s.cs.DeleteNetworkPolicy(ctx, s.ns, s.name, metav1.DeleteOptions{})
			if err != nil && !apierrors.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("deleting NetworkPolicy %s/%s: %w", s.ns, s.name, err))
			}
		}
		if s.listener != nil {
			s.listener.Close()
		}
		s.mu.Lock()
		wd := s.watchdog
		s.mu.Unlock()
		if wd != nil {
			if len(errs) == 0 {
				wd.WriteString(watchdogDone)
			}
			// Else the watchdog tries again.
			wd.Close()
		}
		s.mu.Lock()
		s.podIP = netip.Addr{}
		s.mu.Unlock()
	})
	return errors.Join(errs...)
}

// waitGone waits until the Pod no longer exists (its NetworkPolicy must
// outlive it).
func (s *sandbox) waitGone(ctx context.Context) {
	for {
		_, err := s.cs.GetPod(ctx, s.ns, s.name)
		if apierrors.IsNotFound(err) || ctx.Err() != nil {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}
