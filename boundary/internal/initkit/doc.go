// Package initkit is the plumbing both backends (boundary/native and
// boundary/gvisor) use between the supervisor and the init they start: one
// implementation per concept, so that the two cannot drift apart again
// (their stdio copies had: gVisor handled one writer given as both stdout
// and stderr, native copied it from two goroutines at once).
//
//   - [Conn] is the control channel: a SOCK_SEQPACKET socketpair carrying
//     one JSON message per packet, with file descriptors attached as
//     SCM_RIGHTS. Each message is sized before it is read (no fixed
//     per-message buffer), capped at [MaxMessage] bytes and [MaxFDs]
//     descriptors, and decoded strictly by [Decode]: one JSON value, known
//     fields only, nothing after it.
//   - [LoopbackUp] and [BrokerListener] set up the sandbox's network
//     namespace: lo up, and the broker's listening sockets on
//     127.0.0.1:<ephemeral>: the inference port and, when the policy has
//     egress hosts, the egress port (a second BrokerListener).
//   - [StartLocked] starts the init from an OS thread that stays locked
//     until the sandbox ends, so that the init's Pdeathsig (which fires
//     when the thread that forked it exits) fires only when moat dies.
//   - [Conn.Heartbeats] and [Conn.ArmHeartbeat] are the supervisor's
//     heartbeat: the supervisor beats on the control channel while it
//     runs; the init ends the sandbox when no message came for the
//     policy's process.supervisor_timeout (a stopped or hung supervisor,
//     which Pdeathsig does not catch).
//   - [OpenStdio] turns a boundary.Process's stdio into the three
//     descriptors a process gets, pumping readers and writers that are
//     not files through pipes.
//
// It is internal to boundary: nothing outside the backends needs it.
package initkit
