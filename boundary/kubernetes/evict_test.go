package kubernetes

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// TestPodEvicted: a Pod the kubelet evicts (node pressure) is not
// deleted: it stays, phase Failed, reason Evicted. The sandbox must end
// with a reason that says so and stop admitting the Pod's IP. The
// control, in the same sandbox and watch: an update that leaves the Pod
// running (a new resourceVersion) ends nothing and keeps the IP
// admitted.
func TestPodEvicted(t *testing.T) {
	const ns, name, ip = "ns", "moat-run1", "10.244.0.9"
	cs := fake.NewClientset(runningPod(ns, name, "uid-1", ip))
	watchers := make(chan *watch.FakeWatcher, 4)
	cs.PrependWatchReactor("pods", func(k8stesting.Action) (bool, watch.Interface, error) {
		w := watch.NewFakeWithChanSize(8, false)
		watchers <- w
		return true, w, nil
	})
	s := &sandbox{cs: fakeAPI{cs}, ns: ns, name: name, gone: make(chan struct{}), stopWatch: make(chan struct{})}
	s.uid = "uid-1"
	s.podIP = netip.MustParseAddr(ip)
	go s.watch()
	defer close(s.stopWatch)
	var w *watch.FakeWatcher
	select {
	case w = <-watchers:
	case <-time.After(10 * time.Second):
		t.Fatal("no watch started")
	}

	// Control: still running.
	still := runningPod(ns, name, "uid-1", ip)
	still.ResourceVersion = "2"
	w.Modify(still)
	time.Sleep(200 * time.Millisecond)
	select {
	case <-s.Ended():
		t.Fatalf("a running Pod's update ended the sandbox: %s", s.EndReason())
	default:
	}
	if err := s.admit(tcpFrom(ip)); err != nil {
		t.Fatalf("the running Pod's IP refused: %v", err)
	}

	// The kubelet evicts it.
	ev := runningPod(ns, name, "uid-1", ip)
	ev.ResourceVersion = "3"
	ev.Status.Phase = corev1.PodFailed
	ev.Status.Reason = "Evicted"
	ev.Status.Message = "The node was low on resource: memory."
	ev.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: containerName,
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "Error", ExitCode: 137}}}}
	w.Modify(ev)
	select {
	case <-s.Ended():
	case <-time.After(10 * time.Second):
		t.Fatal("an evicted Pod did not end the sandbox")
	}
	why := s.EndReason()
	for _, want := range []string{"evicted", "low on resource: memory", "exit 137"} {
		if !strings.Contains(why, want) {
			t.Errorf("end reason %q lacks %q", why, want)
		}
	}
	if err := s.admit(tcpFrom(ip)); err == nil {
		t.Error("the evicted Pod's IP is still admitted")
	}
}
