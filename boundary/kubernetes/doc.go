// Package kubernetes is a moat backend that runs the sandbox as a Pod of a
// Kubernetes cluster, under the operator's RuntimeClass (gVisor's runsc by
// default), with moat's supervisor, broker, journal and signing key on the
// host outside the Pod.
//
// Layout of a sandbox:
//
//	supervisor (moat, on a host the Pods reach)
//	    broker listener on BROKER_IP:PORT (kubernetes.broker_address, else
//	    the single node's InternalIP); it admits only the Pod's IP
//	NetworkPolicy moat-<run>: selects the Pod; no ingress; egress only to
//	    BROKER_IP/32 TCP PORT
//	Pod moat-<run>: runtimeClassName, runAsNonRoot (process.uid/gid),
//	    allowPrivilegeEscalation false, capabilities drop ALL,
//	    readOnlyRootFilesystem, seccomp RuntimeDefault, no service-account
//	    token, no host network/PID/IPC, no service links; a private /tmp
//	    (emptyDir in memory) and the grants as volumes
//	    └─ moat __moat-k8s-pause        (the container's process)
//	    └─ exec: moat __moat-k8s-stage  (measurement, workload, exec):
//	       command, environment and working directory from the frame
//	       at the head of its stdin, moat's seccomp filter, then the
//	       command, with the rest of stdin
//
// # What the exec request carries
//
// The exec API takes a command and the streams, and the command is
// written into the API server's request log and, at high verbosity, the
// kubelet's and the runtime's. The workload's environment holds the
// per-sandbox broker key (the SDK variables carry it), so nothing of a
// process's configuration is in the command: it is the fixed
// "moat __moat-k8s-stage", and the configuration (command, environment,
// working directory) travels as a frame at the head of the exec's stdin:
// 8 bytes "moatstg1", the JSON's length (4 bytes, big-endian, at most
// 96 KiB), the JSON. The stage reads exactly that and decodes it
// strictly (a wrong magic, a bad length, a stream cut short or an
// unknown member is refused, exit 125, before anything runs); what
// follows is the workload's stdin, untouched, or /dev/null when moat had
// none to give. A terminal exec's stdin passes the Pod terminal's line
// discipline (echo, line editing) before anyone reads it, so there the
// frame goes first to an exec of its own without a terminal
// ("__moat-k8s-stage save"), which saves it in the Pod's private /tmp,
// and the terminal's exec ("__moat-k8s-stage load ID SHA256") runs it
// only with that digest (a random nonce in the frame: the digest tells
// nothing of it) and removes it. The exec's streams themselves are TLS
// from moat to the API server and on to the kubelet.
//
// A loaded node's runtime answers some execs with an error before it has
// made any process for them (containerd: "failed to load task", "failed
// to create exec"; its CRI attaches an exec's stdin only once the
// process has started). Such an exec is made again for up to 30 s, with
// the frame and whatever of the caller's stdin the failed attempt was
// handed (kept up to 1 MiB: beyond it, no retry), unless the process was
// signalled meanwhile (then it is refused, never started late). Any
// other error, and a terminal's exec, is not retried: an exec that may
// have run is never made twice (exec.go, relay.go).
//
// # Egress interception on Kubernetes
//
// On the native and gVisor backends the sandbox's network namespace holds
// nothing but loopback and the broker's listener. A Pod has an interface
// and routes of its own, so here egress is confined by three things
// together: the Pod's network namespace, a NetworkPolicy that the
// cluster's network plugin enforces (no ingress; egress to the broker's
// address and port only), and the broker outside the Pod (a broker inside
// would share the workload's network). The broker's listener is on a host
// address, so anyone who reaches that address could connect: it admits
// only connections whose source is the Pod's current IP (followed with a
// watch, so a replaced Pod's new IP is the one admitted, and nobody once
// the Pod is gone); any other is closed unread and journaled.
//
// The Pod's interface also has an IPv6 link-local address, which a
// NetworkPolicy enforced for IPv4 alone does not confine: the stage's
// seccomp filter refuses IPv6 sockets (seccomp.Options.IPv4Only) and
// the broker's address is IPv4. NetworkPolicies add up, so Prepare
// refuses a namespace where another policy that allows traffic selects
// the Pod.
//
// None of that is taken on trust. The measurement runs inside the Pod
// (moat's own binary in the image, behind the same stage as the
// workload) and, since the broker is off the sandbox's network
// (boundary.ListenerInfo.Host), tries destinations that only the
// NetworkPolicy blocks: receivers that moat opens on the broker's host
// address for the measurement (TCP and UDP), the broker's neighbouring
// ports, common service ports and the kubelet's 10250 on that address.
// A cluster whose network plugin does not enforce NetworkPolicy fails
// egress_interception, and the sandbox never reaches Ready. The
// NetworkPolicy's name, uid and allowed-egress rule count are recorded in
// the mechanism string (the journal's confirmation) as evidence only.
//
// # What this backend cannot do, and says so
//
//   - Request attribution: the broker sees the Pod's IP, never a process;
//     attribution is declared unavailable (endpoint-only), and a policy
//     with require_attribution: true refuses to start on it.
//   - Host pids: the Pod's processes are not processes of this host that
//     moat can name; HostPID is 0.
//   - Limits: memory and CPU are set as the container's resources.limits
//     (kubernetes.resources, memory defaulting to process.limits.memory),
//     but moat does not measure them; Limits reports them as not enforced.
//   - Tool servers, egress hosts, services, package registries and
//     volumes: their variables and listeners assume the sandbox's own
//     loopback; a policy with any of them is refused.
//   - Grants: by default a read_write grant is an emptyDir at its path (the
//     Pod's own content, not the host's) and read_only grants are served
//     by the image's read-only root. With host_path_grants each grant is a
//     hostPath volume, accepted only when no directory that the kubelet
//     follows to it can be replaced by anyone but root and the user
//     running moat (kubelet resolves hostPath on the node, following
//     symlinks, and another sandbox's workload could swap a component
//     between moat's check and the mount), only when the node is this
//     host (no broker_address), and never with the cluster's
//     credentials or moat's binary under a read_write grant.
//   - Signals: the exec API has none; a signal is delivered by a second
//     exec of moat in the Pod, to the pid the stage recorded.
//   - Terminals: moat's terminal is relayed through the exec API's TTY
//     stream (input, output and exit code pass), but on the test
//     cluster's gVisor an exec's terminal is not a tty inside (`tty` says
//     "not a tty"; `kubectl exec -it` shows the same), while runc gives
//     one.
package kubernetes
