// Package native is moat's own sandbox backend: Linux namespaces, a
// minimal root, Landlock, seccomp and an empty capability set, with the
// broker's listener made inside the sandbox's loopback-only network.
//
// # Processes
//
// The supervisor (moat) starts the sandbox init by re-executing its own
// binary as the hidden helper __moat-native-init, from an OS thread that stays
// locked for the sandbox's lifetime: Go's Pdeathsig fires when the thread
// that started the child exits, not the process. The init gets new user,
// mount, PID, network, IPC, UTS and cgroup namespaces, uid/gid 0 mapped to
// one host id (rootless: the caller's; as root: process.host_uid, never 0,
// with root's supplementary groups dropped), its JSON configuration on fd
// 3 and a SOCK_SEQPACKET control channel on fd 4. The control channel,
// the locked-thread start, loopback, the broker's listener and the stdio
// pumps are boundary/internal/initkit's, shared with the gVisor backend.
// Nothing else is
// inherited and its environment is empty. It is not dumpable.
//
// The init (pid 1) makes / recursively private, clones every grant with
// open_tree(OPEN_TREE_CLONE|AT_RECURSIVE) and sets its attributes on the
// detached copy (read-only grants rdonly,nosuid,nodev; read-write
// nosuid,nodev), then attaches a small tmpfs at /tmp of its private
// namespace as the new root and moves into it: a private tmpfs /tmp (size
// from the policy), the grants at their host paths, /dev with only null,
// zero, full, random and urandom bind-mounted from the host (a user
// namespace cannot mknod), and a fresh /proc. The skeleton is made
// read-only, pivot_root(".", ".") puts the old root on top, and it is
// detached. Cloning first means a grant below /tmp is not hidden by the
// staging mount, and no staging directory is ever created on the host.
// The init brings lo up, makes the broker's listening socket on
// 127.0.0.1:<ephemeral> and sends it to the supervisor with SCM_RIGHTS.
// It then starts processes on request, reaps every child (orphans
// included) and reports exits. When the control channel closes, it exits,
// and the PID namespace takes every process of the sandbox with it.
//
// Each process (workload, measurement helper) is started by the init as
// the helper __moat-native-stage, exec'd through an fd of the moat binary opened
// before pivot_root (the binary is not in the sandbox's root), in a
// further user namespace that maps the policy's uid/gid to the init's root.
// The stage locks its thread, sets RLIMIT_CORE 0 and RLIMIT_NOFILE, caps
// its user namespace's max_user_namespaces at 0 (a wall besides seccomp),
// empties all five capability sets and locks the securebits (CAP_SETPCAP
// and CAP_SYS_RESOURCE arrive as ambient capabilities only for this), marks
// every fd but stdio close-on-exec, sets no_new_privs, applies Landlock to
// its own thread with raw syscalls (go-landlock's all-threads path fails
// when cgo is linked), installs the seccomp filter, and execs the target
// from the same thread. A target that is not found or cannot be executed
// is reported on a close-on-exec pipe before the exec (127, 126), so the
// supervisor can tell those apart from the workload's own exit codes.
//
// Most of a start is the stage's own start-up (a fork into a new user
// namespace and a Go runtime), so where Landlock scopes signals (ABI 6
// on) the init forks the next stage ahead after each start: a spare that
// waits, in its own fresh user namespace, for its config and stdio fds
// (SCM_RIGHTS on a socketpair), then runs the same path. Not after a
// start marked last (boundary.Process.Last: moat run's workload, a tool
// server), which nothing follows: the spare's start-up would only take
// CPU from the workload. What keeps a running workload away from a
// waiting, unconfined spare, and why a killed spare only costs a fresh
// start, is in spare_linux.go.
//
// The init's reaper reports a stage's exit without waiting for a stage
// being forked meanwhile (the spare forked after each start holds the
// fork lock through its fork and exec): children that are not
// registered, which a stage in mid-fork would be, are reaped only under
// that lock (init_linux.go, reap).
//
// # Landlock
//
// One ruleset per process, in the ABI the host has (checked against
// landlock.abi_floor in Prepare, before anything runs: [ABIError]):
// read-only grants get execute, read_file and read_dir; read-write grants
// and /tmp every right; /dev nodes read, write, truncate and device ioctl;
// /proc read. From ABI 4 TCP bind is denied and connect allowed only to
// the broker's port; from ABI 6 abstract Unix sockets and signals are
// scoped to the sandbox. From ABI 9 (when the seccomp filter starts to
// allow AF_UNIX sockets) resolve_unix is handled and granted nowhere, so a
// host socket placed in a grant stays unreachable; this path is untested
// on this ABI-7 host. UDP rights (ABI 10) are not handled: the network
// namespace alone confines UDP. A helper also gets execute+read on the
// moat binary's fd.
//
// # Limits
//
// RLIMIT_NOFILE is set per process. Memory and pids limits use a
// per-sandbox child cgroup when moat runs as root on cgroup v1; otherwise
// [boundary.Sandbox.Limits] says they are not enforced, and why.
//
// # Grants and root-owned workspaces
//
// The supervisor resolves the grants once (package grants: a plan of
// canonical, symlink-free paths with each one's device and inode, and the
// trusted symlinks to recreate). The init, in its new mount namespace,
// opens each canonical path again with RESOLVE_NO_SYMLINKS, checks the
// descriptor against the plan (identity, type, and for read_write grants
// the owner: this namespace's root, i.e. the workload's host uid), clones
// the tree from that descriptor, and attaches it on a mount point it
// opened beneath the new root without following symlinks. The attached
// trees are then the Landlock rules' descriptors for every stage.
//
// As root the workload runs as process.host_uid, and a read_write grant
// must be owned by it: a root-owned one is refused with the chown to run.
// (An idmapped mount of root-owned grants used to let writes land as
// root, and a workload made a setuid-root file that way.)
//
// # Signals and exits
//
// The init sends each started process's pidfd to the supervisor, which
// signals through it (never a recycled pid) and reads its host pid from
// fdinfo. The init reaps and reports exit codes (128+signal when killed).
//
// # Dumpability
//
// Prepare makes the supervisor process non-dumpable (it holds the
// listener and, in moat run, the journal key). A non-dumpable process's
// /proc/<child>/uid_map belongs to root, so a rootless supervisor could not
// write a new child's id maps: the fork of the init runs with dumpable set
// for that moment only, under a mutex. Other code in the same process that
// starts children with UidMappings after a Prepare must do the same.
//
// # Known limits
//
// Landlock gives read_dir beneath / so that `ls /` works: it shows the
// names of what is mounted (which /proc/self/mountinfo shows anyway) and
// grants no read of any file. The cost: Landlock alone no longer keeps a
// directory mounted by mistake from being listed (its files stay
// unreadable); TestLandlockAlone shows both.
//
// Landlock rules follow paths, not mounts: a grant mounted below /tmp is
// also covered by the /tmp rule (every right), so for such a grant only
// its mount flags keep it read-only. Memory and pids limits are enforced
// only as root on cgroup v1.
package native

// Name is the backend's registered name.
const Name = "native"
