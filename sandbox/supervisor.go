package sandbox

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/broker"
	"github.com/moat-sandbox/moat/internal/reexec"
)

// SupervisorHelper is the hidden helper of the moat binary that runs
// SupervisorMain; internal/cli/hidden.go lists it.
const SupervisorHelper = reexec.Prefix + "supervisor"

// SupervisorMain is the per-sandbox supervisor: `moat __moat-supervisor
// NAME POLICY BACKEND STATEDIR AUDITDIR LEDGERDIR PARENT MAXTOKENS` (AUDITDIR "" for the policy's; the last three: budget.go), started detached by Create with a report
// pipe on fd 3. It owns the namespaces, the broker, the journal and its
// key, and serves the control socket until the sandbox is deleted.
func SupervisorMain(args []string) int {
	if len(args) != 8 {
		fmt.Fprintln(os.Stderr, "moat: supervisor: usage: NAME POLICY BACKEND STATEDIR AUDITDIR LEDGERDIR PARENT MAXTOKENS")
		return ExitRefused
	}
	audit.Prewarm() // the journal's key is made in a moment
	name, policyPath, backend, storeDir, auditDir := args[0], args[1], args[2], args[3], args[4]
	ledgerDir, parent, maxTokens := args[5], args[6], args[7]
	report := os.NewFile(3, "report")
	st := &store{dir: storeDir}
	dir := st.sandboxDir(name)
	self := os.Getpid()
	state := &State{Name: name, Phase: boundary.PhaseProvisioning, Created: time.Now().UTC(),
		SupervisorPID: self, SupervisorStart: procStart(self)}
	fail := func(err error) int {
		state.Phase = boundary.PhaseError
		state.Error = err.Error()
		writeState(dir, state)
		fmt.Fprintf(report, "error: %v\n", err)
		report.Close()
		fmt.Fprintf(os.Stderr, "moat: supervisor %s: %v\n", name, err)
		return ExitRefused
	}
	if err := writeState(dir, state); err != nil {
		return fail(err)
	}
	pol, err := loadPolicyFile(policyPath)
	if err != nil {
		return fail(fmt.Errorf("policy %s: %w", policyPath, err))
	}
	if auditDir != "" {
		pol.Audit.Dir = auditDir
	}
	state.PolicySHA256 = pol.SHA256()
	state.Backend = pol.Backend
	if backend != "" {
		state.Backend = backend
	}
	state.AllowanceMax = pol.Inference.MaxRequests
	budget, budgetLedger, err := openBudget(dir, name, ledgerDir, parent, pol.Inference.MaxRequests, maxTokens)
	if err != nil {
		return fail(err)
	}
	defer budgetLedger.Retire(name)
	state.Parent, state.Ledger = parent, budgetLedger.Dir()
	state.Phase = boundary.PhaseConfirming
	writeState(dir, state)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sess, err := Open(ctx, SessionOptions{Policy: pol, Backend: backend, Stderr: os.Stderr, Sandbox: name, Budget: budget})
	if err != nil {
		return fail(err)
	}
	state.RunID = sess.RunID
	state.Backend = sess.Backend
	state.Properties = sess.Properties
	state.Journal = sess.w.JournalPath()
	state.PublicKey = filepath.Join(filepath.Dir(sess.w.JournalPath()), "pubkey.pem")
	state.KeyID = sess.w.KeyID()
	state.HostPID = sess.sb.HostPID()
	state.BrokerPort = sess.BrokerPort
	state.Staging = sess.stateDir

	sockPath := filepath.Join(dir, controlSock)
	os.Remove(sockPath)
	old := syscall.Umask(0o177)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sockPath, Net: "unix"})
	syscall.Umask(old)
	if err != nil {
		sess.Close(ExitRefused, audit.ReasonFailed)
		return fail(fmt.Errorf("control socket: %w", err))
	}
	state.Phase = boundary.PhaseReady
	if err := writeState(dir, state); err != nil {
		sess.Close(ExitRefused, audit.ReasonFailed)
		return fail(err)
	}
	fmt.Fprintln(report, "ready")
	report.Close()

	sv := &supervisor{sess: sess, ln: ln, done: make(chan audit.TerminalReason, 1)}
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	go sv.serve(ctx)
	initGone := watchInit(ctx, state.HostPID)
	orphaned := watchStateDir(ctx, dir, sockPath, stateDirPoll)
	var ended <-chan struct{} // nil: never
	if e, ok := sess.sb.(boundary.Ending); ok {
		ended = e.Ended()
	}
	reason := audit.ReasonDeleted
	var lost error
	select {
	case reason = <-sv.done:
	case <-sigs:
		reason = audit.ReasonTerminated
	case f := <-sess.Fatal():
		reason = f.TerminalReason()
		fmt.Fprintf(os.Stderr, "moat: supervisor %s: run cancelled: %s\n", name, f)
	case <-initGone:
		// The sandbox ended under the supervisor: its init exited (it
		// does when this supervisor was stopped for longer than the
		// policy's process.supervisor_timeout, see initkit.Heartbeats).
		// The sandbox is in Error, its journal closed as failed.
		reason = audit.ReasonFailed
		lost = fmt.Errorf("the sandbox ended: its init (host pid %d) exited; a supervisor stopped for longer than process.supervisor_timeout (%s) ends it", state.HostPID, pol.Process.SupervisorWait())
		fmt.Fprintf(os.Stderr, "moat: supervisor %s: %v\n", name, lost)
	case <-orphaned:
		// Its state directory or control socket was removed or replaced:
		// no moat command can find or reach this supervisor any more
		// (not even delete), so it ends the sandbox rather than run it
		// unseen. Its state is not written: the name may be another
		// sandbox's now.
		reason = audit.ReasonFailed
		lost = fmt.Errorf("its state directory %s or control socket was removed or replaced: no moat command could reach this supervisor, so the sandbox ends", dir)
		fmt.Fprintf(os.Stderr, "moat: supervisor %s: %v\n", name, lost)
		ln.Close()
		sess.Close(ExitRefused, reason)
		sv.wg.Wait()
		return ExitRefused
	case <-ended:
		// The sandbox ended from outside moat (a Pod deleted or evicted).
		reason = audit.ReasonSandboxLost
		lost = fmt.Errorf("the sandbox ended from outside moat: %s", sess.sb.(boundary.Ending).EndReason())
		fmt.Fprintf(os.Stderr, "moat: supervisor %s: %v\n", name, lost)
	}
	if lost != nil {
		state.Phase, state.Error = boundary.PhaseError, lost.Error()
		writeState(dir, state)
		ln.Close()
		sess.Close(ExitRefused, reason)
		sv.wg.Wait()
		return ExitRefused
	}
	ln.Close()
	state.Phase = boundary.PhaseDeleting
	writeState(dir, state)
	code := 0
	if reason != audit.ReasonDeleted && reason != audit.ReasonTerminated {
		code = ExitRefused
	}
	sess.Close(code, reason)
	sv.wg.Wait()
	state.Phase = boundary.PhaseCompleted
	writeState(dir, state)
	sv.ackDelete()
	return 0
}

// initGonePoll is how often the supervisor checks that its sandbox's init
// still runs.
const initGonePoll = 250 * time.Millisecond

// watchInit returns a channel closed once the process hostPID (the
// sandbox's init), as it was at the call (pid and start time), is gone.
func watchInit(ctx context.Context, hostPID int) <-chan struct{} {
	gone := make(chan struct{})
	start := procStart(hostPID)
	if hostPID <= 0 || start == 0 {
		return gone // nothing to watch: never closed
	}
	return pollUntil(ctx, initGonePoll, func() bool { return procStart(hostPID) != start })
}

type supervisor struct {
	sess *Session
	ln   *net.UnixListener
	done chan audit.TerminalReason
	wg   sync.WaitGroup

	mu        sync.Mutex
	deleteAck []*net.UnixConn
}

func (sv *supervisor) serve(ctx context.Context) {
	for {
		c, err := sv.ln.AcceptUnix()
		if err != nil {
			return
		}
		if !sameUser(c) {
			c.Close()
			continue
		}
		sv.wg.Add(1)
		go func() {
			defer sv.wg.Done()
			sv.handle(ctx, c)
		}()
	}
}

func (sv *supervisor) handle(ctx context.Context, c *net.UnixConn) {
	keep := false
	defer func() {
		if !keep {
			c.Close()
		}
	}()
	oob := make([]byte, syscall.CmsgSpace(3*4))
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	msg, oobn, err := readControl(c, oob)
	if oobn > 0 && err != nil {
		// Descriptors sent with a request that is not read whole are
		// closed, not kept.
		closeRights(oob[:oobn])
	}
	if errors.Is(err, errControlTooLarge) {
		reply(c, execReply{Error: err.Error()})
		return
	}
	if err != nil {
		return
	}
	c.SetReadDeadline(time.Time{})
	var files []*os.File
	if oobn > 0 {
		if msgs, err := syscall.ParseSocketControlMessage(oob[:oobn]); err == nil {
			for _, m := range msgs {
				if fds, err := syscall.ParseUnixRights(&m); err == nil {
					for _, fd := range fds {
						files = append(files, os.NewFile(uintptr(fd), "client"))
					}
				}
			}
		}
	}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	var req controlRequest
	if err := json.Unmarshal(msg, &req); err != nil {
		reply(c, execReply{Error: "bad control request: " + err.Error()})
		return
	}
	switch req.Op {
	case broker.ApprovalOpList, broker.ApprovalOpShow, broker.ApprovalOpApprove, broker.ApprovalOpDeny:
		ident, _ := peerIdent(c) // serve checked the peer (sameUser)
		writeReply(c, approvalDo(sv.sess.brk.Approvals(), bytes.TrimSuffix(msg, []byte("\n")), ident))
	case opReloadLockfiles:
		ident, _ := peerIdent(c) // serve checked the peer (sameUser)
		reply(c, sv.sess.reloadDo(ident))
	case "status":
		reply(c, statusReply{AllowanceUsed: sv.sess.Counts().Requested, Processes: sv.sess.Processes()})
	case "delete":
		sv.mu.Lock()
		sv.deleteAck = append(sv.deleteAck, c)
		sv.mu.Unlock()
		keep = true
		select {
		case sv.done <- audit.ReasonDeleted:
		default:
		}
	case "signal":
		if err := sv.sess.Signal(req.ID, syscall.Signal(req.Signal)); err != nil {
			reply(c, execReply{Error: err.Error()})
			return
		}
		reply(c, execReply{})
	case "exec":
		if len(files) != 3 {
			reply(c, execReply{Error: "exec needs the client's stdin, stdout and stderr"})
			return
		}
		var tty *os.File
		if req.TTY {
			tty = files[0]
		}
		id, proc, err := sv.sess.Start(ctx, req.Argv, files[0], files[1], files[2], tty, false)
		if err != nil {
			reply(c, execReply{Error: err.Error(), Code: startCode(err)})
			return
		}
		reply(c, execReply{Started: id})
		// The client going away kills the process.
		gone := make(chan struct{})
		go func() {
			r := bufio.NewReader(c)
			r.ReadByte()
			close(gone)
		}()
		done := make(chan struct{})
		var code int
		go func() { code, _ = proc.Wait(); close(done) }()
		select {
		case <-done:
		case <-gone:
			proc.Signal(syscall.SIGKILL)
			<-done
		}
		// process.exited is written in its place before the reply (a
		// reader of the journal finds it), and synced after it: the
		// client does not wait for the fsync. A failed sync or write
		// poisons the journal and ends the sandbox (journalFault): no
		// later request can leave without its record.
		_, wait, err := sv.sess.exitedAsync(id, code) // journals oom_killed when it was
		reply(c, execReply{Exited: true, Code: code})
		if err == nil {
			err = wait()
		}
		if err != nil {
			sv.sess.journalFault("process.exited of "+id, err)
		}
	default:
		reply(c, execReply{Error: fmt.Sprintf("unknown control op %q", req.Op)})
	}
}

// controlBufs holds the read buffers of control requests: one request
// may be up to maxControlMsg bytes, and a fresh buffer of that size for
// each (every sandbox exec is one) cost its zeroing and, every few
// requests, a garbage collection in the supervisor.
var controlBufs = sync.Pool{New: func() any { return new([maxControlMsg]byte) }}

// errControlTooLarge is a request of maxControlMsg bytes or more.
var errControlTooLarge = fmt.Errorf("the command line is longer than the %d bytes a sandbox exec request may have: put long input in a file in the workspace, or pass it on stdin", maxControlMsg-1)

// readControl reads one control request, a JSON line, and returns a copy
// of it without its pooled buffer, which goes back cleared of every byte
// read into it. The socket is a stream: a request longer than what one
// read returns (tens of KiB, a long argv) comes in several, so it reads
// to the newline. The client's descriptors come with the request's first
// bytes, into oob; any sent later are discarded by the kernel (no control
// buffer for them).
func readControl(c *net.UnixConn, oob []byte) (msg []byte, oobn int, err error) {
	buf := controlBufs.Get().(*[maxControlMsg]byte)
	n := 0 // bytes read into buf
	defer func() {
		clear(buf[:n])
		putControlBuf(buf)
	}()
	for {
		var k int
		if n == 0 {
			k, oobn, _, _, err = c.ReadMsgUnix(buf[:], oob)
		} else {
			k, _, _, _, err = c.ReadMsgUnix(buf[n:], nil)
		}
		from := n
		n += k
		if i := bytes.IndexByte(buf[from:n], '\n'); i >= 0 {
			return bytes.Clone(buf[:from+i+1]), oobn, nil
		}
		switch {
		case err != nil:
			return nil, oobn, err
		case k == 0:
			return nil, oobn, io.ErrUnexpectedEOF
		case n == len(buf):
			return nil, oobn, errControlTooLarge
		}
	}
}

// putControlBuf returns a cleared buffer to controlBufs; a variable for
// this package's tests.
var putControlBuf = func(b *[maxControlMsg]byte) { controlBufs.Put(b) }

// closeRights closes the descriptors of the SCM_RIGHTS messages in oob.
func closeRights(oob []byte) {
	msgs, err := syscall.ParseSocketControlMessage(oob)
	if err != nil {
		return
	}
	for _, m := range msgs {
		if fds, err := syscall.ParseUnixRights(&m); err == nil {
			for _, fd := range fds {
				syscall.Close(fd)
			}
		}
	}
}

func (sv *supervisor) ackDelete() {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	for _, c := range sv.deleteAck {
		reply(c, execReply{Exited: true})
		c.Close()
	}
}

func reply(c net.Conn, v any) {
	b, _ := json.Marshal(v)
	c.Write(append(b, '\n'))
}
