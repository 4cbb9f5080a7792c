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
//
// The returned channel is closed when the watchdog exits.
func startWatchdog(k policy.Kubernetes, name string) (*os.File, <-chan struct{}, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, nil, err
	}
	arg, err := json.Marshal(watchdogConfig{Kubernetes: k, Name: name})
	if err != nil {
		return nil, nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, nil, err
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
		return nil, nil, fmt.Errorf("kubernetes: starting the watchdog: %w", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	return w, exited, nil
}

// maxWatchdogRestarts bounds how often keepWatchdog starts a new watchdog
// for one sandbox.
const maxWatchdogRestarts = 5

// keepWatchdog starts a new watchdog whenever the one in force exits
// before Terminate: without one, a supervisor that dies leaves the Pod,
// and the workload in it, running for good. When none can be started
// (or too many died), the sandbox ends (fail closed).
func (s *sandbox) keepWatchdog(k policy.Kubernetes, exited <-chan struct{}) {
	for n := 0; ; n++ {
		select {
		case <-s.stopWatch:
			return
		case <-exited:
		}
		select {
		case <-s.stopWatch:
			return // Terminate told it done: its exit is the normal one
		default:
		}
		var w *os.File
		err := fmt.Errorf("%d watchdogs exited", n+1)
		if n < maxWatchdogRestarts {
			w, exited, err = startWatchdog(k, s.name)
		}
		if err != nil {
			s.ended("moat's watchdog, which removes the Pod if moat dies, exited and could not be replaced: " + err.Error())
			return
		}
		fmt.Fprintf(os.Stderr, "moat: kubernetes: the watchdog of %s/%s exited; started another\n", s.ns, s.name)
		s.mu.Lock()
		old := s.watchdog
		s.watchdog = w
		s.mu.Unlock()
		if old != nil {
			old.Close()
		}
	}
}

// watchdogGiveUp bounds how long a watchdog keeps trying to delete the
// Pod and the NetworkPolicy (the API server may be down for a while, as
// it may be when whatever killed the supervisor strikes the host).
const watchdogGiveUp = 10 * time.Minute

// retry calls f until it succeeds (nil or NotFound) or ctx ends.
func retry(ctx context.Context, f func() error) error {
	wait := time.Second
	for {
		err := f()
		if err == nil || apierrors.IsNotFound(err) {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		wait = min(2*wait, 15*time.Second)
	}
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
	ctx, cancel := context.WithTimeout(context.Background(), watchdogGiveUp)
	defer cancel()
	zero := int64(0)
	code := 0
	// Each delete is tried again until it succeeds: one failure (the API
	// server restarting) must not leave the Pod running for good.
	if err := retry(ctx, func() error {
		return cs.DeletePod(ctx, s.ns, s.name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	}); err != nil {
		fmt.Fprintf(os.Stderr, "moat: kubernetes watchdog: deleting Pod %s/%s: %v\n", s.ns, s.name, err)
		code = 1
	}
	s.waitGone(ctx)
	if err := retry(ctx, func() error {
		return cs.DeleteNetworkPolicy(ctx, s.ns, s.name, metav1.DeleteOptions{})
	}); err != nil {
		fmt.Fprintf(os.Stderr, "moat: kubernetes watchdog: deleting NetworkPolicy %s/%s: %v\n", s.ns, s.name, err)
		code = 1
	}
	return code
}
