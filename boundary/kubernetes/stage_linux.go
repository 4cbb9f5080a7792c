package kubernetes

import (
	"errors"
	"fmt"
	"io"
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
	"github.com/moat-sandbox/moat/internal/fsutil"
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
// so that SignalMain can find it, and saves a terminal exec's
// configuration: in the Pod's private /tmp (the tests' TestMain sets
// another).
var procDir = "/tmp/.moat-procs"

// StageMain runs inside the Pod in front of every process moat starts
// there (the exec API gives a command and nothing else): it reads its
// configuration (a stageConfig) from the frame at the head of its stdin
// and not a byte past it, sets the environment and working directory,
// records its pid, installs moat's seccomp filter and executes the
// command on the same thread, which has the rest of stdin (or /dev/null
// when moat had none to give). With `save` it only saves the frame for a
// terminal exec; with `load ID SHA256` it runs the frame saved for ID
// (its stdin is the terminal). Exit 127 when the command is not found,
// 126 when it cannot be executed, 125 when it cannot be confined or its
// configuration is refused.
func StageMain(args []string) int {
	var (
		cfg stageConfig
		err error
	)
	switch {
	case len(args) == 0:
		cfg, _, err = readStageFrame(fdReader(0))
	case len(args) == 1 && args[0] == stageSave:
		err = saveStage(procDir, fdReader(0))
		if err == nil {
			return 0
		}
	case len(args) == 3 && args[0] == stageLoad:
		cfg, err = loadStageConfig(procDir, args[1], args[2])
	default:
		err = errors.New("unexpected arguments: the configuration comes on stdin, never in the command (is the image's moat another version than the host's?)")
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "moat: kubernetes stage: %v\n", err)
		return boundary.ExitRefused
	}
	if !cfg.Stdin {
		if err := devNullStdin(); err != nil {
			fmt.Fprintf(os.Stderr, "moat: refused: stdin from /dev/null: %v\n", err)
			return boundary.ExitRefused
		}
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

// saveStage reads one frame from r, which must end after it, and saves
// it in dir under its id (replacing, not following, what is there).
func saveStage(dir string, r io.Reader) error {
	cfg, frame, err := readStageFrame(r)
	if err != nil {
		return err
	}
	if cfg.Nonce == "" {
		return errors.New("a configuration to save has no nonce")
	}
	var b [1]byte
	if n, err := r.Read(b[:]); n != 0 || err != io.EOF {
		return errors.New("stdin goes on after the configuration to save")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return fsutil.WriteFileAtomic(filepath.Join(dir, stageFileName(cfg.ID)), frame, 0o600)
}

// fdReader reads a descriptor with read(2) and nothing in between (no
// buffer, no poller): what the stage does not read stays for the
// command it executes.
type fdReader int

func (fd fdReader) Read(b []byte) (int, error) {
	for {
		n, err := unix.Read(int(fd), b)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			// A non-blocking stdin: wait for it, and leave its flags
			// as the runtime set them for the command.
			if _, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, -1); err != nil && err != unix.EINTR {
				return 0, err
			}
			continue
		case err != nil:
			return 0, err
		case n == 0 && len(b) > 0:
			return 0, io.EOF
		}
		return n, nil
	}
}

// devNullStdin makes /dev/null the descriptor 0 that the command
// inherits.
func devNullStdin() error {
	fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Dup3(fd, 0, 0)
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
