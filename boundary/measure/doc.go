// Package measure confirms a sandbox's security properties by measurement,
// for every backend alike.
//
// moat never takes a backend's word for a property. Confirm runs moat's own
// binary inside the final sandbox, through Sandbox.StartHelper (so under
// exactly the confinement the workload gets), as the hidden helper
// "__moat-measure". The helper attempts each violation next to the allowed
// action that matches it, and reports what happened; the host side adds
// what it observed itself (the helper's broker connection, and who the
// attributor says made it), then decides each property:
//
//	Enforced = every violation for the property failed
//	       AND every positive control for it succeeded
//	       AND there is at least one control.
//
// A check whose outcome could not be determined counts against its
// property, and so does a check that is missing from the helper's report.
// A missing, oversized or garbled report therefore means not enforced,
// never enforced. Mechanism strings come from Sandbox.Mechanisms and are
// recorded for audit; they play no part in the decision.
//
// # Wire format
//
// The host builds a plan, a list of probes, from Config (host secrets are
// expanded on the host, where their contents can be listed). The plan goes
// to the helper as one argv element, JSON:
//
//	{"v":1,"nonce":"<hex>","probes":[{"id":"fs/read-secret:/etc/shadow","op":"read","path":"/etc/shadow"},…]}
//
// The helper writes one JSON object to stdout and nothing else:
//
//	{"v":1,"results":[{"id":"fs/read-secret:/etc/shadow","outcome":"failed","detail":"open: permission denied"},…]}
//
// outcome is "succeeded" (the attempted action worked), "failed" (it did
// not) or "error" (the helper could not find out). Each probe is answered
// exactly once; unknown members, unknown or duplicate ids, and trailing
// data make the whole report invalid. Whether an outcome is good depends
// on the check's kind, which only the host knows: the helper cannot turn a
// violation into a control.
//
// The helper never sends a packet to anything but 127.0.0.0/8 and ::1: the
// DNS check queries only loopback nameservers, and the absence of a route
// out is read from the routing table, not tried.
//
// # Checks
//
// filesystem_confinement: each host secret (a file, or for a directory that
// holds a grant, the entries beside the grant) cannot be read, nor can a
// sentinel that Confirm plants in the host's /tmp; a new file cannot be
// created in the parent of each grant (unless that lies in a read-write
// grant or in /tmp, the sandbox's own tmpfs) nor in "/"; a read-only grant
// cannot be written; the helper inherited no fd beyond stdio (an fd
// without FD_CLOEXEC at its start, e.g. a host directory, would reach past
// every wall). Controls: each read-write grant and /tmp take a new file
// (created and removed), each read-only grant can be read, and "/" and
// each read-write grant can be statx'd, listed and each entry statx'd
// with the flags stat and ls -l use (useful work: a sandbox that confines
// but fails this, as an old runsc does with EINVAL, is not Ready).
//
// egress_interception: for the measurement, Confirm opens receivers on the
// host, outside the sandbox: TCP and UDP on 127.0.0.1, an abstract Unix
// socket, and a pathname Unix socket in each read-write grant; each must
// observe nothing, and the helper's attempts on them must fail. TCP to
// loopback ports other than the broker's (a fixed list, the broker's
// neighbours, the receivers and Config.ExtraTCPPorts) fails on 127.0.0.1
// and ::1; a DNS query over UDP to 127.0.0.1:53, ::1:53, each loopback
// nameserver of /etc/resolv.conf, the receiver and Config.ExtraUDPPorts
// gets no answer; Unix sockets in Config.ExtraUnixSockets cannot be
// reached; no interface but loopback exists; no route leaves through
// another interface and there is no default route. Controls: the helper
// reaches the broker port and gets the host's answer, and the host sees
// that connection carry this run's nonce.
//
// privilege_floor: no_new_privs is set (prctl), the effective, permitted,
// inheritable (capget) and ambient sets are empty, the bounding set is
// empty or unusable, real/effective/saved uid and gid are not 0, a new user
// namespace can be made neither by unshare nor by clone, and a setuid file
// named in Config.SetuidProbes does not change the euid. Control: the
// helper can fork and execute itself.
//
// request_attribution: the helper's broker connection (made while no
// probe that forks runs, so that no forked child shares its socket; the
// exec control's child was started before it, and the probes that fork
// start after it) is attributed by the
// sandbox's Attributor to the helper's host pid and to the sha256 of the
// moat binary. A backend that declares attribution unavailable gets the
// property marked Unavailable with its reason (the check is still run and
// recorded).
//
// # What the measurement rests on
//
// The report is written by the binary that the backend runs as the
// helper. Where attribution is available, the host checks that the broker
// connection carrying this run's nonce came from the helper's pid and from
// an executable with moat's own sha256, which ties the report to moat's
// binary; where a backend declares attribution unavailable, that tie is
// missing, and the backend could substitute another helper. The checks
// see what a process of the sandbox sees at the moment they run; they do
// not prove that no other way out exists (kernel or hypervisor exploits,
// side channels are out of scope, as the evidence report says).
package measure
