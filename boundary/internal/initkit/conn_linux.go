package initkit

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
	"golang.org/x/sys/unix"
)

const (
	// MaxMessage bounds one control message (argv, env and configs
	// included). A SOCK_SEQPACKET message must fit the socket's send
	// buffer anyway (about 200 KiB by default).
	MaxMessage = 128 << 10
	// MaxFDs bounds the descriptors attached to one message.
	MaxFDs = 4
)

// ErrClosed reports that the other end closed the channel or that this end
// was closed.
var ErrClosed = errors.New("control channel closed")

// Conn is one end of a control channel. Send may be called from several
// goroutines; Recv from one reader at a time. Close wakes a blocked Recv.
type Conn struct {
	f      *os.File
	rc     syscall.RawConn
	wmu    sync.Mutex // one Sendmsg at a time (keeps messages whole and in order)
	closed atomic.Bool
}

// Pair makes a control channel: the supervisor's end, and the child's end
// as a file to hand to the init (it is close-on-exec in this process; the
// exec package dups it for the child). The caller closes child once the
// init has started.
func Pair() (*Conn, *os.File, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("control socketpair: %w", err)
	}
	c, err := NewConn(fds[0])
	if err != nil {
		unix.Close(fds[1])
		return nil, nil, err
	}
	return c, os.NewFile(uintptr(fds[1]), "control-child"), nil
}

// NewConn makes a Conn of fd, a SOCK_SEQPACKET socket (the init's end,
// inherited at a fixed number); the Conn owns fd from then on.
func NewConn(fd int) (*Conn, error) {
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("control channel: %w", err)
	}
	f := os.NewFile(uintptr(fd), "control")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("control channel: %w", err)
	}
	return &Conn{f: f, rc: rc}, nil
}

// Close closes this end; a blocked Recv returns ErrClosed. Idempotent.
func (c *Conn) Close() error {
	c.closed.Store(true)
	if err := c.f.Close(); err != nil && !errors.Is(err, os.ErrClosed) {
		return err
	}
	return nil
}

// SetReadDeadline bounds the wait of Recv (os.ErrDeadlineExceeded after
// it); the zero time removes the bound.
func (c *Conn) SetReadDeadline(t time.Time) error { return c.f.SetReadDeadline(t) }

// Send marshals m as one message and attaches fds (which stay open here).
func (c *Conn) Send(m any, fds ...int) error {
	b, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("BUG: control message: %w", err)
	}
	if len(b) > MaxMessage {
		return fmt.Errorf("control message of %d bytes exceeds the limit of %d (argv or env too large: put long input in a file in the workspace, or pass it on stdin)", len(b), MaxMessage)
	}
	if len(fds) > MaxFDs {
		return fmt.Errorf("BUG: control message with %d fds, more than %d", len(fds), MaxFDs)
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	var serr error
	err = c.rc.Write(func(fd uintptr) bool {
		for {
			serr = unix.Sendmsg(int(fd), b, oob, nil, 0)
			if serr != unix.EINTR {
				return serr != unix.EAGAIN
			}
		}
	})
	if err != nil {
		return c.closedErr(err)
	}
	if serr == unix.EPIPE || serr == unix.ECONNRESET {
		return ErrClosed
	}
	return serr
}

// Recv reads the next message into m (see Decode) and returns the files
// attached to it, which the caller owns. A message over MaxMessage bytes
// or MaxFDs descriptors is consumed and refused, its descriptors closed.
func (c *Conn) Recv(m any) ([]*os.File, error) {
	// The message's length first: MSG_PEEK|MSG_TRUNC returns the whole
	// packet's length without taking it, so the buffer fits the message.
	var one [1]byte
	size, _, _, err := c.recvmsg(one[:], nil, unix.MSG_PEEK|unix.MSG_TRUNC)
	if err != nil {
		return nil, err
	}
	buf := make([]byte, min(size, MaxMessage+1))
	oob := make([]byte, unix.CmsgSpace(MaxFDs*4))
	n, oobn, flags, err := c.recvmsg(buf, oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil {
		return nil, err
	}
	files, ferr := parseRights(oob[:oobn])
	if n == 0 && oobn == 0 {
		return nil, ErrClosed
	}
	refuse := func(err error) ([]*os.File, error) {
		CloseFiles(files)
		return nil, err
	}
	switch {
	case ferr != nil:
		return refuse(ferr)
	case flags&unix.MSG_CTRUNC != 0:
		return refuse(fmt.Errorf("control message carries more than %d fds", MaxFDs))
	case size > MaxMessage || flags&unix.MSG_TRUNC != 0:
		return refuse(fmt.Errorf("control message of %d bytes exceeds the limit of %d", size, MaxMessage))
	}
	if err := Decode(buf[:n], m); err != nil {
		return refuse(err)
	}
	return files, nil
}

// recvmsg is one recvmsg(2) on the channel, waiting in the poller until a
// message (or the end) is there.
func (c *Conn) recvmsg(p, oob []byte, flags int) (n, oobn, recvflags int, err error) {
	var rerr error
	err = c.rc.Read(func(fd uintptr) bool {
		for {
			n, oobn, recvflags, _, rerr = unix.Recvmsg(int(fd), p, oob, flags)
			if rerr != unix.EINTR {
				return rerr != unix.EAGAIN
			}
		}
	})
	if err != nil {
		return 0, 0, 0, c.closedErr(err)
	}
	return n, oobn, recvflags, rerr
}

// closedErr maps the error of an operation on this end, once closed, to
// ErrClosed; a deadline passes through.
func (c *Conn) closedErr(err error) error {
	if c.closed.Load() || errors.Is(err, os.ErrClosed) {
		return ErrClosed
	}
	return err
}

// Decode parses one control message into m: a single JSON value, known
// fields only (matched case-sensitively), no duplicate names, nothing after
// it, at most MaxMessage bytes.
func Decode(b []byte, m any) error {
	if len(b) > MaxMessage {
		return fmt.Errorf("control message exceeds %d bytes", MaxMessage)
	}
	// json v2's Unmarshal refuses duplicate names, names that match a
	// field only case-insensitively, invalid UTF-8 and trailing data.
	if err := jsonv2.Unmarshal(b, m, jsonv2.RejectUnknownMembers(true)); err != nil {
		return fmt.Errorf("control message: %w", err)
	}
	return nil
}

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
	if len(files) > MaxFDs {
		bad = fmt.Errorf("control message carries %d fds, more than %d", len(files), MaxFDs)
	}
	return files, bad
}

// CloseFiles closes every non-nil file of fs.
func CloseFiles(fs []*os.File) {
	for _, f := range fs {
		if f != nil {
			f.Close()
		}
	}
}
