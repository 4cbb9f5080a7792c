package kubernetes

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/boundary/seccomp"
)

// filterOptions are the Options of the seccomp filter the stage installs
// in front of every process (the Pod's RuntimeDefault profile is the
// runtime's, and under gVisor it is not applied to exec'd processes at
// all). AF_UNIX stays allowed: the Pod's network namespace is its own.
// IPv6 sockets are refused (IPv4Only): the Pod's interface has an IPv6
// link-local address that reaches the node's services bound to [::] and
// the Pods on its bridge, past a NetworkPolicy that the network plugin
// enforces for IPv4 only (kube-router in a single-stack cluster), and the
// broker is reached over IPv4 (Prepare refuses an IPv6 broker address).
var filterOptions = seccomp.Options{AllowUnixSockets: true, IPv4Only: true}

// SeccompOptions are the Options of the filter that every process of a
// sandbox runs behind (seccomp.Filtered).
func (*backend) SeccompOptions() seccomp.Options { return filterOptions }

// procDir is where the stage records the pid of each process it starts,
// so that SignalMain can find it: in the Pod's private /tmp.
const procDir = "/tmp/.moat-procs"

// StageMain runs inside the Pod in front of every process moat starts
// there (the exec API gives a command and nothing else): it sets the
// environment and working directory from its one argument (a
// stageConfig), records its pid, installs moat's seccomp filter and
// executes the command on the same thread. Exit 127 when the command is
// not found, 126 when it cannot be executed, 125 when it cannot be
// confined.
func StageMain(args []string) int {
	if len(args) != 1 {
		fmt.Fprintln(os.Stderr, "moat: kubernetes stage: want one argument, the stage configuration")
		return boundary.ExitRefused
	}
	cfg, err := decodeStageConfig(args[0])
	if err != nil {
		fmt.Fprintf(os.Stderr, "moat: kubernetes stage: %v\n", err)
		return boundary.ExitRefused
	}
	if err := os.MkdirAll(procDir, 0o700); err == nil {
		os.WriteFile(filepath.Join(procDir, cfg.ID), []byte(strconv.Itoa(os.Getpid())), 0o600)
	}
	if err := os.Chdir(cfg.Dir); err != nil {
		fmt.Fprintf(os.Stderr, "moat: refused: working directory %s: %v\n", cfg.Dir, err)
		return boundary.ExitRefused
	}
	os.Clearenv()
	for _, kv := range cfg.Env {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			os.Setenv(k, v)
		}
	}
	runtime.LockOSThread()
	prog, err := seccomp.Build(filterOptions)
	if err == nil {
		err = seccomp.Install(prog)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "moat: refused: cannot install the seccomp filter in the Pod: %v\n", err)
		return boundary.ExitRefused
	}
	path := cfg.Argv[0]
	if !strings.Contains(path, "/") {
		p, err := exec.LookPath(path)
		if err != nil {
			fmt.Fprintf(os.Stderr, "moat: %s: command not found\n", path)
			return boundary.ExitNotFound
		}
		path = p
	}
	err = unix.Exec(path, cfg.Argv, cfg.Env)
	fmt.Fprintf(os.Stderr, "moat: cannot execute %s: %v\n", cfg.Argv[0], err)
	if errors.Is(err, unix.ENOENT) {
		return boundary.ExitNotFound
	}
	return boundary.ExitCannotExec
}

// SignalMain delivers a signal to a process a stage started: `moat
// __moat-k8s-signal ID SIGNUM`.
func SignalMain(args []string) int {
	if len(args) != 2 || !validID(args[0]) {
		fmt.Fprintln(os.Stderr, "moat: kubernetes signal: usage: ID SIGNUM")
		return boundary.ExitRefused
	}
	sig, err := strconv.Atoi(args[1])
	if err != nil || sig <= 0 || sig > 64 {
		fmt.Fprintf(os.Stderr, "moat: kubernetes signal: bad signal %q\n", args[1])
		return boundary.ExitRefused
	}
	b, err := os.ReadFile(filepath.Join(procDir, args[0]))
	if err != nil {
		fmt.Fprintf(os.Stderr, "moat: kubernetes signal: %v\n", err)
		return 1
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		fmt.Fprintf(os.Stderr, "moat: kubernetes signal: bad pid %q\n", b)
		return 1
	}
	if err := syscall.Kill(pid, syscall.Signal(sig)); err != nil && !errors.Is(err, syscall.ESRCH) {
		fmt.Fprintf(os.Stderr, "moat: kubernetes signal: %v\n", err)
		return 1
	}
	return 0
}

// PauseMain is the container's main process: it waits for the end of
// the Pod and does nothing else.
func PauseMain(args []string) int {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGTERM, syscall.SIGINT)
	<-c
	return 0
}
