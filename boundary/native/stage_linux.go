package native

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/boundary/internal/initkit"
	"github.com/moat-sandbox/moat/boundary/seccomp"
)

// stageConfig tells a stage what to run and under which rules.
type stageConfig struct {
	Argv      []string  `json:"argv"`
	Env       []string  `json:"env"`
	Dir       string    `json:"dir"`
	Helper    bool      `json:"helper"`
	TTY       bool      `json:"tty,omitempty"` // a spare makes fd 0 its controlling terminal
	Landlock  llRuleset `json:"landlock"`
	OpenFiles uint64    `json:"open_files"`
	Seccomp   bool      `json:"seccomp"`
}

// stageReport is what a stage writes on its error pipe when it cannot
// exec the target. Code is 126 (cannot execute), 127 (not found) or 125.
type stageReport struct {
	Code int    `json:"code"`
	Err  string `json:"err"`
}

// capLastCapMax bounds the capability numbers the stage drops from its
// bounding set when /proc/sys/kernel/cap_last_cap cannot be read.
const capLastCapMax = 63

// StageMain runs in a fresh user namespace (uid/gid from the policy, mapped
// to the init's root) with CAP_SETPCAP and CAP_SYS_RESOURCE as ambient
// capabilities. It confines its own thread and execs the target from it.
func StageMain(args []string) int {
	runtime.LockOSThread() // never unlocked: Landlock and seccomp are per thread
	nrules := 0
	if len(args) >= 1 {
		nrules, _ = strconv.Atoi(args[0])
	}
	isSpare := len(args) == 2 && args[1] == spareArg
	initkit.CloseInherited(stageRuleFD + max(nrules, 0)) // not the runtime's own fds
	report := func(code int, err error) int {
		b, _ := json.Marshal(stageReport{Code: code, Err: err.Error()})
		unix.Write(stageErrFD, b)
		return code
	}
	var cfg stageConfig
	if isSpare {
		if err := awaitConfig(&cfg); err != nil {
			return report(boundary.ExitRefused, fmt.Errorf("stage config: %w", err))
		}
	} else if err := readConfig(stageConfigFD, &cfg); err != nil {
		return report(boundary.ExitRefused, fmt.Errorf("stage config: %w", err))
	}
	if len(cfg.Argv) == 0 {
		return report(boundary.ExitRefused, errors.New("no command"))
	}
	if err := confine(&cfg); err != nil {
		return report(boundary.ExitRefused, err)
	}
	// The working directory first, so that a relative command path
	// resolves against it, as in a shell.
	if cfg.Dir != "" {
		if err := unix.Chdir(cfg.Dir); err != nil {
			return report(boundary.ExitRefused, fmt.Errorf("moat: working directory %q: %w", cfg.Dir, err))
		}
	}
	path, code, err := resolve(&cfg)
	if err != nil {
		return report(code, err)
	}
	if cfg.Seccomp {
		prog, err := seccomp.Build(filterOptions(cfg.Landlock.ABI))
		if err != nil {
			return report(boundary.ExitRefused, fmt.Errorf("seccomp filter: %w", err))
		}
		if err := seccomp.Install(prog); err != nil {
			return report(boundary.ExitRefused, fmt.Errorf("seccomp filter: %w", err))
		}
	}
	err = syscall.Exec(path, cfg.Argv, cfg.Env)
	return report(execCode(err), fmt.Errorf("moat: cannot execute %q: %w", cfg.Argv[0], err))
}

// spareConn is a spare's end of its socketpair (fd stageErrFD), kept
// reachable until the exec closes it.
var spareConn *initkit.Conn

// awaitConfig is a spare's wait: one message on stageErrFD, its config
// with its three stdio fds, which go on 0-2.
func awaitConfig(cfg *stageConfig) error {
	c, err := initkit.NewConn(stageErrFD)
	if err != nil {
		return err
	}
	spareConn = c
	warmConfigDecode() // an error here is the real decode's to report
	files, err := c.Recv(cfg)
	if err != nil {
		return err
	}
	defer initkit.CloseFiles(files)
	if len(files) != 3 {
		return fmt.Errorf("BUG: %d stdio fds", len(files))
	}
	for i, f := range files {
		if err := unix.Dup3(int(f.Fd()), i, 0); err != nil {
			return fmt.Errorf("stdio fd %d: %w", i, err)
		}
	}
	if cfg.TTY {
		// As the fresh stage's Setctty: fd 0 becomes this session's
		// controlling terminal.
		if err := unix.IoctlSetInt(0, unix.TIOCSCTTY, 1); err != nil {
			return fmt.Errorf("controlling terminal: %w", err)
		}
	}
	return nil
}

// warmConfigDecode decodes a stageConfig of every field's kind once, so
// that the JSON decoder's set-up for its types (about 0.13 ms in a fresh
// process, the first decode of a type builds its decoder) happens while
// the spare waits rather than after its start arrives.
func warmConfigDecode() error {
	b, err := json.Marshal(stageConfig{Argv: []string{"x"}, Env: []string{"x"}, Dir: "/", Helper: true, TTY: true,
		Landlock: llRuleset{Rules: []llRule{{Path: "/"}}, HelperRules: []llRule{{Path: "/"}}}, OpenFiles: 1, Seccomp: true})
	if err != nil {
		return err
	}
	var cfg stageConfig
	return initkit.Decode(b, &cfg)
}

func execCode(err error) int {
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
		return boundary.ExitNotFound
	}
	return boundary.ExitCannotExec
}

// confine applies every restriction but seccomp to the calling thread:
// limits, user-namespace cap, capabilities, fds, no_new_privs, Landlock.
func confine(cfg *stageConfig) error {
	if err := unix.Setrlimit(unix.RLIMIT_CORE, &unix.Rlimit{}); err != nil {
		return fmt.Errorf("RLIMIT_CORE: %w", err)
	}
	if cfg.OpenFiles > 0 {
		var cur unix.Rlimit
		if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &cur); err != nil {
			return fmt.Errorf("RLIMIT_NOFILE: %w", err)
		}
		n := min(cfg.OpenFiles, cur.Max)
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: n, Max: n}); err != nil {
			return fmt.Errorf("RLIMIT_NOFILE %d: %w", n, err)
		}
	}
	// A second wall besides seccomp: this user namespace may have no
	// children at all.
	if err := os.WriteFile("/proc/sys/user/max_user_namespaces", []byte("0\n"), 0); err != nil {
		return fmt.Errorf("capping user namespaces: %w", err)
	}
	if err := dropCaps(); err != nil {
		return err
	}
	// Every fd but stdio, the error pipe and (for helpers) the moat binary
	// is closed; those two close on exec.
	keep := []int{stageErrFD}
	if cfg.Helper {
		keep = append(keep, stageExeFD)
	}
	if err := closeFrom(3, keep); err != nil {
		return err
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	if err := restrictSelf(cfg.Landlock); err != nil {
		return fmt.Errorf("landlock: %w", err)
	}
	return nil
}

// dropCaps empties all five capability sets and locks the securebits, so
// that nothing can bring capabilities back.
func dropCaps() error {
	last := capLastCapMax
	if b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap"); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n >= 0 && n <= capLastCapMax {
			last = n
		}
	}
	for c := 0; c <= last; c++ {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && err != unix.EINVAL {
			return fmt.Errorf("dropping capability %d from the bounding set: %w", c, err)
		}
	}
	// SECBIT_NOROOT, SECBIT_NO_SETUID_FIXUP and SECBIT_NO_CAP_AMBIENT_RAISE,
	// each with its lock bit, plus SECBIT_KEEP_CAPS_LOCKED (KEEP_CAPS off).
	const secbits = 1<<0 | 1<<1 | 1<<2 | 1<<3 | 1<<5 | 1<<6 | 1<<7
	if err := unix.Prctl(unix.PR_SET_SECUREBITS, secbits, 0, 0, 0); err != nil {
		return fmt.Errorf("securebits: %w", err)
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("clearing ambient capabilities: %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("clearing capabilities: %w", err)
	}
	return nil
}

// closeFrom closes every fd >= from except keep, which become close-on-exec.
func closeFrom(from int, keep []int) error {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return fmt.Errorf("listing fds: %w", err)
	}
	var fds []int
	for _, e := range ents {
		if n, err := strconv.Atoi(e.Name()); err == nil && n >= from {
			fds = append(fds, n)
		}
	}
	for _, fd := range fds {
		kept := false
		for _, k := range keep {
			kept = kept || k == fd
		}
		if kept {
			if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC); err != nil {
				return fmt.Errorf("fd %d: %w", fd, err)
			}
			continue
		}
		// Go runtime fds (epoll, the pipe for ReadDir above) are already
		// close-on-exec; marking is enough and does not pull them away
		// from under the runtime.
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC); err != nil && err != unix.EBADF {
			return fmt.Errorf("fd %d: %w", fd, err)
		}
	}
	return nil
}

// resolve finds the program to exec: the moat binary for helpers, else
// argv[0], looked up in the target environment's PATH when it has no
// slash. Not found is 127, not executable 126.
func resolve(cfg *stageConfig) (string, int, error) {
	if cfg.Helper {
		return "/proc/self/fd/" + strconv.Itoa(stageExeFD), 0, nil
	}
	name := cfg.Argv[0]
	if strings.Contains(name, "/") {
		if err := checkExec(name); err != nil {
			return "", execCode(err), fmt.Errorf("moat: cannot execute %q: %w", name, err)
		}
		return name, 0, nil
	}
	pathEnv := ""
	for _, kv := range cfg.Env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			pathEnv = v
		}
	}
	var firstErr error
	for _, dir := range filepath.SplitList(pathEnv) {
		if dir == "" || !filepath.IsAbs(dir) {
			continue
		}
		p := filepath.Join(dir, name)
		err := checkExec(p)
		if err == nil {
			return p, 0, nil
		}
		if firstErr == nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ENOTDIR) {
			firstErr = err
		}
	}
	if firstErr != nil {
		return "", boundary.ExitCannotExec, fmt.Errorf("moat: cannot execute %q: %w", name, firstErr)
	}
	return "", boundary.ExitNotFound, fmt.Errorf("moat: command %q not found in the sandbox (PATH=%s)", name, pathEnv)
}

func checkExec(p string) error {
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return unix.EISDIR
	}
	return unix.Access(p, unix.X_OK)
}
