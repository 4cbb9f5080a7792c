// Package k8stest gives tests the real Kubernetes cluster that
// scripts/k8s-cluster runs on this host (etcd, apiserver, kubelet,
// containerd with gVisor's runsc, kube-router enforcing NetworkPolicy).
//
// A test calls Need(t) first. The cluster is described by environment
// variables that `scripts/k8s-cluster env` prints and .ci/run exports:
//
//	KUBECONFIG              admin kubeconfig of the running cluster
//	MOAT_K8S_IMAGE          image with the moat binary under test at
//	                        /usr/local/bin/moat (busybox-static, uid 65532);
//	                        imported into containerd, never pulled
//	MOAT_K8S_RUNTIMECLASS   RuntimeClass of gVisor pods ("gvisor")
//	MOAT_K8S_NODE           the single node's name
//	MOAT_K8S_BUSYBOX_IMAGE  busybox-only image (e.g. for a second pod)
//	MOAT_K8S_CLUSTER        path of scripts/k8s-cluster (netpol stop|start)
//
// Without KUBECONFIG and MOAT_K8S_IMAGE, Need skips the test through
// internal/testenv, which turns the skip into a failure under
// MOAT_REQUIRE_ALL=1. The one exception is MOAT_K8S_DEFERRED=1: .ci/run
// sets it for its general test phase, because the kubernetes tests run in
// its own k8s phase against the cluster (with MOAT_REQUIRE_ALL=1 and
// without MOAT_K8S_DEFERRED, so there they cannot skip).
//
// The helpers here drive kubectl (from PATH, or MOAT_K8S_KUBECTL) so that
// this package needs no client library; backend tests use their own
// client with the same KUBECONFIG.
package k8stest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/testenv"
)

// Cluster is the test cluster as the environment describes it.
type Cluster struct {
	Kubeconfig   string // KUBECONFIG
	Image        string // MOAT_K8S_IMAGE
	RuntimeClass string // MOAT_K8S_RUNTIMECLASS, default "gvisor"
	Node         string // MOAT_K8S_NODE (may be empty)
	BusyboxImage string // MOAT_K8S_BUSYBOX_IMAGE (may be empty)
	Script       string // MOAT_K8S_CLUSTER (may be empty)
	Kubectl      string // kubectl binary: MOAT_K8S_KUBECTL or "kubectl" from PATH
}

// FromEnv reads the cluster description. It returns an error naming what
// is missing when KUBECONFIG or MOAT_K8S_IMAGE is unset or the kubeconfig
// is not readable.
func FromEnv() (*Cluster, error) {
	c := &Cluster{
		Kubeconfig:   os.Getenv("KUBECONFIG"),
		Image:        os.Getenv("MOAT_K8S_IMAGE"),
		RuntimeClass: os.Getenv("MOAT_K8S_RUNTIMECLASS"),
		Node:         os.Getenv("MOAT_K8S_NODE"),
		BusyboxImage: os.Getenv("MOAT_K8S_BUSYBOX_IMAGE"),
		Script:       os.Getenv("MOAT_K8S_CLUSTER"),
		Kubectl:      os.Getenv("MOAT_K8S_KUBECTL"),
	}
	var missing []string
	if c.Kubeconfig == "" {
		missing = append(missing, "KUBECONFIG")
	}
	if c.Image == "" {
		missing = append(missing, "MOAT_K8S_IMAGE")
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("no test cluster: %s unset (run scripts/k8s-cluster up, then eval \"$(scripts/k8s-cluster env)\")", strings.Join(missing, " and "))
	}
	f, err := os.Open(c.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("no test cluster: KUBECONFIG: %v", err)
	}
	f.Close()
	if c.RuntimeClass == "" {
		c.RuntimeClass = "gvisor"
	}
	if c.Kubectl == "" {
		c.Kubectl = "kubectl"
	}
	return c, nil
}

// Need returns the test cluster, or skips t (a failure under
// MOAT_REQUIRE_ALL=1 unless MOAT_K8S_DEFERRED=1, see the package doc).
func Need(t testing.TB) *Cluster {
	t.Helper()
	c, err := FromEnv()
	if err == nil {
		return c
	}
	if os.Getenv("MOAT_K8S_DEFERRED") == "1" {
		t.Skipf("skipping: %v; MOAT_K8S_DEFERRED=1: the kubernetes tests run in .ci/run's k8s phase", err)
	}
	testenv.Need(t, false, err.Error())
	return nil
}

// Run runs kubectl with args (and stdin when not nil) against the cluster
// and returns its stdout; stderr is part of the error.
func (c *Cluster) Run(ctx context.Context, stdin []byte, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, c.Kubectl, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.Kubeconfig)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

// MustRun is Run that fails t on error (60 s timeout).
func (c *Cluster) MustRun(t testing.TB, stdin []byte, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := c.Run(ctx, stdin, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Namespace creates a fresh namespace (prefix plus random suffix) and
// deletes it, with everything in it, when t ends.
func (c *Cluster) Namespace(t testing.TB, prefix string) string {
	t.Helper()
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	ns := prefix + "-" + hex.EncodeToString(b[:])
	c.MustRun(t, nil, "create", "namespace", ns)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
		defer cancel()
		if _, err := c.Run(ctx, nil, "delete", "namespace", ns, "--wait=true", "--timeout=110s"); err != nil {
			t.Logf("cleanup: %v", err)
		}
	})
	// Pods need the namespace's default ServiceAccount (the controller-manager creates it).
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := c.Run(ctx, nil, "-n", ns, "get", "serviceaccount", "default")
		cancel()
		if err == nil {
			return ns
		}
		if time.Now().After(deadline) {
			t.Fatalf("namespace %s: no default serviceaccount after 60 s: %v", ns, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// StopNetworkPolicyController stops the cluster's NetworkPolicy
// controller (kube-router) through scripts/k8s-cluster, for tests that
// must show that an unenforced policy fails a check. Policies already
// programmed stay in the host's iptables; pods created afterwards are not
// confined. The controller is started again when t ends.
func (c *Cluster) StopNetworkPolicyController(t testing.TB) {
	t.Helper()
	if c.Script == "" {
		t.Fatal("MOAT_K8S_CLUSTER unset: cannot stop the NetworkPolicy controller")
	}
	if err := c.script("netpol", "stop"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.script("netpol", "start"); err != nil {
			t.Errorf("restarting the NetworkPolicy controller: %v", err)
		}
	})
}

func (c *Cluster) script(args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 180*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.Script, args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", c.Script, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// WaitReady waits until pod ns/name is Ready and returns how long that took.
func (c *Cluster) WaitReady(t testing.TB, ns, name string, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), timeout+10*time.Second)
	defer cancel()
	if _, err := c.Run(ctx, nil, "-n", ns, "wait", "--for=condition=Ready", "pod/"+name, fmt.Sprintf("--timeout=%ds", int(timeout.Seconds()))); err != nil {
		desc, _ := c.Run(context.Background(), nil, "-n", ns, "describe", "pod", name)
		t.Fatalf("pod %s/%s not Ready: %v\n%s", ns, name, err, desc)
	}
	return time.Since(start)
}
