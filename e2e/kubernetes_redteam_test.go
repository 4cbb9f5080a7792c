//go:build linux

package e2e

// Red team of the kubernetes backend (issue 20), against the real test
// cluster (scripts/k8s-cluster, internal/k8stest). The moat-kubernetes
// beside MOAT_BIN must be the binary inside MOAT_K8S_IMAGE.
//
// Attacks that did NOT work (why the code holds):
//   - ICMP echo from a Pod under a deny-all NetworkPolicy to the node:
//     kube-router's egress rules drop it (no reply), while an unconfined
//     Pod gets its reply.
//   - UDP to another Pod's IP, to the bridge's broadcast 10.244.0.255, to
//     255.255.255.255 and to 224.0.0.1 from a gVisor Pod under a deny-all
//     NetworkPolicy: a receiver Pod got none (an unconfined Pod's
//     unicast and broadcast arrived).
//   - The workload replacing /usr/local/bin/moat before the measurement:
//     nothing of the workload runs before Ready (Prepare runs only moat's
//     pause; the measurement is the first exec), and the root file system
//     is read-only with no grant over /usr/local/bin.
//   - A second Pod connecting to the broker's host port: its source is not
//     the Pod's IP; refused and journaled (TestKubernetesSecondPodRefused).
//   - Another sandbox of the same operator, in another namespace, reaching
//     this one's broker: its own NetworkPolicy allows only its own broker
//     port, and this broker admits only this Pod's IP
//     (TestKubernetesRedteamOtherSandbox).
//   - A moat Pod spoofing another Pod's IP: capabilities drop ALL, runsc's
//     raw sockets are off and moat's filter refuses AF_PACKET. (A runc Pod
//     with the default CAP_NET_RAW CAN: see /work/notes/redteam20.md F4,
//     open.)
//   - Pod-to-Pod from the sandbox to a listener Pod on the same node:
//     refused by kube-router (br_netfilter on).
//   - Ending the sandbox's own Pod (kill -TERM 1: pause runs as the same
//     uid): the run ends as sandbox_lost; the exec reports 137, never a
//     false 0.
//   - The broker admitting an old Pod IP while the Pod is torn down: the
//     session closes the broker before Terminate deletes the Pod.
//   - The workload changing the exit code of the operator's moat sandbox
//     exec: ptrace and process_vm_writev are refused by moat's filter and
//     /proc/PID/mem of a sibling cannot be opened under gVisor (EACCES);
//     killing it gives 128+signal, never 0. (It CAN write into that
//     exec's stdout, and read its stdin, through /proc/PID/fd/N, as on
//     every backend: processes of one sandbox share one trust domain, so
//     an exec's output is the sandbox's word, not a verdict.)
//   - Policy fields injecting into the manifest: the Pod and the
//     NetworkPolicy are built as typed objects (no text templating); names
//     come from the run id mapped to [a-z0-9-].
//   - A Pod or NetworkPolicy of the same name made beforehand: Create
//     fails with AlreadyExists and Prepare refuses; Terminate deletes only
//     what this run created (npMade/podMade).
//   - Service-account token, service links: not mounted/injected; the
//     stage clears the environment the kubelet sets (KUBERNETES_SERVICE_*)
//     and sets only the policy's.

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/k8stest"
	"github.com/moat-sandbox/moat/internal/testenv"
)

// hostLinkLocals are this host's IPv6 link-local addresses (the node's:
// the test cluster is single-node on this host), one of which is the
// Pod bridge's.
func hostLinkLocals(t *testing.T) []string {
	t.Helper()
	ifs, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, ifc := range ifs {
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is6() && p.Addr().IsLinkLocalUnicast() {
				out = append(out, p.Addr().String())
			}
		}
	}
	return out
}

// v6Receiver listens on [::]:0 (both families) and records the source of
// each connection it accepts.
type v6Receiver struct {
	ln    net.Listener
	mu    sync.Mutex
	peers []string
}

func newV6Receiver(t *testing.T) *v6Receiver {
	t.Helper()
	ln, err := net.Listen("tcp", "[::]:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &v6Receiver{ln: ln}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			r.mu.Lock()
			r.peers = append(r.peers, c.RemoteAddr().String())
			r.mu.Unlock()
			c.Write([]byte("hello\n"))
			c.Close()
		}
	}()
	return r
}

func (r *v6Receiver) port() int { return r.ln.Addr().(*net.TCPAddr).Port }

func (r *v6Receiver) seen() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.peers...)
}

// TestKubernetesRedteamIPv6 (attack: IPv6 link-local egress past the
// NetworkPolicy): a Pod's eth0 has an IPv6 link-local address, and
// kube-router in this single-stack cluster confines IPv4 only. The
// positive control is a plain gVisor Pod under a deny-all NetworkPolicy
// in the same namespace: its IPv4 connection to the node is refused (the
// policy is in force), yet its IPv6 connection to the bridge's link-local
// address reaches a receiver on the host. A moat sandbox's workload
// trying the same addresses must reach nothing (the stage's filter
// refuses IPv6 sockets), while its request to the broker is answered.
// Before the fix the workload connected and the run reached Ready.
func TestKubernetesRedteamIPv6(t *testing.T) {
	c := k8stest.Need(t)
	if c.BusyboxImage == "" {
		t.Fatal("MOAT_K8S_BUSYBOX_IMAGE unset: no image for the control Pod")
	}
	lls := hostLinkLocals(t)
	if len(lls) == 0 {
		t.Fatal("this host has no IPv6 link-local address: the cluster's Pod bridge has IPv6 off, nothing to attack")
	}
	rcv := newV6Receiver(t)
	nodeIP := strings.TrimSpace(c.MustRun(t, nil, "get", "nodes", "-o", `jsonpath={.items[0].status.addresses[?(@.type=="InternalIP")].address}`))
	if _, err := netip.ParseAddr(nodeIP); err != nil {
		t.Fatalf("node InternalIP %q: %v", nodeIP, err)
	}
	e := newEnv(t)
	ns := c.Namespace(t, "moat-k8s-rt6")
	// The same loop for both: the addresses, each with the Pod's eth0.
	try6 := fmt.Sprintf(`for a in %s; do if nc -w 2 "$a%%eth0" %d </dev/null >/dev/null 2>&1; then echo "v6-connected $a"; fi; done; echo v6-done`,
		strings.Join(lls, " "), rcv.port())

	// The control Pod: a deny-all NetworkPolicy first, then the Pod,
	// which waits until its IPv4 connection to the node is refused.
	c.MustRun(t, []byte(fmt.Sprintf(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all, namespace: %s}
spec:
  podSelector: {matchLabels: {h7-redteam: control}}
  policyTypes: [Ingress, Egress]
`, ns)), "apply", "-f", "-")
	script := fmt.Sprintf(`i=0; while nc -w 2 %s %d </dev/null >/dev/null 2>&1; do i=$((i+1)); [ $i -gt 30 ] && { echo v4-open; exit 0; }; sleep 1; done; echo v4-blocked; %s`,
		nodeIP, rcv.port(), try6)
	c.MustRun(t, []byte(fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: control, namespace: %s, labels: {h7-redteam: control}}
spec:
  runtimeClassName: %s
  restartPolicy: Never
  automountServiceAccountToken: false
  containers:
  - name: c
    image: %s
    imagePullPolicy: Never
    command: [sh, -c, %q]
`, ns, c.RuntimeClass, c.BusyboxImage, script)), "apply", "-f", "-")
	var phase string
	waitFor(t, "the control Pod to finish", 3*time.Minute, func() bool {
		out, err := c.Run(context.Background(), nil, "-n", ns, "get", "pod", "control", "-o", "jsonpath={.status.phase}")
		phase = strings.TrimSpace(out)
		return err == nil && (phase == "Succeeded" || phase == "Failed")
	})
	logs := c.MustRun(t, nil, "-n", ns, "logs", "control")
	if !strings.Contains(logs, "v4-blocked") || !strings.Contains(logs, "v6-connected") {
		t.Fatalf("control Pod under a deny-all NetworkPolicy: want IPv4 blocked and IPv6 link-local connected (the hole this test is about), got %q (phase %s)", logs, phase)
	}
	before := len(rcv.seen())

	// The sandbox: same addresses from the workload, then the broker.
	pol := e.k8sPolicy(c, ns)
	r := e.moat("run", "--policy", pol, "--", "/bin/sh", "-c",
		try6+`; wget -O /dev/null "$MOAT_BROKER_URL/v1/messages" 2>&1 | head -3`)
	if r.code != 0 {
		t.Fatalf("moat run: %s", r)
	}
	if !strings.Contains(r.stdout, "v6-done") || !strings.Contains(r.stdout, "HTTP/1.1 4") {
		t.Fatalf("the workload did not run its probes, or its broker request (the control) got no HTTP answer: %s", r)
	}
	if strings.Contains(r.stdout, "v6-connected") {
		t.Errorf("the sandbox's workload reached the host over IPv6 link-local past the NetworkPolicy: %s", r.stdout)
	}
	if got := rcv.seen(); len(got) > before {
		t.Errorf("the host receiver accepted from the sandbox: %v", got[before:])
	}
	noneLeft(t, c, ns)
}

// watchdogsOf returns the pids of the kubernetes watchdogs whose
// configuration names the Pod pod.
func watchdogsOf(t *testing.T, pod string) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := bytes.Split(bytes.TrimRight(b, "\x00"), []byte{0})
		if len(args) == 3 && string(args[1]) == "__moat-k8s-watchdog" && bytes.Contains(args[2], []byte(`"name":"`+pod+`"`)) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// TestKubernetesRedteamWatchdogKilled (attack: the watchdog dies first):
// the watchdog is what removes the Pod when the supervisor dies. Killed
// first (or dead of a crash), it left nothing: a supervisor SIGKILLed
// afterwards left the Pod, and the workload in it, running for good. Now
// the supervisor starts another watchdog; the control in the same
// sandbox: with its first watchdog killed the sandbox still serves an
// exec, and once the supervisor is SIGKILLed the Pod and NetworkPolicy
// go and the journal ends incomplete.
func TestKubernetesRedteamWatchdogKilled(t *testing.T) {
	c := k8stest.Need(t)
	e := newEnv(t)
	ns := c.Namespace(t, "moat-k8s-rtwd")
	pol := e.k8sPolicy(c, ns)
	if r := e.moat("sandbox", "create", "--name", "wd", "--policy", pol); r.code != 0 {
		t.Fatalf("create: %s", r)
	}
	s, _ := e.get("wd")
	defer e.moat("sandbox", "delete", "wd")
	pod := strings.TrimPrefix(strings.TrimSpace(c.MustRun(t, nil, "-n", ns, "get", "pods", "-l", "moat.sandbox/run", "-o", "name")), "pod/")
	first := watchdogsOf(t, pod)
	if pod == "" || len(first) != 1 || s.SupervisorPID == 0 {
		t.Fatalf("pod %q, watchdogs %v, supervisor %d", pod, first, s.SupervisorPID)
	}
	syscall.Kill(first[0], syscall.SIGKILL)
	var again []int
	waitFor(t, "another watchdog", 30*time.Second, func() bool {
		again = watchdogsOf(t, pod)
		return len(again) == 1 && again[0] != first[0]
	})
	if x := e.moat("sandbox", "exec", "wd", "--", "/bin/true"); x.code != 0 {
		t.Errorf("exec after the watchdog was killed: %s", x)
	}
	syscall.Kill(s.SupervisorPID, syscall.SIGKILL)
	waitFor(t, "the Pod and NetworkPolicy to be removed after the supervisor's SIGKILL", 90*time.Second, func() bool { return podsOf(c, ns) == "" })
	if v := e.moat("audit", "verify", s.Journal, "--pubkey", s.PublicKey); v.code != 2 {
		t.Errorf("journal of a killed supervisor: exit %d, want 2 (incomplete)\n%s", v.code, v)
	}
}

// TestKubernetesRedteamTerminationMessage (attack: the workload writes
// moat's output): /dev/termination-log is writable by any uid in the Pod,
// and once the Pod's main process ends (the workload ends it: same uid)
// its content is the container's termination message, which moat put as
// is into the sandbox's end reason: moat sandbox get printed the
// workload's terminal escapes and forged lines. Now it is quoted; the
// control in the same sandbox: the reason still says how the Pod ended
// and carries the message's words.
func TestKubernetesRedteamTerminationMessage(t *testing.T) {
	c := k8stest.Need(t)
	e := newEnv(t)
	ns := c.Namespace(t, "moat-k8s-rttm")
	pol := e.k8sPolicy(c, ns)
	if r := e.moat("sandbox", "create", "--name", "tm", "--policy", pol); r.code != 0 {
		t.Fatalf("create: %s", r)
	}
	defer e.moat("sandbox", "delete", "tm")
	e.moat("sandbox", "exec", "tm", "--", "/bin/sh", "-c", `printf '\033[31mFORGED\nphase:  Ready\n' > /dev/termination-log; kill -TERM 1`)
	var r result
	waitFor(t, "get to show the sandbox in Error", 2*time.Minute, func() bool {
		var s sbState
		s, r = e.get("tm")
		return s.Phase == "Error"
	})
	g := e.moat("sandbox", "get", "tm")
	if strings.ContainsAny(g.stdout+g.stderr, "\x1b") || strings.Count("\n"+g.stdout, "\nphase:") != 1 {
		t.Errorf("moat sandbox get prints the workload's bytes raw:\n%q", g.stdout)
	}
	if !strings.Contains(g.stdout, "the Pod ended") || !strings.Contains(g.stdout, "FORGED") {
		t.Errorf("moat sandbox get lost the reason: %s\n(json: %s)", g, r)
	}
}

// TestKubernetesRedteamOtherSandbox (attack: another sandbox of the same
// operator, in another namespace, uses this one's broker): B's workload
// asks A's broker and gets no HTTP answer (B's NetworkPolicy allows B's
// broker only, and A's broker admits A's Pod only), and A's journal holds
// no request of B's; the controls in the same setup: B's request to its
// own broker and A's to its own are answered.
func TestKubernetesRedteamOtherSandbox(t *testing.T) {
	c := k8stest.Need(t)
	e := newEnv(t)
	nsA, nsB := c.Namespace(t, "moat-k8s-rtsa"), c.Namespace(t, "moat-k8s-rtsb")
	if r := e.moat("sandbox", "create", "--name", "a", "--policy", e.k8sPolicy(c, nsA)); r.code != 0 {
		t.Fatalf("create a: %s", r)
	}
	defer e.moat("sandbox", "delete", "a")
	a, _ := e.get("a")
	x := e.moat("sandbox", "exec", "a", "--", "/bin/sh", "-c", `echo "$MOAT_BROKER_URL"; wget -O /dev/null "$MOAT_BROKER_URL/v1/messages" 2>&1 | head -3`)
	urlA, _, _ := strings.Cut(x.stdout, "\n")
	if !strings.HasPrefix(urlA, "http://") || !strings.Contains(x.stdout, "HTTP/1.1 4") {
		t.Fatalf("A's own request (control): %s", x)
	}
	r := e.moat("run", "--policy", e.k8sPolicy(c, nsB), "--", "/bin/sh", "-c",
		`wget -O /dev/null "`+urlA+`/v1/messages" 2>&1 | head -3; echo ---; wget -O /dev/null "$MOAT_BROKER_URL/v1/messages" 2>&1 | head -3`)
	other, own, _ := strings.Cut(r.stdout, "---")
	if r.code != 0 || !strings.Contains(own, "HTTP/1.1 4") {
		t.Fatalf("B's own request (control): %s", r)
	}
	if strings.Contains(other, "HTTP/") {
		t.Errorf("B's workload got an answer from A's broker: %q", other)
	}
	var fromOthers int
	for _, p := range payloadsOf(t, a.Journal) {
		if ty, _ := p["type"].(string); strings.HasPrefix(ty, "inference.") && p["reason"] != "source_not_sandbox" {
			fromOthers++
		}
	}
	if fromOthers != 1 { // A's own request only
		t.Errorf("A's journal holds %d inference records, want 1 (its own)", fromOthers)
	}
}

// TestRootKubernetesRedteamHostPathOtherSandbox (attack: another sandbox
// swaps a hostPath grant under the kubelet): sandbox X (uid 1000) has the
// read_write hostPath grant BASE/x; sandbox Y (uid 2000) has BASE/x/y.
// moat checked only that Y's own uid cannot replace a component, so Y was
// accepted, and X's workload, toggling x/y between the directory and a
// symlink to a directory of its own, had the kubelet mount X's directory
// as Y's grant whenever the swap fell between moat's check and the mount
// (seen: 6 of 10 runs of Y wrote their file into X's directory). Now a
// component in a directory that a uid other than root and moat's own can
// write is refused, whatever the sandbox's uid; the control in the same
// setup: Y's same grant under a directory only root writes runs and
// writes its file on the host.
func TestRootKubernetesRedteamHostPathOtherSandbox(t *testing.T) {
	testenv.NeedRoot(t)
	c := k8stest.Need(t)
	e := newEnv(t)
	ns := c.Namespace(t, "moat-k8s-rthp")
	base, err := os.MkdirTemp("/var/tmp", "moat-rt-hp-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	os.Chmod(base, 0o755)
	mk := func(p string, uid int) string {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		os.Chmod(p, 0o755)
		if err := os.Chown(p, uid, uid); err != nil {
			t.Fatal(err)
		}
		return p
	}
	mk(filepath.Join(base, "x"), 1000) // sandbox X's grant
	swappable := mk(filepath.Join(base, "x", "y"), 2000)
	mk(filepath.Join(base, "z"), 0)
	safe := mk(filepath.Join(base, "z", "y"), 2000)
	policyFor := func(grant string) string {
		p := filepath.Join(e.dir, "hp-"+filepath.Base(filepath.Dir(grant))+".yaml")
		y := fmt.Sprintf(`version: 1
backend: kubernetes
filesystem: {read_only: [], read_write: [%s]}
process: {uid: 2000, gid: 2000, env: {PATH: /bin:/usr/local/bin, HOME: /tmp}}
audit: {dir: %s}
kubernetes: {kubeconfig: %s, namespace: %s, image: %s, runtime_class_name: %s, host_path_grants: true}
`, grant, e.auditDir, c.Kubeconfig, ns, c.Image, c.RuntimeClass)
		if err := os.WriteFile(p, []byte(y), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	r := e.moat("run", "--policy", policyFor(swappable), "--", "/bin/sh", "-c", "echo mine > "+swappable+"/f")
	if r.code != 125 || !strings.Contains(r.stderr, "uid 1000 can write (another sandbox") {
		t.Errorf("a grant in another sandbox's directory: %s", r)
	}
	if _, err := os.Stat(filepath.Join(swappable, "f")); err == nil {
		t.Error("the refused run wrote its file")
	}
	r = e.moat("run", "--policy", policyFor(safe), "--", "/bin/sh", "-c", "echo mine > "+safe+"/f")
	if r.code != 0 {
		t.Fatalf("control, the grant under a directory only root writes: %s", r)
	}
	if b, err := os.ReadFile(filepath.Join(safe, "f")); err != nil || string(b) != "mine\n" {
		t.Errorf("control: the workload's file on the host: %q %v", b, err)
	}
	noneLeft(t, c, ns)
}

// TestKubernetesRedteamNamespacePolicy (attack: a namespace policy widens
// the Pod's egress where the measurement does not look): NetworkPolicies
// add up, and with a namespace's "allow egress to 0.0.0.0/0 except the
// node" the sandbox reached Ready (the measurement can probe the broker's
// host only) and its workload connected to a Pod of another namespace.
// Now such a policy refuses the run before the workload starts; the
// control in the same namespace: with a default deny instead (selects the
// Pod, allows nothing) the run reaches Ready, its broker request is
// answered, and the other Pod is out of reach.
func TestKubernetesRedteamNamespacePolicy(t *testing.T) {
	c := k8stest.Need(t)
	if c.BusyboxImage == "" {
		t.Fatal("MOAT_K8S_BUSYBOX_IMAGE unset: no image for the listener Pod")
	}
	e := newEnv(t)
	ns, lns := c.Namespace(t, "moat-k8s-rtnp"), c.Namespace(t, "moat-k8s-rtnl")
	c.MustRun(t, []byte(fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: lis, namespace: %s}
spec:
  restartPolicy: Never
  automountServiceAccountToken: false
  containers:
  - name: c
    image: %s
    imagePullPolicy: Never
    command: [sh, -c, 'while true; do echo hi-from-listener | nc -l -p 8080; done']
`, lns, c.BusyboxImage)), "apply", "-f", "-")
	c.MustRun(t, nil, "-n", lns, "wait", "--for=condition=Ready", "pod/lis", "--timeout=120s")
	lip := strings.TrimSpace(c.MustRun(t, nil, "-n", lns, "get", "pod", "lis", "-o", "jsonpath={.status.podIP}"))
	nodeIP := strings.TrimSpace(c.MustRun(t, nil, "get", "nodes", "-o", `jsonpath={.items[0].status.addresses[?(@.type=="InternalIP")].address}`))
	c.MustRun(t, []byte(fmt.Sprintf(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-egress-but-node, namespace: %s}
spec:
  podSelector: {}
  policyTypes: [Egress]
  egress:
  - to: [{ipBlock: {cidr: 0.0.0.0/0, except: [%s/32]}}]
`, ns, nodeIP)), "apply", "-f", "-")
	pol := e.k8sPolicy(c, ns)
	work := `nc -w 3 ` + lip + ` 8080 </dev/null; echo ---; wget -O /dev/null "$MOAT_BROKER_URL/v1/messages" 2>&1 | head -3`
	r := e.moat("run", "--policy", pol, "--", "/bin/sh", "-c", work)
	if r.code != 125 || !strings.Contains(r.stderr, "allow-egress-but-node") || strings.Contains(r.stdout, "hi-from-listener") {
		t.Errorf("a namespace policy allowing egress: %s", r)
	}
	c.MustRun(t, nil, "-n", ns, "delete", "networkpolicy", "allow-egress-but-node")
	c.MustRun(t, []byte(fmt.Sprintf(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: default-deny, namespace: %s}
spec:
  podSelector: {}
  policyTypes: [Ingress, Egress]
`, ns)), "apply", "-f", "-")
	r = e.moat("run", "--policy", pol, "--", "/bin/sh", "-c", work)
	if r.code != 0 || !strings.Contains(r.stdout, "HTTP/1.1 4") {
		t.Fatalf("control with a default deny: %s", r)
	}
	if strings.Contains(r.stdout, "hi-from-listener") {
		t.Errorf("control: the workload reached the other Pod: %s", r.stdout)
	}
	noneLeft(t, c, ns)
}
