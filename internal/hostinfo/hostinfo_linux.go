package hostinfo

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// LandlockABI returns the Landlock ABI version the kernel offers
// (landlock_create_ruleset with LANDLOCK_CREATE_RULESET_VERSION).
func LandlockABI() (int, error) {
	r, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_VERSION)
	switch {
	case errno == 0:
		return int(r), nil
	case errno == unix.ENOSYS:
		return 0, &Error{Feature: "landlock", Reason: "the kernel has no Landlock (ENOSYS)",
			Hint: "use Linux 5.13 or newer built with CONFIG_SECURITY_LANDLOCK=y; moat's native backend needs ABI 6 (Linux 6.12)", Err: errno}
	case errno == unix.EOPNOTSUPP:
		return 0, &Error{Feature: "landlock", Reason: "Landlock is built in but disabled (EOPNOTSUPP)",
			Hint: "add landlock to the lsm= kernel boot parameter", Err: errno}
	}
	return 0, &Error{Feature: "landlock", Reason: fmt.Sprintf("landlock_create_ruleset: %v", errno), Err: errno}
}

// sandboxNamespaces are the namespaces moat's native backend creates.
const sandboxNamespaces = unix.CLONE_NEWUSER | unix.CLONE_NEWNS | unix.CLONE_NEWPID |
	unix.CLONE_NEWNET | unix.CLONE_NEWIPC | unix.CLONE_NEWUTS

// UserNamespaces reports whether this process can start a child in a new
// user namespace (with new mount, PID, network, IPC and UTS namespaces, as
// the native backend does), mapped to its own uid and gid. It runs
// /bin/true there.
func UserNamespaces() error {
	trueBin, err := findTool("true")
	if err != nil {
		return &Error{Feature: "user namespaces", Reason: "cannot test: " + err.Error(), Err: err}
	}
	try := func(flags uintptr) error {
		ctx, cancel := context.WithTimeout(context.Background(), ToolTimeout)
		defer cancel()
		cmd := exec.CommandContext(ctx, trueBin)
		cmd.Env = []string{}
		cmd.SysProcAttr = &syscall.SysProcAttr{
			Cloneflags:                 flags,
			UidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Geteuid(), Size: 1}},
			GidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getegid(), Size: 1}},
			GidMappingsEnableSetgroups: false,
		}
		return cmd.Run()
	}
	err = try(sandboxNamespaces)
	if err == nil {
		return nil
	}
	what := "a user namespace with mount, PID, network, IPC and UTS namespaces"
	if try(unix.CLONE_NEWUSER) == nil {
		what = "mount, PID, network, IPC or UTS namespaces inside a new user namespace"
	}
	return &Error{Feature: "user namespaces", Reason: fmt.Sprintf("cannot create %s: %v", what, err), Hint: userNSHint(), Err: err}
}

// userNSHint names the host setting that blocks user namespaces, if one does.
func userNSHint() string {
	read := func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil {
			return ""
		}
		return strings.TrimSpace(string(b))
	}
	switch {
	case read("/proc/sys/user/max_user_namespaces") == "0":
		return "user.max_user_namespaces is 0: sysctl -w user.max_user_namespaces=15000"
	case read("/proc/sys/kernel/unprivileged_userns_clone") == "0":
		return "kernel.unprivileged_userns_clone is 0: sysctl -w kernel.unprivileged_userns_clone=1"
	case read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == "1":
		return "AppArmor restricts unprivileged user namespaces: sysctl -w kernel.apparmor_restrict_unprivileged_userns=0, or give moat an AppArmor profile with userns"
	}
	return "check that the kernel has CONFIG_USER_NS and that no container runtime or LSM forbids unshare(CLONE_NEWUSER)"
}

// Seccomp reports whether seccomp filters are available with the actions
// moat's filter uses (errno, kill-process, allow).
func Seccomp() error {
	if _, err := unix.PrctlRetInt(unix.PR_GET_SECCOMP, 0, 0, 0, 0); err != nil {
		return &Error{Feature: "seccomp", Reason: fmt.Sprintf("prctl(PR_GET_SECCOMP): %v", err),
			Hint: "use a kernel built with CONFIG_SECCOMP and CONFIG_SECCOMP_FILTER", Err: err}
	}
	for _, a := range []struct {
		name   string
		action uint32
	}{
		{"SECCOMP_RET_KILL_PROCESS", unix.SECCOMP_RET_KILL_PROCESS},
		{"SECCOMP_RET_ERRNO", unix.SECCOMP_RET_ERRNO},
		{"SECCOMP_RET_ALLOW", unix.SECCOMP_RET_ALLOW},
	} {
		action := a.action
		_, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_GET_ACTION_AVAIL, 0, uintptr(unsafe.Pointer(&action)))
		if errno != 0 {
			return &Error{Feature: "seccomp", Reason: fmt.Sprintf("filter action %s is not available: %v", a.name, errno),
				Hint: "use Linux 4.14 or newer with CONFIG_SECCOMP_FILTER", Err: errno}
		}
	}
	return nil
}

// Kernel returns the kernel release (uname -r), or "" if unknown.
func Kernel() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

// Arch returns the machine hardware name (uname -m, e.g. x86_64, aarch64).
func Arch() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Machine[:])
}
