package sandbox

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/moat-sandbox/moat/broker"
)

// The run control socket: `moat run` with approval rules listens on
// <run dir>/control.sock (mode 0600 in the run directory, mode 0700),
// and takes one approval command per connection from the owning user or
// root (peer credentials checked, like a sandbox supervisor's socket):
// one JSON object (broker.ApprovalCommand) and a newline; it answers one
// JSON line (broker.ApprovalReply). A sandbox's supervisor takes the same
// commands on its own control socket.

// RunControlSock is the run control socket's name in the run directory.
const RunControlSock = "control.sock"

// controlReadTimeout bounds reading a command from a control client.
const controlReadTimeout = 10 * time.Second

// runControl is the control socket of one moat run.
type runControl struct {
	ln   *net.UnixListener
	path string
	desk *broker.ApprovalDesk
	wg   sync.WaitGroup
}

// serveRunControl starts the run control socket when the policy holds
// requests for approval; with no approval rule there is nothing to
// control and it returns a no-op stop.
func (s *Session) serveRunControl() (stop func(), err error) {
	desk := s.brk.Approvals()
	if desk == nil {
		return func() {}, nil
	}
	path := filepath.Join(filepath.Dir(s.w.JournalPath()), RunControlSock)
	old := syscall.Umask(0o177)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("the policy holds requests for approval, but the run control socket could not be created: %w (a run directory path shorter than about 100 bytes is needed; set audit.dir)", err)
	}
	rc := &runControl{ln: ln, path: path, desk: desk}
	rc.wg.Add(1)
	go func() {
		defer rc.wg.Done()
		rc.serve()
	}()
	return func() {
		ln.Close()
		rc.wg.Wait()
		os.Remove(path)
	}, nil
}

func (rc *runControl) serve() {
	for {
		c, err := rc.ln.AcceptUnix()
		if err != nil {
			return
		}
		ident, ok := peerIdent(c)
		if !ok {
			c.Close()
			continue
		}
		rc.wg.Add(1)
		go func() {
			defer rc.wg.Done()
			defer c.Close()
			c.SetDeadline(time.Now().Add(controlReadTimeout))
			line, err := readCommand(c)
			if err != nil {
				writeReply(c, broker.ApprovalReply{Error: err.Error()})
				return
			}
			writeReply(c, approvalDo(rc.desk, line, ident))
		}()
	}
}

// readCommand reads one newline-terminated command of at most
// broker.MaxApprovalCommandBytes.
func readCommand(r io.Reader) ([]byte, error) {
	br := bufio.NewReaderSize(io.LimitReader(r, broker.MaxApprovalCommandBytes+2), broker.MaxApprovalCommandBytes+2)
	line, err := br.ReadSlice('\n')
	switch {
	case errors.Is(err, bufio.ErrBufferFull) || len(line) > broker.MaxApprovalCommandBytes+1:
		return nil, fmt.Errorf("command longer than %d bytes", broker.MaxApprovalCommandBytes)
	case errors.Is(err, io.EOF):
		return nil, errors.New("command without its newline")
	case err != nil:
		return nil, err
	}
	return line[:len(line)-1], nil
}

// approvalDo parses and carries out one approval command.
func approvalDo(desk *broker.ApprovalDesk, line []byte, approver string) broker.ApprovalReply {
	cmd, err := broker.ParseApprovalCommand(line)
	if err != nil {
		return broker.ApprovalReply{Error: err.Error()}
	}
	if desk == nil {
		return broker.ApprovalReply{Error: "this run's policy holds no request for approval (no approvals.rules)"}
	}
	return desk.Do(cmd, approver)
}

func writeReply(c net.Conn, r broker.ApprovalReply) {
	b, _ := json.Marshal(r)
	c.Write(append(b, '\n'))
}

// SendApprovalCommand sends cmd to a control socket (a run's, or a
// sandbox supervisor's) and returns its answer; an answer with an error
// is returned as the error.
func SendApprovalCommand(sock string, cmd broker.ApprovalCommand) (broker.ApprovalReply, error) {
	var rep broker.ApprovalReply
	c, err := net.DialTimeout("unix", sock, 5*time.Second)
	if err != nil {
		return rep, fmt.Errorf("control socket %s: %w (is the run still going?)", sock, err)
	}
	defer c.Close()
	b, _ := json.Marshal(cmd)
	if _, err := c.Write(append(b, '\n')); err != nil {
		return rep, fmt.Errorf("control socket %s closed without an answer (%v): only the user who started the run, or root, is answered", sock, err)
	}
	sc := bufio.NewScanner(c)
	sc.Buffer(make([]byte, 4096), maxControlMsg)
	if !sc.Scan() {
		why := "closed"
		if sc.Err() != nil {
			why = sc.Err().Error()
		}
		return rep, fmt.Errorf("control socket %s closed without an answer (%s): only the user who started the run, or root, is answered", sock, why)
	}
	if err := json.Unmarshal(sc.Bytes(), &rep); err != nil {
		return rep, fmt.Errorf("control socket %s: bad answer: %w", sock, err)
	}
	if rep.Error != "" {
		return rep, errors.New(rep.Error)
	}
	return rep, nil
}

// SandboxControlSock is the control socket of the sandbox named name.
func SandboxControlSock(name string) (string, error) {
	if err := ValidateName(name); err != nil {
		return "", err
	}
	st, err := openStore()
	if err != nil {
		return "", err
	}
	if _, err := st.read(name); err != nil {
		return "", err
	}
	return filepath.Join(st.sandboxDir(name), controlSock), nil
}
