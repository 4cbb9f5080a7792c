//go:build linux

package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/k8stest"
)

// The kubernetes backend against the real test cluster (scripts/k8s-cluster,
// internal/k8stest): Ready from the measurement inside the Pod, the broker
// off the Pod admitting the Pod's IP only, and Ready refused when the
// NetworkPolicy is not enforced. The moat-kubernetes beside MOAT_BIN (to
// which moat hands kubernetes commands) must be the binary inside
// MOAT_K8S_IMAGE (the measurement's plan is moat's own format).

// k8sPolicy writes a kubernetes policy for the cluster, in namespace ns.
func (e *env) k8sPolicy(c *k8stest.Cluster, ns string) string {
	e.t.Helper()
	p := filepath.Join(e.dir, "k8s-policy.yaml")
	y := fmt.Sprintf(`version: 1
backend: kubernetes
filesystem:
  read_only: [/bin]
  read_write: [%s]
process:
  env: {PATH: /bin:/usr/local/bin, HOME: /tmp}
audit:
  dir: %s
kubernetes:
  kubeconfig: %s
  namespace: %s
  image: %s
  runtime_class_name: %s
`, e.workspace, e.auditDir, c.Kubeconfig, ns, c.Image, c.RuntimeClass)
	if err := os.WriteFile(p, []byte(y), 0o644); err != nil {
		e.t.Fatal(err)
	}
	return p
}

func readRunInfo(t *testing.T, p string) (journal, pubkey string) {
	t.Helper()
	var ri struct {
		Journal      string `json:"journal"`
		PublicKeyPEM string `json:"public_key_pem"`
	}
	if err := json.Unmarshal([]byte(readFile(t, p)), &ri); err != nil {
		t.Fatal(err)
	}
	pub := p + ".pub.pem"
	if err := os.WriteFile(pub, []byte(ri.PublicKeyPEM), 0o644); err != nil {
		t.Fatal(err)
	}
	return ri.Journal, pub
}

// noneLeft checks that moat removed its Pod and NetworkPolicy.
func noneLeft(t *testing.T, c *k8stest.Cluster, ns string) {
	t.Helper()
	for _, kind := range []string{"pods", "networkpolicies"} {
		if out := c.MustRun(t, nil, "-n", ns, "get", kind, "-l", "moat.sandbox/run", "-o", "name"); strings.TrimSpace(out) != "" {
			t.Errorf("left behind in %s: %s", ns, out)
		}
	}
}

// TestKubernetesRun: a workload runs in the Pod after the measurement;
// its output, exit code and its request to the broker (off the Pod) come
// back; the journal verifies; the Pod and NetworkPolicy are gone after.
func TestKubernetesRun(t *testing.T) {
	c := k8stest.Need(t)
	e := newEnv(t)
	ns := c.Namespace(t, "moat-k8s-run")
	pol := e.k8sPolicy(c, ns)
	ri := filepath.Join(e.dir, "run-info.json")
	r := e.moat("run", "--policy", pol, "--run-info", ri, "--explain", "--", "/bin/sh", "-c",
		`echo out; echo err >&2; id -u; wget -O /dev/null "$MOAT_BROKER_URL/v1/messages" 2>&1 | head -3; exit 3`)
	if r.code != 3 || !strings.Contains(r.stdout, "out\n") || !strings.Contains(r.stderr, "err\n") {
		t.Fatalf("moat run: %s", r)
	}
	// The broker answered the sandbox's own request (an HTTP status, not
	// a refused or reset connection): the one allowed destination.
	if !strings.Contains(r.stdout, "HTTP/1.1 4") {
		t.Errorf("the workload's request to the broker got no HTTP answer: %s", r)
	}
	if !strings.Contains(r.stderr, "egress_interception") || !strings.Contains(r.stderr, "networkpolicy") {
		t.Errorf("--explain: %s", r.stderr)
	}
	journal, pub := readRunInfo(t, ri)
	if v := e.moat("audit", "verify", journal, "--pubkey", pub); v.code != 0 {
		t.Errorf("journal: %s", v)
	}
	var ready bool
	for _, p := range payloadsOf(t, journal) {
		if p["type"] == "boundary.confirmed" && p["ready"] == true {
			ready = true
		}
	}
	if !ready {
		t.Error("no boundary.confirmed ready in the journal")
	}
	noneLeft(t, c, ns)
}

// TestKubernetesSecondPodRefused: a second Pod in the namespace that
// connects to the sandbox's broker is refused and the refusal journaled,
// while the sandbox's own request, made afterwards in the same run, is
// answered (the positive control). The request is made on SIGHUP, which
// moat forwards to the workload through the exec API.
func TestKubernetesSecondPodRefused(t *testing.T) {
	c := k8stest.Need(t)
	if c.BusyboxImage == "" {
		t.Fatal("MOAT_K8S_BUSYBOX_IMAGE unset: no image for the second Pod")
	}
	e := newEnv(t)
	ns := c.Namespace(t, "moat-k8s-2nd")
	pol := e.k8sPolicy(c, ns)
	ri := filepath.Join(e.dir, "run-info.json")
	cmd := e.command("run", "--policy", pol, "--run-info", ri, "--", "/bin/sh", "-c",
		`trap 'wget -O /dev/null "$MOAT_BROKER_URL/v1/messages" 2>&1 | head -3; exit 7' HUP; echo "url=$MOAT_BROKER_URL"; while true; do sleep 1; done`)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var url string
	select {
	case l := <-lines:
		url, _ = strings.CutPrefix(l, "url=")
	case <-time.After(4 * time.Minute):
		t.Fatalf("the workload did not start: %s", stderr.String())
	}
	if !strings.HasPrefix(url, "http://") {
		se := stderr.String()
		t.Fatalf("workload said %q; stderr ends %s", url, se[max(0, len(se)-1500):])
	}
	// The second Pod: no NetworkPolicy selects it, so its packets reach
	// the broker's address; the broker must refuse it.
	c.MustRun(t, nil, "-n", ns, "run", "neighbour", "--image="+c.BusyboxImage, "--image-pull-policy=Never", "--restart=Never",
		"--command", "--", "timeout", "20", "wget", "-O", "-", url+"/v1/messages") // busybox wget -T segfaults
	var phase, podIP string
	waitFor(t, "the second Pod to finish", 3*time.Minute, func() bool {
		out, err := c.Run(context.Background(), nil, "-n", ns, "get", "pod", "neighbour", "-o", "jsonpath={.status.phase} {.status.podIP}")
		phase, podIP, _ = strings.Cut(strings.TrimSpace(out), " ")
		return err == nil && (phase == "Succeeded" || phase == "Failed")
	})
	logs, _ := c.Run(context.Background(), nil, "-n", ns, "logs", "neighbour")
	if phase != "Failed" || strings.Contains(logs, "HTTP/1.1") {
		t.Errorf("the second Pod reached the broker: phase %s, logs %q", phase, logs)
	}
	// The positive control: the sandbox's own request, now.
	cmd.Process.Signal(syscall.SIGHUP)
	var out []string
	for l := range lines {
		out = append(out, l)
	}
	werr := cmd.Wait()
	code := cmd.ProcessState.ExitCode()
	if code != 7 || !strings.Contains(strings.Join(out, "\n"), "HTTP/1.1 4") {
		t.Fatalf("the workload's own request after SIGHUP: exit %d (%v), stdout %q, stderr %s", code, werr, out, stderr.String())
	}
	journal, pub := readRunInfo(t, ri)
	if v := e.moat("audit", "verify", journal, "--pubkey", pub); v.code != 0 {
		t.Errorf("journal: %s", v)
	}
	var refused []string
	for _, p := range payloadsOf(t, journal) {
		if p["type"] == "inference.refused" && p["reason"] == "source_not_sandbox" {
			refused = append(refused, fmt.Sprint(p["detail"]))
		}
	}
	if len(refused) == 0 || podIP == "" || !strings.Contains(strings.Join(refused, "\n"), podIP+":") {
		t.Errorf("refusal of the second Pod (%s) not journaled: %q", podIP, refused)
	}
	noneLeft(t, c, ns)
}

// TestKubernetesNetworkPolicyUnenforced: with the cluster's NetworkPolicy
// controller stopped, the same policy that reached Ready (first run, the
// control) is refused at egress_interception: the NetworkPolicy exists
// but nothing enforces it, and only the measurement can tell.
func TestKubernetesNetworkPolicyUnenforced(t *testing.T) {
	c := k8stest.Need(t)
	e := newEnv(t)
	ns := c.Namespace(t, "moat-k8s-np")
	pol := e.k8sPolicy(c, ns)
	if r := e.moat("run", "--policy", pol, "--", "/bin/true"); r.code != 0 {
		t.Fatalf("control run with NetworkPolicy enforced: %s", r)
	}
	c.StopNetworkPolicyController(t)
	r := e.moat("run", "--policy", pol, "--", "/bin/true")
	if r.code != 125 || !strings.Contains(r.stderr, "egress_interception") {
		t.Fatalf("run with the NetworkPolicy unenforced: %s", r)
	}
	noneLeft(t, c, ns)
}

// podsOf lists the moat Pods in ns.
func podsOf(c *k8stest.Cluster, ns string) string {
	out, err := c.Run(context.Background(), nil, "-n", ns, "get", "pods,networkpolicies", "-l", "moat.sandbox/run", "-o", "name")
	if err != nil {
		return "error: " + err.Error()
	}
	return strings.TrimSpace(out)
}

// TestKubernetesLifecycle: moat sandbox create|get|exec|delete with the
// kubernetes backend: exec's output and exit code come back, delete
// removes the Pod and NetworkPolicy and ends the journal complete; a
// second sandbox whose supervisor is SIGKILLed has its Pod and
// NetworkPolicy removed by the watchdog and its journal ends incomplete.
func TestKubernetesLifecycle(t *testing.T) {
	c := k8stest.Need(t)
	e := newEnv(t)
	ns := c.Namespace(t, "moat-k8s-life")
	pol := e.k8sPolicy(c, ns)
	if r := e.moat("sandbox", "create", "--name", "k1", "--policy", pol); r.code != 0 {
		t.Fatalf("create: %s", r)
	}
	s, r := e.get("k1")
	if s.Phase != "Ready" || s.Journal == "" {
		t.Fatalf("get: %s", r)
	}
	if podsOf(c, ns) == "" {
		t.Fatal("no Pod in the cluster for a Ready sandbox")
	}
	x := e.moat("sandbox", "exec", "k1", "--", "/bin/sh", "-c", "echo hi; echo oops >&2; exit 5")
	if x.code != 5 || x.stdout != "hi\n" || !strings.Contains(x.stderr, "oops") {
		t.Errorf("exec: %s", x)
	}
	if x := e.moat("sandbox", "exec", "k1", "--", "no-such-command"); x.code != 127 {
		t.Errorf("exec of a missing command: %s", x)
	}
	if r := e.moat("sandbox", "delete", "k1"); r.code != 0 {
		t.Fatalf("delete: %s", r)
	}
	if left := podsOf(c, ns); left != "" {
		t.Errorf("after delete: %s", left)
	}
	if v := e.moat("audit", "verify", s.Journal, "--pubkey", s.PublicKey); v.code != 0 || !strings.Contains(v.stdout, "deleted") {
		t.Errorf("journal after delete: %s", v)
	}

	if r := e.moat("sandbox", "create", "--name", "k2", "--policy", pol); r.code != 0 {
		t.Fatalf("create k2: %s", r)
	}
	s2, _ := e.get("k2")
	if s2.SupervisorPID == 0 {
		t.Fatal("no supervisor pid")
	}
	syscall.Kill(s2.SupervisorPID, syscall.SIGKILL)
	waitFor(t, "the watchdog to remove the Pod and NetworkPolicy", 2*time.Minute, func() bool { return podsOf(c, ns) == "" })
	if v := e.moat("audit", "verify", s2.Journal, "--pubkey", s2.PublicKey); v.code != 2 {
		t.Errorf("journal of a killed supervisor: exit %d, want 2 (incomplete)\n%s", v.code, v)
	}
	e.moat("sandbox", "delete", "k2")
}

// TestKubernetesPodDeleted: a Pod deleted from outside moat ends the run
// with terminal reason sandbox_lost and says so, for moat run and for a
// moat sandbox alike (get then shows Error with the reason); the journal
// verifies complete.
func TestKubernetesPodDeleted(t *testing.T) {
	c := k8stest.Need(t)
	e := newEnv(t)
	ns := c.Namespace(t, "moat-k8s-del")
	pol := e.k8sPolicy(c, ns)
	ri := filepath.Join(e.dir, "run-info.json")
	cmd := e.command("run", "--policy", pol, "--run-info", ri, "--", "/bin/sh", "-c", "echo started; sleep 300")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	line, _ := bufio.NewReader(stdout).ReadString('\n')
	if line != "started\n" {
		t.Fatalf("workload said %q; stderr %s", line, stderr.String())
	}
	c.MustRun(t, nil, "-n", ns, "delete", "pods", "-l", "moat.sandbox/run", "--wait=false")
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		t.Fatalf("moat run still running 2 minutes after its Pod was deleted; stderr %s", stderr.String())
	}
	if code := cmd.ProcessState.ExitCode(); code != 125 || !strings.Contains(stderr.String(), "ended from outside moat") {
		t.Errorf("moat run after its Pod was deleted: exit %d, stderr %s", code, stderr.String())
	}
	journal, pub := readRunInfo(t, ri)
	if v := e.moat("audit", "verify", journal, "--pubkey", pub); v.code != 0 || !strings.Contains(v.stdout, "sandbox_lost") {
		t.Errorf("journal: %s", v)
	}

	if r := e.moat("sandbox", "create", "--name", "gone", "--policy", pol); r.code != 0 {
		t.Fatalf("create: %s", r)
	}
	s, _ := e.get("gone")
	c.MustRun(t, nil, "-n", ns, "delete", "pods", "-l", "moat.sandbox/run", "--wait=false")
	var g sbState
	waitFor(t, "get to show the sandbox in Error", 2*time.Minute, func() bool {
		g, _ = e.get("gone")
		return g.Phase == "Error"
	})
	if !strings.Contains(g.Error, "deleted from outside moat") {
		t.Errorf("get: error %q", g.Error)
	}
	// The supervisor writes the Error state, then closes the journal.
	var v result
	waitFor(t, "the sandbox's journal to end", time.Minute, func() bool {
		v = e.moat("audit", "verify", s.Journal, "--pubkey", s.PublicKey)
		return v.code != 2
	})
	if v.code != 0 || !strings.Contains(v.stdout, "sandbox_lost") {
		t.Errorf("sandbox journal: %s", v)
	}
	e.moat("sandbox", "delete", "gone")
	noneLeft(t, c, ns)
}
