package measure

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// childTimeout bounds each child the privilege probes start.
const childTimeout = 10 * time.Second

// maxCap is past every capability number Linux defines; probing stops at
// the first EINVAL.
const maxCap = 64

func probeNoNewPrivs() (string, string) {
	v, err := unix.PrctlRetInt(unix.PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0)
	if err != nil {
		return OutcomeError, "prctl(PR_GET_NO_NEW_PRIVS): " + err.Error()
	}
	if v == 1 {
		return OutcomeFailed, "no_new_privs = 1"
	}
	return OutcomeSucceeded, fmt.Sprintf("no_new_privs = %d", v)
}

// capSets reads the effective, permitted and inheritable sets.
func capSets() (eff, perm, inh uint64, err error) {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var d [2]unix.CapUserData
	if err := unix.Capget(&hdr, &d[0]); err != nil {
		return 0, 0, 0, fmt.Errorf("capget: %w", err)
	}
	join := func(lo, hi uint32) uint64 { return uint64(hi)<<32 | uint64(lo) }
	return join(d[0].Effective, d[1].Effective), join(d[0].Permitted, d[1].Permitted), join(d[0].Inheritable, d[1].Inheritable), nil
}

func probeCaps() (string, string) {
	eff, perm, inh, err := capSets()
	if err != nil {
		return OutcomeError, err.Error()
	}
	d := fmt.Sprintf("effective %#x, permitted %#x, inheritable %#x", eff, perm, inh)
	if eff|perm|inh != 0 {
		return OutcomeSucceeded, d
	}
	return OutcomeFailed, d
}

// capBits probes capabilities 0… with prctl(op, arg, cap) until EINVAL and
// returns the mask of those reported set.
func capBits(op, arg int) (uint64, error) {
	var mask uint64
	for c := 0; c < maxCap; c++ {
		var v int
		var err error
		if op == unix.PR_CAP_AMBIENT {
			v, err = unix.PrctlRetInt(op, uintptr(arg), uintptr(c), 0, 0)
		} else {
			v, err = unix.PrctlRetInt(op, uintptr(c), 0, 0, 0)
		}
		if errors.Is(err, unix.EINVAL) && c > 0 {
			return mask, nil
		}
		if err != nil {
			return 0, err
		}
		if v == 1 {
			mask |= 1 << c
		}
	}
	return mask, nil
}

// unusable reports whether no execve can raise capabilities: with
// no_new_privs, the new permitted set is capped by the old one, and the
// ambient set is a subset of permitted ∩ inheritable.
func unusable() (bool, string) {
	nnp, err := unix.PrctlRetInt(unix.PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0)
	if err != nil {
		return false, "prctl(PR_GET_NO_NEW_PRIVS): " + err.Error()
	}
	_, perm, inh, err := capSets()
	if err != nil {
		return false, err.Error()
	}
	if nnp == 1 && perm == 0 && inh == 0 {
		return true, "no_new_privs = 1 and the permitted and inheritable sets are empty"
	}
	return false, fmt.Sprintf("no_new_privs = %d, permitted %#x, inheritable %#x", nnp, perm, inh)
}

func probeAmbient() (string, string) {
	amb, err := capBits(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_IS_SET)
	if err != nil {
		// The ambient set is a subset of permitted ∩ inheritable.
		if _, perm, inh, cerr := capSets(); cerr == nil && perm&inh == 0 {
			return OutcomeFailed, "prctl(PR_CAP_AMBIENT) unsupported (" + err.Error() + "), but permitted ∩ inheritable is empty, so the ambient set is too"
		}
		return OutcomeError, "prctl(PR_CAP_AMBIENT_IS_SET): " + err.Error()
	}
	if amb != 0 {
		return OutcomeSucceeded, fmt.Sprintf("ambient %#x", amb)
	}
	return OutcomeFailed, "ambient set empty"
}

func probeBounding() (string, string) {
	ok, why := unusable()
	bset, err := capBits(unix.PR_CAPBSET_READ, 0)
	switch {
	case err != nil && ok:
		return OutcomeFailed, "prctl(PR_CAPBSET_READ) unsupported (" + err.Error() + "), but " + why
	case err != nil:
		return OutcomeError, "prctl(PR_CAPBSET_READ): " + err.Error() + "; " + why
	case bset == 0:
		return OutcomeFailed, "bounding set empty"
	case ok:
		return OutcomeFailed, fmt.Sprintf("bounding set %#x, unusable: %s", bset, why)
	}
	return OutcomeSucceeded, fmt.Sprintf("bounding set %#x and %s", bset, why)
}

func probeIDs(what string, get func() (int, int, int)) (string, string) {
	r, e, s := get()
	d := fmt.Sprintf("real %s %d, effective %d, saved %d", what, r, e, s)
	if r == 0 || e == 0 || s == 0 {
		return OutcomeSucceeded, d
	}
	return OutcomeFailed, d
}

// selfCommand runs this binary again as the helper in sub-mode arg.
func selfCommand(path, arg string) *exec.Cmd {
	cmd := exec.Command(path, Helper, arg)
	cmd.Env = []string{}
	if v, ok := os.LookupEnv("GORACE"); ok { // only tests set it
		cmd.Env = append(cmd.Env, "GORACE="+v)
	}
	cmd.Dir = "/"
	cmd.WaitDelay = childTimeout
	return cmd
}

// runChild runs cmd with a time limit and returns its stdout.
func runChild(cmd *exec.Cmd) ([]byte, error) { return startChild(cmd)() }

// startChild starts cmd with a time limit; wait returns its stdout once
// it has exited.
func startChild(cmd *exec.Cmd) (wait func() ([]byte, error)) {
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		return func() ([]byte, error) { return nil, err }
	}
	t := time.AfterFunc(childTimeout, func() { cmd.Process.Kill() })
	return func() ([]byte, error) {
		defer t.Stop()
		if err := cmd.Wait(); err != nil {
			return out.Bytes(), fmt.Errorf("%w (stderr: %q)", err, truncate(errb.String()))
		}
		return out.Bytes(), nil
	}
}

// probeNewUserNS tries to make a user namespace in a child: by unshare
// after fork (a multithreaded Go process cannot unshare one itself), or by
// clone. If the child starts, the namespace was made.
func probeNewUserNS(viaClone bool) (string, string) {
	cmd := selfCommand("/proc/self/exe", argNoop)
	how := "unshare(CLONE_NEWUSER)"
	if viaClone {
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER}
		how = "clone(CLONE_NEWUSER)"
	} else {
		cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWUSER}
	}
	if err := cmd.Start(); err != nil {
		if outOfProcesses(err) {
			return OutcomeError, how + ": " + err.Error() + " (no child could be made: that says nothing of user namespaces)"
		}
		return OutcomeFailed, how + ": " + err.Error()
	}
	cmd.Process.Kill()
	cmd.Wait()
	return OutcomeSucceeded, how + " succeeded: a child ran in a new user namespace"
}

// outOfProcesses reports whether starting a child failed for want of a
// process (pids.max, RLIMIT_NPROC: EAGAIN) or of memory, not because the
// sandbox refused what the child was to do: such a failure is no evidence
// that a violation was stopped.
func outOfProcesses(err error) bool {
	return errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.ENOMEM)
}

func probeExecSelf() (string, string) { return startExecSelf()() }

// startExecSelf starts the exec control: fork+exec of this binary, which
// must run and answer.
func startExecSelf() func() (string, string) {
	wait := startChild(selfCommand("/proc/self/exe", argNoop))
	return func() (string, string) { return judgeExecSelf(wait()) }
}

func judgeExecSelf(out []byte, err error) (string, string) {
	if err != nil {
		return OutcomeFailed, "fork+exec of /proc/self/exe: " + err.Error()
	}
	if string(out) != noopMarker {
		return OutcomeFailed, fmt.Sprintf("fork+exec of /proc/self/exe ran, but printed %q", truncate(string(out)))
	}
	return OutcomeSucceeded, "fork+exec of /proc/self/exe ran and answered"
}

// probeSetuid executes path (a setuid copy of this binary) and compares the
// euid it reports with ours.
func probeSetuid(path string) (string, string) {
	st, err := os.Stat(path)
	if err != nil {
		return OutcomeError, "stat: " + err.Error() + " (the setuid probe file is missing)"
	}
	mode := fmt.Sprintf("mode %v", st.Mode())
	out, err := runChild(selfCommand(path, argIDs))
	if err != nil && outOfProcesses(err) {
		return OutcomeError, mode + ", no child could be made (that says nothing of the setuid bit): " + err.Error()
	}
	if err != nil {
		return OutcomeFailed, mode + ", exec failed: " + err.Error()
	}
	f := strings.Fields(string(out))
	if len(f) != 3 {
		return OutcomeError, fmt.Sprintf("%s, ran but printed %q, not \"ruid euid suid\"", mode, truncate(string(out)))
	}
	euid, err := strconv.Atoi(f[1])
	if err != nil {
		return OutcomeError, fmt.Sprintf("%s, bad euid %q", mode, f[1])
	}
	if mine := os.Geteuid(); euid != mine {
		return OutcomeSucceeded, fmt.Sprintf("%s, euid changed from %d to %d", mode, mine, euid)
	}
	return OutcomeFailed, fmt.Sprintf("%s, euid unchanged (%d)", mode, euid)
}
