package native

import (
	"errors"
	"os"

	"github.com/moat-sandbox/moat/boundary/internal/initkit"
)

// The control channel between supervisor and init is an initkit.Conn: one
// JSON message per SOCK_SEQPACKET packet, with file descriptors attached.

// ctlMsg is every message on the control channel; Op says which fields
// matter.
type ctlMsg struct {
	Op string `json:"op"`
	// ready: the broker listener's port (fd attached).
	Port int `json:"port,omitempty"`
	// ready: the egress port, when the policy has egress hosts (its fd
	// attached after the broker listener's).
	EgressPort int `json:"egress_port,omitempty"`
	// start, started, failed, exited, signal.
	ID     int      `json:"id,omitempty"`
	Argv   []string `json:"argv,omitempty"`
	Env    []string `json:"env,omitempty"`
	Dir    string   `json:"dir,omitempty"`
	Helper bool     `json:"helper,omitempty"`
	TTY    bool     `json:"tty,omitempty"`
	// start: no start follows this one (boundary.Process.Last), so the
	// init forks no spare stage after it.
	Last bool `json:"last,omitempty"`
	// started: the pid inside the sandbox (pidfd attached).
	PID int `json:"pid,omitempty"`
	// failed, exited: exit code; failed, error: message.
	Code int    `json:"code,omitempty"`
	Err  string `json:"err,omitempty"`
}

// recvCtl returns the next message and the files attached to it.
func recvCtl(c *initkit.Conn) (ctlMsg, []*os.File, error) {
	var m ctlMsg
	files, err := c.Recv(&m)
	if err == nil && m.Op == "" {
		initkit.CloseFiles(files)
		return ctlMsg{}, nil, errors.New("control message without op")
	}
	return m, files, err
}

// decodeCtl parses one control message as recvCtl does.
func decodeCtl(b []byte) (ctlMsg, error) {
	var m ctlMsg
	if err := initkit.Decode(b, &m); err != nil {
		return ctlMsg{}, err
	}
	if m.Op == "" {
		return ctlMsg{}, errors.New("control message without op")
	}
	return m, nil
}
