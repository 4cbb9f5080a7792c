package native

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// The control channel between supervisor and init is a SOCK_SEQPACKET
// socketpair: one JSON message per packet, with file descriptors attached
// as SCM_RIGHTS.

const (
	// maxControlMsg bounds one control message (argv and env included).
	maxControlMsg = 128 << 10
	// maxControlFDs bounds the descriptors attached to one message.
	maxControlFDs = 4
)

// ctlMsg is every message on the control channel; Op says which fields
// matter.
type ctlMsg struct {
	Op string `json:"op"`
	// ready: the broker listener's port (fd attached).
	Port int `json:"port,omitempty"`
	// start, started, failed, exited, signal.
	ID     int      `json:"id,omitempty"`
	Argv   []string `json:"argv,omitempty"`
	Env    []string `json:"env,omitempty"`
	Dir    string   `json:"dir,omitempty"`
	Helper bool     `json:"helper,omitempty"`
	TTY    bool     `json:"tty,omitempty"`
	// started: the pid inside the sandbox (pidfd attached).
	PID int `json:"pid,omitempty"`
	// failed, exited: exit code; failed, error: message.
	Code int    `json:"code,omitempty"`
	Err  string `json:"err,omitempty"`
}

// ctlConn sends and receives control messages.
type ctlConn struct {
	fd     int
	wmu    sync.Mutex
	closed bool // guarded by wmu; recv is only called by one reader
}

// shutdown wakes the reader, which then calls close.
func (c *ctlConn) shutdown() { unix.Shutdown(c.fd, unix.SHUT_RDWR) }

func (c *ctlConn) close() {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if !c.closed {
		c.closed = true
		unix.Close(c.fd)
	}
}

func (c *ctlConn) send(m ctlMsg, fds ...int) error {
	b, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("BUG: control message: %w", err)
	}
	if len(b) > maxControlMsg {
		return fmt.Errorf("control message of %d bytes exceeds the limit of %d (argv or env too large)", len(b), maxControlMsg)
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.closed {
		return errClosed
	}
	for {
		err = unix.Sendmsg(c.fd, b, oob, nil, 0)
		if err != unix.EINTR {
			return err
		}
	}
}

// recv returns the next message and the files attached to it. io.EOF-like
// closure is reported as errClosed.
func (c *ctlConn) recv() (ctlMsg, []*os.File, error) {
	buf := make([]byte, maxControlMsg+1)
	oob := make([]byte, unix.CmsgSpace(maxControlFDs*4))
	var n, oobn int
	var err error
	for {
		n, oobn, _, _, err = unix.Recvmsg(c.fd, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return ctlMsg{}, nil, err
	}
	files, ferr := parseRights(oob[:oobn])
	if n == 0 && oobn == 0 {
		return ctlMsg{}, nil, errClosed
	}
	if ferr != nil {
		closeFiles(files)
		return ctlMsg{}, nil, ferr
	}
	if n > maxControlMsg {
		closeFiles(files)
		return ctlMsg{}, nil, fmt.Errorf("control message exceeds %d bytes", maxControlMsg)
	}
	m, err := decodeCtl(buf[:n])
	if err != nil {
		closeFiles(files)
		return ctlMsg{}, nil, err
	}
	return m, files, nil
}

// decodeCtl parses one control message: a single JSON object with known
// fields only, within maxControlMsg.
func decodeCtl(b []byte) (ctlMsg, error) {
	if len(b) > maxControlMsg {
		return ctlMsg{}, fmt.Errorf("control message exceeds %d bytes", maxControlMsg)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var m ctlMsg
	if err := dec.Decode(&m); err != nil {
		return ctlMsg{}, fmt.Errorf("control message: %w", err)
	}
	if dec.More() {
		return ctlMsg{}, errors.New("control message: trailing data")
	}
	if m.Op == "" {
		return ctlMsg{}, errors.New("control message without op")
	}
	return m, nil
}

var errClosed = errors.New("control channel closed")

func parseRights(oob []byte) ([]*os.File, error) {
	if len(oob) == 0 {
		return nil, nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("control message rights: %w", err)
	}
	var files []*os.File
	var bad error
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			bad = fmt.Errorf("control message rights: %w", err)
			continue
		}
		for _, fd := range fds {
			files = append(files, os.NewFile(uintptr(fd), "ctl-fd"))
		}
	}
	if len(files) > maxControlFDs {
		bad = fmt.Errorf("control message carries %d fds, more than %d", len(files), maxControlFDs)
	}
	return files, bad
}

func closeFiles(fs []*os.File) {
	for _, f := range fs {
		if f != nil {
			f.Close()
		}
	}
}
