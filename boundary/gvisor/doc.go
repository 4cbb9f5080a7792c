// Package gvisor is a moat backend that runs the workload under gVisor's
// runsc, from an OCI bundle that moat writes itself.
//
// Layout of a sandbox:
//
//	supervisor (moat) ── locked OS thread, Pdeathsig ──▶ __moat-gvisor-init
//	    new PID, network and mount namespaces; only `lo`, up; the broker's
//	    listener is made here and handed to the supervisor (SCM_RIGHTS)
//	    └─ runsc --network=host run
//	       container init: __moat-gvisor-stage, which installs moat's
//	       seccomp filter on its thread and runs the pause there
//	         └─ measurement, workload, exec: forked by the pause from that
//	            thread, asked over a socket runsc passes it (--pass-fd);
//	            they inherit the filter, the uid, empty capabilities and
//	            noNewPrivileges (pause_linux.go)
//	    └─ runsc exec --process P.json (a process with a terminal only),
//	       behind the stage
//
// runsc's network mode "host" means the sentry uses the network namespace it
// was started in, which moat made with nothing but loopback and the broker's
// listener: egress is confined by that namespace, not by the sentry. gVisor
// maps no ids (no user namespace here), so the uid the workload has inside
// is the uid its files get on the host: it runs as the host uid native
// maps to (process.host_uid, else the owner of the first read_write grant
// when not root, else 65534), never 0, and every read_write grant must be
// owned by that uid (a root-owned workspace is refused with the chown
// fix). Inside, id -u therefore shows that uid, not process.uid. It runs
// with every capability set
// empty, noNewPrivileges, and package seccomp's filter (the native
// backend's), which the stage installs on the container's init (the pause
// forks every process from that thread, so each inherits it) and in front
// of every `runsc exec`, and the sentry enforces. The spec carries no filter of its own: runsc applies one
// to the container's init only, never to what `runsc exec` starts. Only
// the policy's grants are mounted;
// the root is an empty read-only directory.
//
// What this backend cannot do, and says so:
//   - Request attribution: with the host network stack, every connection to
//     the broker belongs to the runsc sandbox process on the host, so the
//     binary inside cannot be identified. The backend declares attribution
//     unavailable (endpoint-only); a policy with require_attribution: true
//     refuses to start on it.
//   - Rootless: Debian's runsc (release 20221219), run rootless inside a user
//     namespace, fails every write to a bind mount with EINVAL, so a
//     workspace cannot work. The backend needs root; `moat doctor` says so.
//     That runsc also fails statx (stat, ls -la) with EINVAL; moat wants
//     the runsc that scripts/install-runsc builds (hostinfo.RunscMinimum),
//     and the measurement's useful-work control fails Ready on an older one.
//   - cgroups: runsc makes the container's cgroup (linux.cgroupsPath,
//     /moat-<run>) in every hierarchy and leaves it when its sandbox is
//     killed; moat gives them to the reaper before runsc starts and removes
//     them on Terminate, so neither an exit nor a SIGKILL of moat leaves one.
//   - cgroup memory and pids limits are not configured (runsc's cgroup
//     handling on this host's cgroup v1 is not wired); Limits reports them
//     as not enforced. RLIMIT_NOFILE is set in the spec.
//
// # Why the OCI types are written here
//
// spec_linux.go declares the OCI runtime-spec types itself (ociSpec and
// the rest, field names as in opencontainers/runtime-spec's config.md)
// instead of importing github.com/opencontainers/runtime-spec/specs-go.
// moat writes a small, fixed subset of the spec (process, root,
// hostname, mounts, namespaces, rlimits, cgroupsPath), and the upstream
// package would be a dependency of every moat binary for those few
// structs (STYLE: dependencies are few). Declaring only what moat sets
// also keeps the bundle to exactly that: a field the upstream types carry
// cannot be written by accident, and one moat needs is added here with its
// name from config.md.
//
// Readiness is never taken from these claims: moat runs its shared
// measurement inside the sentry through StartHelper, as for every backend.
// Inside gVisor, landlock_create_ruleset returns ENOSYS and a seccomp
// NEW_LISTENER filter returns EINVAL; the properties hold all the same.
package gvisor
