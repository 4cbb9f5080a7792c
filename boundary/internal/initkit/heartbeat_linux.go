package initkit

import (
	"errors"
	"os"
	"time"
)

// The supervisor's heartbeat: while the supervisor (moat) runs it sends a
// heartbeat message on the control channel every HeartbeatPeriod(timeout);
// the init, reading the channel, ends the sandbox when nothing at all came
// for timeout (the policy's process.supervisor_timeout). Pdeathsig already
// ends the init when moat dies; the heartbeat also catches a supervisor
// that is alive but no longer runs (SIGSTOP, a hung host), which would
// otherwise leave the workload running unsupervised.

// HeartbeatOp is the op of the heartbeat message; the init ignores it but
// for the time it arrived.
const HeartbeatOp = "heartbeat"

// HeartbeatPeriod is how often the supervisor beats for an init that
// waits timeout: four beats per timeout, so that a few late ones on a
// loaded host do not end a healthy sandbox.
func HeartbeatPeriod(timeout time.Duration) time.Duration { return timeout / 4 }

// Heartbeats sends msg every HeartbeatPeriod(timeout) until a send fails
// (the channel closed). Run it in a goroutine of its own once the init is
// ready.
func (c *Conn) Heartbeats(msg any, timeout time.Duration) {
	t := time.NewTicker(HeartbeatPeriod(timeout))
	defer t.Stop()
	for range t.C {
		if err := c.Send(msg); err != nil {
			return
		}
	}
}

// ArmHeartbeat bounds the init's next Recv by timeout: call it before
// each Recv of the init's main loop. A timeout of 0 leaves Recv unbounded
// (no heartbeat asked).
func (c *Conn) ArmHeartbeat(timeout time.Duration) error {
	if timeout <= 0 {
		return c.SetReadDeadline(time.Time{})
	}
	return c.SetReadDeadline(time.Now().Add(timeout))
}

// SupervisorLost reports whether err, from a Recv armed by ArmHeartbeat,
// means that no message came in time.
func SupervisorLost(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) }
