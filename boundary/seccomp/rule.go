package seccomp

import (
	"errors"
	"fmt"
	"runtime"
	"syscall"
)

// Options select the variable parts of the filter. The zero value is the
// strictest filter.
type Options struct {
	// AllowUnixSockets permits socket(AF_UNIX, …) and socketpair(AF_UNIX,
	// …) of every type. Set it only from Landlock ABI 9 on, where
	// Landlock's Unix-socket rules stop a connection to a pathname socket
	// that a host process placed inside a writable grant. Below that,
	// socket(AF_UNIX, …) is EPERM and socketpair(AF_UNIX, …) is allowed
	// only for SOCK_STREAM and SOCK_SEQPACKET, whose connected pairs
	// cannot reach a pathname socket.
	AllowUnixSockets bool
	// IPv4Only makes socket(AF_INET6, …) EPERM. The kubernetes backend
	// sets it: a Pod's interface has an IPv6 link-local address, and a
	// NetworkPolicy enforced for IPv4 alone (kube-router in a single-stack
	// cluster programs no IPv6 rules) leaves it reaching the node's
	// services bound to [::] and every Pod on the same bridge.
	IPv4Only bool
}

// Filtered is implemented by a backend whose processes all run behind this
// package's filter: SeccompOptions says which Options it builds the filter
// with on this host. `moat run --explain` and `moat policy check --explain`
// print Policy(SeccompOptions()).
type Filtered interface {
	SeccompOptions() Options
}

// Action is what the filter does with a syscall. The zero value is the
// strictest action.
type Action uint8

const (
	ActionKillProcess Action = iota // SECCOMP_RET_KILL_PROCESS
	ActionErrno                     // SECCOMP_RET_ERRNO with Rule.Errno
	ActionAllow                     // SECCOMP_RET_ALLOW
)

func (a Action) String() string {
	switch a {
	case ActionKillProcess:
		return "kill-process"
	case ActionErrno:
		return "errno"
	case ActionAllow:
		return "allow"
	}
	return fmt.Sprintf("Action(%d)", uint8(a))
}

// Rule is one line of the filter's policy, for documentation and
// `moat run --explain`. Lines for the same syscall are tried in order; the
// first whose When holds decides.
type Rule struct {
	Syscall string        // kernel name, e.g. "socket"; "*" for a check on every syscall
	When    string        // the argument condition in words; "" means always
	Action  Action        //
	Errno   syscall.Errno // returned when Action is ActionErrno
	Why     string        // the reason, for people
}

func (r Rule) String() string {
	act := r.Action.String()
	if r.Action == ActionErrno {
		act = errnoName(r.Errno)
	}
	when := ""
	if r.When != "" {
		when = " when " + r.When
	}
	return fmt.Sprintf("%s: %s%s (%s)", r.Syscall, act, when, r.Why)
}

func errnoName(e syscall.Errno) string {
	switch e {
	case syscall.EPERM:
		return "EPERM"
	case syscall.ENOSYS:
		return "ENOSYS"
	}
	return fmt.Sprintf("errno %d", int(e))
}

// UnsupportedError reports that this system cannot build or install the
// filter. errors.Is(err, errors.ErrUnsupported) holds for it.
type UnsupportedError struct {
	GOOS, GOARCH string
	Reason       string
}

func (e *UnsupportedError) Error() string {
	return fmt.Sprintf("moat: seccomp filter unsupported on %s/%s: %s", e.GOOS, e.GOARCH, e.Reason)
}

// Is makes errors.Is(err, errors.ErrUnsupported) true.
func (e *UnsupportedError) Is(target error) bool { return target == errors.ErrUnsupported }

func unsupported(reason string) *UnsupportedError {
	return &UnsupportedError{GOOS: runtime.GOOS, GOARCH: runtime.GOARCH, Reason: reason}
}
