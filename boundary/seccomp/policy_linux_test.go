//go:build amd64 || arm64

package seccomp

import (
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// Policy describes the filter of the Options it is given: AF_UNIX sockets
// are refused with the zero Options and allowed with AllowUnixSockets, in
// the words --explain prints and in the compiled program alike.
func TestPolicyFollowsOptions(t *testing.T) {
	unixRule := func(opts Options) Rule {
		t.Helper()
		i := slices.IndexFunc(Policy(opts), func(r Rule) bool { return r.Syscall == "socket" && r.When == "domain is AF_UNIX" })
		if i < 0 {
			t.Fatalf("Policy(%+v) has no rule for AF_UNIX sockets", opts)
		}
		return Policy(opts)[i]
	}
	for _, tc := range []struct {
		opts Options
		want Action
		ret  uint32
	}{
		{Options{}, ActionErrno, unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)},
		{Options{AllowUnixSockets: true}, ActionAllow, unix.SECCOMP_RET_ALLOW},
	} {
		if got := unixRule(tc.opts).Action; got != tc.want {
			t.Errorf("Policy(%+v): AF_UNIX socket rule is %v, want %v", tc.opts, got, tc.want)
		}
		if got := runVM(t, newVM(t, tc.opts), call(unix.SYS_SOCKET, unix.AF_UNIX, unix.SOCK_STREAM, 0)); got != tc.ret {
			t.Errorf("Build(%+v): socket(AF_UNIX) returns %#x, want %#x", tc.opts, got, tc.ret)
		}
	}
}
