package kubernetes

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/go-json-experiment/json"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/moat-sandbox/moat/internal/reexec"
	"github.com/moat-sandbox/moat/policy"
)

// WatchdogHelper is the hidden helper that deletes a sandbox's Pod and
// NetworkPolicy when the process that made them (the supervisor, or moat
// run) dies without doing so (internal/cli/hidden.go lists it).
const WatchdogHelper = reexec.Prefix + "k8s-watchdog"

// watchdogConfig is the watchdog's one argument.
type watchdogConfig struct {
	Kubernetes policy.Kubernetes `json:"kubernetes"`
	Name       string            `json:"name"`
}

// watchdogDone is what the supervisor writes when it has removed the
// Pod and NetworkPolicy itself.
const watchdogDone = "done\n"

// startWatchdog starts the watchdog in a session of its own, holding the
// read end of a pipe whose write end only this process has: when this
// process dies, the watchdog reads EOF without watchdogDone and deletes
// the Pod and NetworkPolicy. The Pod's end ends the run; its journal
// stays without a terminal record (incomplete), as for any killed
// supervisor.
func startWatchdog(k policy.Kubernetes, name string) (*os.File, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	arg, err := json.Marshal(watchdogConfig{Kubernetes: k, Name: name})
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	cmd := exec.Command(exe, WatchdogHelper, string(arg))
	cmd.Stdin = r
	cmd.Stderr = os.Stderr
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	if kc := os.Getenv("KUBECONFIG"); kc != "" && k.Kubeconfig == "" && !k.InCluster {
		cmd.Env = append(cmd.Env, "KUBECONFIG="+kc)
	}
	if h := os.Getenv("HOME"); h != "" {
		cmd.Env = append(cmd.Env, "HOME="+h)
	}
	for _, v := range []string{"KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"} {
		if x := os.Getenv(v); x != "" {
			cmd.Env = append(cmd.Env, v+"="+x)
		}
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil, fmt.Errorf("kubernetes: starting the watchdog: %w", err)
	}
	go cmd.Wait()
	return w, nil
}

// WatchdogMain waits for its stdin to end; without watchdogDone first, it
// deletes the Pod (and waits until it is gone) and then the
// NetworkPolicy.
func WatchdogMain(args []string) int {
	closeInheritedFDs()
	if len(args) != 1 {
		fmt.Fprintln(os.Stderr, "moat: kubernetes watchdog: want one argument")
		return 125
	}
	var cfg watchdogConfig
	if err := json.Unmarshal([]byte(args[0]), &cfg, json.RejectUnknownMembers(true)); err != nil || cfg.Name == "" {
		fmt.Fprintf(os.Stderr, "moat: kubernetes watchdog: bad configuration: %v\n", err)
		return 125
	}
	line, _ := bufio.NewReader(io.LimitReader(os.Stdin, 64)).ReadString('\n')
	if line == watchdogDone {
		return 0
	}
	cs, _, err := defaultClients(&cfg.Kubernetes)
	if err != nil {
		fmt.Fprintf(os.Stderr, "moat: kubernetes watchdog: %v\n", err)
		return 1
	}
	s := &sandbox{cs: cs, ns: cfg.Kubernetes.Namespace, name: cfg.Name}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	zero := int64(0)
	code := 0
	if err := cs.CoreV1().Pods(s.ns).Delete(ctx, s.name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil && !apierrors.IsNotFound(err) {
		fmt.Fprintf(os.Stderr, "moat: kubernetes watchdog: deleting Pod %s/%s: %v\n", s.ns, s.name, err)
		code = 1
	}
	s.waitGone(ctx)
	if err := cs.NetworkingV1().NetworkPolicies(s.ns).Delete(ctx, s.name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		fmt.Fprintf(os.Stderr, "moat: kubernetes watchdog: deleting NetworkPolicy %s/%s: %v\n", s.ns, s.name, err)
		code = 1
	}
	return code
}
