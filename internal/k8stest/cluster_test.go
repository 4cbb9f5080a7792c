package k8stest

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// These tests prove the test cluster itself (scripts/k8s-cluster smoke
// runs them): gVisor pods run the moat image, and NetworkPolicy is
// enforced, each with its control in the same setup.

type podSpec struct {
	name, image, runtimeClass string
	labels                    map[string]string
	script                    string
	uid                       int64 // 0: the image's user
}

func (p podSpec) manifest(ns string) []byte {
	sc := map[string]any{
		"allowPrivilegeEscalation": false,
		"capabilities":             map[string]any{"drop": []string{"ALL"}},
		"seccompProfile":           map[string]any{"type": "RuntimeDefault"},
	}
	if p.uid != 0 {
		sc["runAsUser"] = p.uid
		sc["runAsNonRoot"] = true
	}
	spec := map[string]any{
		"terminationGracePeriodSeconds": 1,
		"automountServiceAccountToken":  false,
		"containers": []any{map[string]any{
			"name": "c", "image": p.image, "imagePullPolicy": "Never",
			"command":         []string{"/bin/sh", "-c", p.script},
			"securityContext": sc,
		}},
	}
	if p.runtimeClass != "" {
		spec["runtimeClassName"] = p.runtimeClass
	}
	b, err := json.Marshal(map[string]any{
		"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": p.name, "namespace": ns, "labels": p.labels},
		"spec":     spec,
	})
	if err != nil {
		panic(err) // static types only
	}
	return b
}

func (c *Cluster) busybox() string {
	if c.BusyboxImage != "" {
		return c.BusyboxImage
	}
	return c.Image
}

func TestClusterGVisorPod(t *testing.T) {
	c := Need(t)
	ns := c.Namespace(t, "k8stest-gvisor")
	script := "id -u; /usr/local/bin/moat --version; dmesg 2>&1 | head -3; echo started; sleep 3600"
	gv := podSpec{name: "gvisor", image: c.Image, runtimeClass: c.RuntimeClass, uid: 65532, script: script}
	rc := podSpec{name: "runc", image: c.Image, uid: 65532, script: script}
	c.MustRun(t, gv.manifest(ns), "apply", "-f", "-")
	c.MustRun(t, rc.manifest(ns), "apply", "-f", "-")
	t.Logf("gVisor pod Ready after %v", c.WaitReady(t, ns, "gvisor", 180*time.Second).Round(time.Millisecond))
	c.WaitReady(t, ns, "runc", 180*time.Second)

	logs := func(pod string) string {
		for i := 0; i < 30; i++ {
			out := c.MustRun(t, nil, "-n", ns, "logs", pod)
			if strings.Contains(out, "started") {
				return out
			}
			time.Sleep(500 * time.Millisecond)
		}
		t.Fatalf("pod %s never logged 'started'", pod)
		return ""
	}
	gvLog, rcLog := logs("gvisor"), logs("runc")
	for pod, out := range map[string]string{"gvisor": gvLog, "runc": rcLog} {
		lines := strings.Split(out, "\n")
		if lines[0] != "65532" {
			t.Errorf("pod %s runs as uid %q, want the image's 65532", pod, lines[0])
		}
		if !strings.Contains(out, "moat") {
			t.Errorf("pod %s: moat --version printed nothing recognisable:\n%s", pod, out)
		}
	}
	// The gVisor kernel announces itself in dmesg; the runc pod (same image,
	// host kernel, unprivileged) must not: that is what makes the check mean something.
	if !strings.Contains(gvLog, "gVisor") {
		t.Errorf("pod with runtimeClassName %s does not run under gVisor:\n%s", c.RuntimeClass, gvLog)
	}
	if strings.Contains(rcLog, "gVisor") {
		t.Errorf("control: the runc pod claims gVisor, the check cannot tell them apart:\n%s", rcLog)
	}
	// exec (the path the backend's Start takes) reaches the gVisor pod.
	if out := strings.TrimSpace(c.MustRun(t, nil, "-n", ns, "exec", "gvisor", "--", "id", "-u")); out != "65532" {
		t.Errorf("exec in gVisor pod: id -u = %q", out)
	}
}

// fetch reports whether pod reaches the server at ip:8080 (busybox nc; 3 s).
func (c *Cluster) fetch(ns, pod, ip string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, _ := c.Run(ctx, nil, "-n", ns, "exec", pod, "--", "sh", "-c",
		fmt.Sprintf("printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 %s 8080", ip))
	return strings.Contains(out, "hello from moat k8s")
}

// eventually polls cond once a second for up to 45 s.
func eventually(cond func() bool) (time.Duration, bool) {
	start := time.Now()
	for time.Since(start) < 45*time.Second {
		if cond() {
			return time.Since(start), true
		}
		time.Sleep(time.Second)
	}
	return time.Since(start), false
}

func (c *Cluster) netpolSetup(t *testing.T, prefix string, clients ...string) (ns, ip string) {
	t.Helper()
	ns = c.Namespace(t, prefix)
	srv := podSpec{name: "server", image: c.busybox(), labels: map[string]string{"app": "server"},
		script: "mkdir -p /tmp/www && echo 'hello from moat k8s' > /tmp/www/index.html && httpd -f -p 8080 -h /tmp/www"}
	c.MustRun(t, srv.manifest(ns), "apply", "-f", "-")
	for _, name := range clients {
		cl := podSpec{name: name, image: c.Image, runtimeClass: c.RuntimeClass, uid: 65532,
			labels: map[string]string{"role": name}, script: "sleep 3600"}
		c.MustRun(t, cl.manifest(ns), "apply", "-f", "-")
	}
	c.WaitReady(t, ns, "server", 180*time.Second)
	for _, name := range clients {
		c.WaitReady(t, ns, name, 180*time.Second)
	}
	ip = strings.TrimSpace(c.MustRun(t, nil, "-n", ns, "get", "pod", "server", "-o", "jsonpath={.status.podIP}"))
	if ip == "" {
		t.Fatal("server pod has no IP")
	}
	return ns, ip
}

const denyEgress = `{"apiVersion":"networking.k8s.io/v1","kind":"NetworkPolicy",
 "metadata":{"name":"deny-egress","namespace":%q},
 "spec":{"podSelector":{"matchLabels":{"role":%q}},"policyTypes":["Egress"]}}`

func TestClusterNetworkPolicy(t *testing.T) {
	c := Need(t)
	ns, ip := c.netpolSetup(t, "k8stest-netpol", "confined", "free")
	// Positive control: without a policy both gVisor clients reach the server.
	for _, p := range []string{"confined", "free"} {
		if _, ok := eventually(func() bool { return c.fetch(ns, p, ip) }); !ok {
			t.Fatalf("no policy yet: %s cannot reach the server %s: the pod network is broken", p, ip)
		}
	}
	c.MustRun(t, []byte(fmt.Sprintf(denyEgress, ns, "confined")), "apply", "-f", "-")
	took, ok := eventually(func() bool { return !c.fetch(ns, "confined", ip) })
	if !ok {
		t.Fatal("egress deny-all NOT enforced on the gVisor pod after 45 s")
	}
	t.Logf("egress deny enforced %v after apply", took.Round(100*time.Millisecond))
	if !c.fetch(ns, "free", ip) {
		t.Error("the unselected pod lost its connectivity: the policy is not what blocked the confined one")
	}
	// Removing the policy restores the connection: the block was the policy.
	c.MustRun(t, nil, "-n", ns, "delete", "networkpolicy", "deny-egress")
	if _, ok := eventually(func() bool { return c.fetch(ns, "confined", ip) }); !ok {
		t.Error("policy deleted, but the confined pod still cannot reach the server")
	}
}

// TestClusterNetworkPolicyControllerStopped shows the tool the backend's
// tests use (StopNetworkPolicyController): with the controller stopped, a
// pod created then is not confined by its deny-all policy; once the
// controller runs again, it is.
func TestClusterNetworkPolicyControllerStopped(t *testing.T) {
	c := Need(t)
	ns, ip := c.netpolSetup(t, "k8stest-nocontroller")
	c.MustRun(t, []byte(fmt.Sprintf(denyEgress, ns, "late")), "apply", "-f", "-")
	c.StopNetworkPolicyController(t)
	late := podSpec{name: "late", image: c.Image, runtimeClass: c.RuntimeClass, uid: 65532,
		labels: map[string]string{"role": "late"}, script: "sleep 3600"}
	c.MustRun(t, late.manifest(ns), "apply", "-f", "-")
	c.WaitReady(t, ns, "late", 180*time.Second)
	if _, ok := eventually(func() bool { return c.fetch(ns, "late", ip) }); !ok {
		t.Fatal("controller stopped, yet the new pod's egress is blocked: stopping the controller does not lift enforcement")
	}
	if err := c.script("netpol", "start"); err != nil {
		t.Fatal(err)
	}
	took, ok := eventually(func() bool { return !c.fetch(ns, "late", ip) })
	if !ok {
		t.Fatal("controller restarted, but the deny-all policy is still not enforced after 45 s")
	}
	t.Logf("controller restarted: policy enforced after %v", took.Round(100*time.Millisecond))
}
