// Package cgroup makes, fills and removes the per-sandbox cgroups that
// enforce process.limits (memory and pids), on cgroup v1 and v2, and
// finds cgroups that a dead run left behind.
//
// Where a controller lives is decided per controller from the host's
// mounts (/proc/self/mountinfo) and this process's cgroups
// (/proc/self/cgroup), so that a hybrid host (v1 hierarchies beside a v2
// one) uses whichever hierarchy holds the controller:
//
//   - cgroup v1, as root: a child named moat-<run> of this process's cgroup
//     in the controller's hierarchy (memory.limit_in_bytes, pids.max).
//     Unprivileged on v1: not enforced (v1 has no safe delegation).
//   - cgroup v2, as root: a child moat-<run> of the v2 mount's root, after
//     the controllers are enabled in the root's cgroup.subtree_control
//     (memory.max, memory.swap.max where present, pids.max).
//   - cgroup v2, unprivileged: only in this process's own cgroup, and only
//     when it is delegated to this uid: the directory, its
//     cgroup.subtree_control and cgroup.procs owned by the uid (and
//     writable by it), the controllers listed in its cgroup.controllers.
//     Its processes are first moved to a leaf child moat-leaf (a cgroup
//     with processes cannot enable controllers for its children), as a
//     delegated scope (systemd-run --user --scope -p Delegate=yes) allows.
//
// Anything else is reported as not enforced, with the exact reason.
//
// The file-system work goes through FS so that the decisions and the file
// writing are tested against a fake cgroupfs in a temporary directory;
// OS is the real one.
//
// Liveness: the process that makes a cgroup holds an flock on the
// directory until it has removed it. Sweep removes a moat-* cgroup only
// when no process holds that lock, it is older than SweepGrace (which
// covers the moment between mkdir and flock, and the cgroups that runsc
// makes), and the kernel agrees to remove it (rmdir of a cgroup with
// processes or children fails).
package cgroup
