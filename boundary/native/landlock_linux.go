package native

import (
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/hostinfo"
)

// Raw Landlock syscalls. go-landlock applies a ruleset to every thread
// through AllThreadsSyscall, which refuses to run when cgo is linked (as in
// `go test -race` binaries); the stage restricts only its own locked thread
// and then execs from it, so the raw calls below are all it needs.

// Access rights and flags (include/uapi/linux/landlock.h), from
// golang.org/x/sys/unix.
const (
	llFSExecute   = unix.LANDLOCK_ACCESS_FS_EXECUTE
	llFSWriteFile = unix.LANDLOCK_ACCESS_FS_WRITE_FILE
	llFSReadFile  = unix.LANDLOCK_ACCESS_FS_READ_FILE
	llFSReadDir   = unix.LANDLOCK_ACCESS_FS_READ_DIR
	llFSRefer     = unix.LANDLOCK_ACCESS_FS_REFER     // ABI 2
	llFSTruncate  = unix.LANDLOCK_ACCESS_FS_TRUNCATE  // ABI 3
	llFSIoctlDev  = unix.LANDLOCK_ACCESS_FS_IOCTL_DEV // ABI 5
	llFSMakeSym   = unix.LANDLOCK_ACCESS_FS_MAKE_SYM  // the last right of ABI 1
	// llFSResolveUnix (ABI 9) governs connect/sendmsg to pathname Unix
	// sockets created outside the domain. It is handled and never granted:
	// from ABI 9 the seccomp filter lets AF_UNIX sockets through, and this
	// is what keeps a host socket placed in a grant unreachable.
	llFSResolveUnix = unix.LANDLOCK_ACCESS_FS_RESOLVE_UNIX

	llNetBindTCP    = unix.LANDLOCK_ACCESS_NET_BIND_TCP    // ABI 4
	llNetConnectTCP = unix.LANDLOCK_ACCESS_NET_CONNECT_TCP // ABI 4

	llScopeAbstractUnix = unix.LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET // ABI 6
	llScopeSignal       = unix.LANDLOCK_SCOPE_SIGNAL               // ABI 6

	llRulePathBeneath = unix.LANDLOCK_RULE_PATH_BENEATH
	// llRuleNetPort is LANDLOCK_RULE_NET_PORT, which x/sys/unix does not
	// define (it has no struct landlock_net_port_attr either).
	llRuleNetPort = 2

	// llFileRights are the rights that may be granted on a rule whose
	// target is not a directory.
	llFileRights = llFSExecute | llFSWriteFile | llFSReadFile | llFSTruncate | llFSIoctlDev
)

// ABIError says that the host's Landlock ABI is below the policy's floor.
// moat refuses before anything runs.
type ABIError struct {
	Found int // 0 when Landlock is absent or disabled
	Floor int
}

func (e *ABIError) Error() string {
	if e.Found == 0 {
		return fmt.Sprintf("Landlock is not available on this kernel (landlock.abi_floor is %d); enable Landlock (lsm=landlock) or use another backend", e.Floor)
	}
	return fmt.Sprintf("host Landlock ABI is %d, below landlock.abi_floor %d; lower landlock.abi_floor in the policy or run on a newer kernel", e.Found, e.Floor)
}

// LandlockABI returns the host's Landlock ABI version, or 0 when Landlock
// is not available (internal/hostinfo says why).
func LandlockABI() int {
	abi, _ := hostinfo.LandlockABI()
	return abi
}

// llFSAll is every filesystem right the given ABI knows that a rule may
// grant (all but llFSResolveUnix).
func llFSAll(abi int) uint64 {
	r := uint64(llFSMakeSym<<1 - 1) // ABI 1: execute … make_sym
	if abi >= 2 {
		r |= llFSRefer
	}
	if abi >= 3 {
		r |= llFSTruncate
	}
	if abi >= 5 {
		r |= llFSIoctlDev
	}
	return r
}

// llRule is one path-beneath rule. A grant's rule names the grant's
// index in the plan (Grant, 1-based): the stage uses the descriptor of
// the tree the init attached, never the path again. Other rules (/tmp,
// /proc, /dev nodes: made by the init itself) are opened by Path.
type llRule struct {
	Path   string `json:"path"`
	Grant  int    `json:"grant,omitempty"`
	Access uint64 `json:"access"`
}

// llRuleset is what the stage applies: filesystem rules, the one TCP port
// that may be connected to, and the scopes.
type llRuleset struct {
	ABI         int      `json:"abi"`
	Rules       []llRule `json:"rules"`
	ConnectPort int      `json:"connect_port"`
	// EgressPort, when > 0, is the broker's egress port, which may be
	// connected to as well.
	EgressPort int `json:"egress_port,omitempty"`
	// ExecFD, when >= 0, is an open fd of the moat binary that gets
	// execute+read (StartHelper only).
	ExecFD int `json:"exec_fd"`
	// HelperRules are added for moat's own helpers only (StartHelper):
	// the runtime files of a dynamically linked moat.
	HelperRules []llRule `json:"helper_rules,omitempty"`
}

type llRulesetAttr struct {
	fs, net, scoped uint64
}

type llNetPortAttr struct {
	access, port uint64
}

// restrictSelf applies rs to the calling thread. The caller must have
// locked the OS thread and set no_new_privs.
func restrictSelf(rs llRuleset) error {
	if rs.ABI < 1 {
		return errors.New("BUG: Landlock ruleset without an ABI")
	}
	attr := llRulesetAttr{fs: llFSAll(rs.ABI)}
	if rs.ABI >= 9 {
		attr.fs |= llFSResolveUnix
	}
	if rs.ABI >= 4 {
		attr.net = llNetBindTCP | llNetConnectTCP
	}
	if rs.ABI >= 6 {
		attr.scoped = llScopeAbstractUnix | llScopeSignal
	}
	fd, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr), 0)
	if errno != 0 {
		return fmt.Errorf("landlock_create_ruleset (ABI %d): %w", rs.ABI, errno)
	}
	rfd := int(fd)
	defer unix.Close(rfd)
	for _, r := range rs.Rules {
		var pfd int
		var err error
		if r.Grant > 0 {
			pfd, err = unix.FcntlInt(uintptr(stageRuleFD+r.Grant-1), unix.F_DUPFD_CLOEXEC, 0)
		} else {
			pfd, err = unix.Open(r.Path, unix.O_PATH|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
		}
		if err != nil {
			return fmt.Errorf("landlock rule %s: %w", r.Path, err)
		}
		err = addPathRule(rfd, pfd, r.Access&attr.fs&^llFSResolveUnix)
		unix.Close(pfd)
		if err != nil {
			return fmt.Errorf("landlock rule %s: %w", r.Path, err)
		}
	}
	if rs.ExecFD >= 0 {
		if err := addPathRule(rfd, rs.ExecFD, llFSExecute|llFSReadFile); err != nil {
			return fmt.Errorf("landlock rule for the moat binary: %w", err)
		}
	}
	for _, port := range []int{rs.ConnectPort, rs.EgressPort} {
		if rs.ABI < 4 || port <= 0 {
			continue
		}
		np := llNetPortAttr{access: llNetConnectTCP, port: uint64(port)}
		if _, _, errno := unix.Syscall6(unix.SYS_LANDLOCK_ADD_RULE, uintptr(rfd), llRuleNetPort, uintptr(unsafe.Pointer(&np)), 0, 0, 0); errno != 0 {
			return fmt.Errorf("landlock net rule for port %d: %w", port, errno)
		}
	}
	if _, _, errno := unix.Syscall(unix.SYS_LANDLOCK_RESTRICT_SELF, uintptr(rfd), 0, 0); errno != 0 {
		return fmt.Errorf("landlock_restrict_self: %w", errno)
	}
	return nil
}

func addPathRule(rfd, pfd int, access uint64) error {
	var st unix.Stat_t
	if err := unix.Fstat(pfd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		access &= llFileRights
	}
	// struct landlock_path_beneath_attr is packed: u64 allowed_access, s32 parent_fd.
	var b [12]byte
	*(*uint64)(unsafe.Pointer(&b[0])) = access
	*(*int32)(unsafe.Pointer(&b[8])) = int32(pfd)
	if _, _, errno := unix.Syscall6(unix.SYS_LANDLOCK_ADD_RULE, uintptr(rfd), llRulePathBeneath, uintptr(unsafe.Pointer(&b[0])), 0, 0, 0); errno != 0 {
		return errno
	}
	return nil
}
