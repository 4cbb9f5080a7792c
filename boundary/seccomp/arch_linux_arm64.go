package seccomp

import "golang.org/x/sys/unix"

const (
	archName      = "aarch64"
	auditArch     = unix.AUDIT_ARCH_AARCH64
	killX32       = false
	x32SyscallBit = 0
)

// archRules are the arm64-only denials (none).
var archRules []struct {
	name string
	nr   uint32
	why  string
}

// archModeCalls: arm64 has no open, creat, chmod, mkdir or mknod, only the
// *at forms, which syscallRules checks on both architectures.
var archModeCalls []modeCall
