package kubernetes

import (
	"context"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/internal/testenv"
	"github.com/moat-sandbox/moat/policy"
)

func testPolicy(t *testing.T, extra string) *policy.Policy {
	t.Helper()
	ws := t.TempDir()
	pol, err := policy.Parse([]byte("version: 1\nbackend: kubernetes\nfilesystem: {read_only: [/usr], read_write: ["+ws+"]}\nkubernetes: {image: k8s.local/moat:1, namespace: agents, node_selector: {kubernetes.io/hostname: n1}, resources: {cpu: 250m}"+extra+"}\n"), "")
	if err != nil {
		t.Fatal(err)
	}
	return pol
}

// TestBuildPod: every field the issue names is set as it must be.
func TestBuildPod(t *testing.T) {
	pol := testPolicy(t, "")
	pod, err := buildPod(pol, podSpec{Name: "moat-x", UID: 1000, GID: 1000})
	if err != nil {
		t.Fatal(err)
	}
	sp := pod.Spec
	if sp.RuntimeClassName == nil || *sp.RuntimeClassName != "gvisor" || sp.HostNetwork || sp.HostPID || sp.HostIPC ||
		sp.AutomountServiceAccountToken == nil || *sp.AutomountServiceAccountToken || sp.EnableServiceLinks == nil || *sp.EnableServiceLinks ||
		sp.RestartPolicy != corev1.RestartPolicyNever || sp.NodeSelector["kubernetes.io/hostname"] != "n1" {
		t.Errorf("pod spec: %+v", sp)
	}
	if psc := sp.SecurityContext; psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || *psc.RunAsUser != 1000 || *psc.RunAsGroup != 1000 ||
		psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod security context: %+v", psc)
	}
	if len(sp.Containers) != 1 {
		t.Fatalf("%d containers", len(sp.Containers))
	}
	c := sp.Containers[0]
	sc := c.SecurityContext
	if sc == nil || !*sc.RunAsNonRoot || *sc.AllowPrivilegeEscalation || *sc.Privileged || !*sc.ReadOnlyRootFilesystem ||
		len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" || len(sc.Capabilities.Add) != 0 ||
		sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("container security context: %+v", sc)
	}
	if c.Image != "k8s.local/moat:1" || strings.Join(c.Command, " ") != MoatInImage+" "+PauseHelper {
		t.Errorf("container: image %s command %v", c.Image, c.Command)
	}
	if c.Resources.Limits.Cpu().String() != "250m" || c.Resources.Limits.Memory().Value() != int64(pol.Process.Limits.Memory) {
		t.Errorf("limits: %v", c.Resources.Limits)
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m
	}
	vols := map[string]corev1.Volume{}
	for _, v := range sp.Volumes {
		vols[v.Name] = v
	}
	ws := pol.Filesystem.ReadWrite[0]
	if m, ok := mounts[ws]; !ok || m.ReadOnly || vols[m.Name].EmptyDir == nil {
		t.Errorf("read_write grant %s: mount %+v volume %+v", ws, m, vols[m.Name])
	}
	if m, ok := mounts["/tmp"]; !ok || vols[m.Name].EmptyDir == nil || vols[m.Name].EmptyDir.SizeLimit.Value() != int64(pol.Filesystem.TmpSize) {
		t.Errorf("/tmp: %+v", m)
	}
	if _, ok := mounts["/usr"]; ok {
		t.Errorf("a read_only grant became a volume without host_path_grants")
	}
	for _, v := range sp.Volumes {
		if v.HostPath != nil {
			t.Errorf("hostPath volume %+v without host_path_grants", v)
		}
	}
}

// TestBuildNetworkPolicy: no ingress, and egress to the broker's address
// and port only.
func TestBuildNetworkPolicy(t *testing.T) {
	for _, tt := range []struct{ addr, cidr string }{{"10.244.0.1", "10.244.0.1/32"}, {"fd00::1", "fd00::1/128"}} {
		np := buildNetworkPolicy("agents", "moat-x", netip.MustParseAddr(tt.addr), 4711)
		sp := np.Spec
		if sp.PodSelector.MatchLabels[RunLabel] != "moat-x" || len(sp.PolicyTypes) != 2 || len(sp.Ingress) != 0 || len(sp.Egress) != 1 {
			t.Fatalf("%+v", sp)
		}
		e := sp.Egress[0]
		if len(e.To) != 1 || e.To[0].IPBlock == nil || e.To[0].IPBlock.CIDR != tt.cidr || len(e.To[0].IPBlock.Except) != 0 ||
			len(e.Ports) != 1 || *e.Ports[0].Protocol != corev1.ProtocolTCP || e.Ports[0].Port.IntValue() != 4711 || e.Ports[0].EndPort != nil {
			t.Errorf("egress rule %+v", e)
		}
	}
}

// TestHostPathGrants: a grant under a directory the workload can write
// is refused with the reason, as is a symlinked component; the same
// grant under directories it cannot write is accepted (control).
func TestRootHostPathGrants(t *testing.T) {
	testenv.NeedRoot(t) // directories owned by another uid
	base, err := os.MkdirTemp("/var/tmp", "moat-hostpath-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(base)
	os.Chmod(base, 0o755)
	safe := filepath.Join(base, "safe", "ws")
	os.MkdirAll(safe, 0o755)
	os.Chmod(filepath.Join(base, "safe"), 0o755)
	if typ, err := checkHostPath(safe, 1000, 1000); err != nil || typ != corev1.HostPathDirectory {
		t.Errorf("safe grant: %v %v", typ, err)
	}
	owned := filepath.Join(base, "owned")
	os.MkdirAll(filepath.Join(owned, "ws"), 0o755)
	os.Chown(owned, 1000, 1000)
	if _, err := checkHostPath(filepath.Join(owned, "ws"), 1000, 1000); err == nil || !strings.Contains(err.Error(), "can write") {
		t.Errorf("grant in a directory of the workload's: %v", err)
	}
	// For another workload uid too: uid 1000 may be another sandbox's
	// workload, which could swap ws for a symlink under the kubelet.
	if _, err := checkHostPath(filepath.Join(owned, "ws"), 2000, 2000); err == nil || !strings.Contains(err.Error(), "uid 1000 can write (another sandbox") {
		t.Errorf("the same grant for another uid: %v", err)
	}
	link := filepath.Join(base, "link")
	os.Symlink(safe, link)
	if _, err := checkHostPath(link, 1000, 1000); err == nil || !strings.Contains(err.Error(), "symlink") {
		t.Errorf("symlink grant: %v", err)
	}
	// A world-writable sticky directory: an entry of someone else's stays
	// put (accepted), one of the workload's could be swapped (refused).
	sticky := filepath.Join(base, "sticky")
	os.Mkdir(sticky, 0o755)
	os.Chmod(sticky, os.ModeSticky|0o777)
	os.Mkdir(filepath.Join(sticky, "root"), 0o755)
	os.Mkdir(filepath.Join(sticky, "mine"), 0o755)
	os.Chown(filepath.Join(sticky, "mine"), 1000, 1000)
	if _, err := checkHostPath(filepath.Join(sticky, "root"), 1000, 1000); err != nil {
		t.Errorf("root's entry in a sticky directory: %v", err)
	}
	if _, err := checkHostPath(filepath.Join(sticky, "mine"), 1000, 1000); err == nil {
		t.Error("the workload's entry in a sticky world-writable directory accepted")
	}
	pol := testPolicy(t, ", host_path_grants: true")
	pol.Filesystem.ReadWrite = []string{safe}
	pod, err := buildPod(pol, podSpec{Name: "moat-x", UID: 1000, GID: 1000})
	if err != nil {
		t.Fatal(err)
	}
	var hp []string
	for _, v := range pod.Spec.Volumes {
		if v.HostPath != nil {
			hp = append(hp, v.HostPath.Path)
		}
	}
	if strings.Join(hp, ",") != "/usr,"+safe {
		t.Errorf("hostPath volumes %v", hp)
	}
	pol.Filesystem.ReadWrite = []string{filepath.Join(owned, "ws")}
	if _, err := buildPod(pol, podSpec{Name: "moat-x", UID: 1000, GID: 1000}); err == nil {
		t.Error("buildPod accepted a replaceable hostPath grant")
	}
}

// TestRefuseUnsupported: features whose variables assume the sandbox's
// loopback are refused by name; a policy without them passes.
func TestRefuseUnsupported(t *testing.T) {
	pol := testPolicy(t, "")
	if msg := refuseUnsupported(pol); msg != "" {
		t.Errorf("plain policy refused: %s", msg)
	}
	pol.Egress.Hosts = []policy.EgressHost{{Host: "example.com", Port: 443}}
	if msg := refuseUnsupported(pol); !strings.Contains(msg, "egress.hosts is not available on the kubernetes backend") {
		t.Errorf("egress hosts: %q", msg)
	}
}

// TestPrepareFake drives Prepare against client-go's fake clientset (the
// real cluster's tests are in e2e): the NetworkPolicy exists before the
// Pod, the listener admits the Pod's IP only, and Terminate deletes both.
func TestPrepareFake(t *testing.T) {
	pol := testPolicy(t, "")
	pol.Kubernetes.BrokerAddress = "127.0.0.1" // loopback, refused by the policy, is what this test can bind
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	cs := fake.NewClientset(node)
	be := &backend{clients: fakeClients(cs)}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The fake runs nothing: mark the Pod running once it exists, after
	// checking that its NetworkPolicy came first.
	npFirst := make(chan bool, 1)
	go func() {
		for ctx.Err() == nil {
			pod, err := cs.CoreV1().Pods("agents").Get(ctx, objectName("r1"), metav1.GetOptions{})
			if err != nil {
				time.Sleep(20 * time.Millisecond)
				continue
			}
			_, nerr := cs.NetworkingV1().NetworkPolicies("agents").Get(ctx, objectName("r1"), metav1.GetOptions{})
			npFirst <- nerr == nil
			pod.Status.Phase = corev1.PodRunning
			pod.Status.PodIP = "10.244.0.7"
			pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: containerName, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}
			cs.CoreV1().Pods("agents").UpdateStatus(ctx, pod, metav1.UpdateOptions{})
			return
		}
	}()
	sb, err := be.Prepare(ctx, boundary.Spec{RunID: "r1", Policy: pol, StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if !<-npFirst {
		t.Error("the Pod existed before its NetworkPolicy")
	}
	li, err := sb.Listener()
	if err != nil {
		t.Fatal(err)
	}
	li.File.Close()
	if li.Host != "127.0.0.1" || li.Admit == nil || li.Port == 0 {
		t.Fatalf("listener %+v", li)
	}
	if err := li.Admit(&net.TCPAddr{IP: net.ParseIP("10.244.0.7"), Port: 5}); err != nil {
		t.Errorf("the Pod's IP refused: %v", err)
	}
	if err := li.Admit(&net.TCPAddr{IP: net.ParseIP("10.244.0.8"), Port: 5}); err == nil {
		t.Error("another IP admitted")
	}
	np, err := cs.NetworkingV1().NetworkPolicies("agents").Get(ctx, objectName("r1"), metav1.GetOptions{})
	if err != nil || np.Spec.Egress[0].Ports[0].Port.IntValue() != li.Port || np.Spec.Egress[0].To[0].IPBlock.CIDR != "127.0.0.1/32" {
		t.Errorf("NetworkPolicy %+v: %v", np, err)
	}
	if m := sb.Mechanisms(); !strings.Contains(m.EgressInterception, "egress-rules=1") || m.AttributionUnavailable == "" {
		t.Errorf("mechanisms %+v", m)
	}
	if a := sb.Attributor().Attribute(nil); a.Status != boundary.AttributionUnavailable {
		t.Errorf("attribution %+v", a)
	}
	if err := sb.Terminate(); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Pods("agents").Get(ctx, objectName("r1"), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("Pod after Terminate: %v", err)
	}
	if _, err := cs.NetworkingV1().NetworkPolicies("agents").Get(ctx, objectName("r1"), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("NetworkPolicy after Terminate: %v", err)
	}
	if err := li.Admit(&net.TCPAddr{IP: net.ParseIP("10.244.0.7"), Port: 5}); err == nil {
		t.Error("the Pod's IP admitted after Terminate")
	}
}

// TestPrepareRefusals: no image, and a policy with an unsupported
// feature, are refused before anything is made.
func TestPrepareRefusals(t *testing.T) {
	cs := fake.NewClientset()
	be := &backend{clients: fakeClients(cs)}
	pol := testPolicy(t, "")
	pol.Kubernetes.Image = ""
	if _, err := be.Prepare(context.Background(), boundary.Spec{RunID: "r", Policy: pol}); err == nil || !strings.Contains(err.Error(), "kubernetes.image") {
		t.Errorf("no image: %v", err)
	}
	pol = testPolicy(t, "")
	if _, err := be.Prepare(context.Background(), boundary.Spec{RunID: "r", Policy: pol}); err == nil || !strings.Contains(err.Error(), "0 nodes") {
		t.Errorf("no node and no broker_address: %v", err)
	}
	if l, _ := cs.CoreV1().Pods("agents").List(context.Background(), metav1.ListOptions{}); len(l.Items) != 0 {
		t.Errorf("pods made: %v", l.Items)
	}
}
