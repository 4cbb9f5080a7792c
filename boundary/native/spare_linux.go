package native

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/boundary/internal/initkit"
)

// The spare stage
//
// Most of a start's time is the stage's own start-up: a fork into a new
// user namespace and a Go runtime coming up in the moat binary. So once
// the sandbox's root is built, and after each start but a last one
// (ctlMsg.Last), the init forks the next stage ahead of time, the spare
// (the first one comes up while the init and the host finish the sandbox,
// so that the measurement's helper starts on a spare too): it
// comes up in its own fresh user namespace and waits, unconfined but
// running nothing but moat's own code, on a SOCK_SEQPACKET socketpair
// (its fd stageErrFD) for one message: its stageConfig, with the three
// stdio fds attached (SCM_RIGHTS). It puts them on 0-2 (TIOCSCTTY for a
// terminal, as the fresh stage's Setctty) and from there runs exactly the
// fresh stage's path: confine, Landlock, seccomp, exec, a report on the
// same socket when it cannot exec, and the socket's end closing at exec
// (close-on-exec) as the sign that the target runs. The measurement's
// helpers start the same way, so they measure the same confinement.
//
// A workload must not be able to reach a spare that waits, not yet
// confined. What keeps it out (each in the sandbox's PID namespace, where
// the workload sees the spare's pid):
//   - ptrace, /proc/PID/mem, /proc/PID/fd, /proc/PID/environ: access
//     needs CAP_SYS_PTRACE in the spare's user namespace (the two are in
//     sibling namespaces, so the same uid is not enough), the workload's
//     Landlock domain forbids tracing a process outside it, and its
//     seccomp filter refuses ptrace and process_vm_*;
//   - signals (a kill or a SIGSTOP would make the next start hang or
//     fail): the same host uid could signal it, so spares are used only
//     where Landlock scopes signals (ABI 6 on: a workload may signal only
//     its own domain); below that every start forks a fresh stage;
//   - its fds 0-2 are /dev/null and its socket's other end is the
//     init's alone.
//
// A spare that died (killed from outside the sandbox, or by the pids
// limit) costs only a fresh start: the init checks that the reaper has
// not collected it and that the send went through (a dead peer's socket
// refuses it); if either fails it forks a fresh stage instead. Its user
// namespace's identity is taken at its fork, under mu, as for a fresh
// stage, so killUserNS finds what a workload started from it leaves. An
// unused spare dies with the init (the PID namespace ends every process
// of the sandbox), and it counts against the pids limit as one process.

// spareArg is the stage's argument that makes it a spare.
const spareArg = "spare"

// minSpareABI is the Landlock ABI from which signals are scoped (see above).
const minSpareABI = 6

// spare is a stage forked ahead of a start, waiting on conn.
type spare struct {
	st   *stageProc
	conn *initkit.Conn
}

func (in *initState) sparesOK() bool { return in.cfg.Landlock.ABI >= minSpareABI }

// refill forks the next spare in the background, when there is none.
func (in *initState) refill() {
	if !in.sparesOK() {
		return
	}
	go func() {
		in.spareMu.Lock()
		defer in.spareMu.Unlock()
		if in.spare != nil {
			return
		}
		if in.devNull == nil {
			f, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
			if err != nil {
				return
			}
			in.devNull = f
		}
		ours, theirs, err := initkit.Pair()
		if err != nil {
			return
		}
		st, err := in.forkStage([]*os.File{in.devNull, in.devNull, in.devNull, theirs, nil, in.exe}, []string{spareArg}, false)
		theirs.Close()
		if err != nil {
			ours.Close()
			return
		}
		if st.nsIno == 0 { // it ended at once: nothing to keep
			ours.Close()
			if st.pidfd >= 0 {
				unix.Close(st.pidfd)
			}
			go func() { <-st.ip.exit }()
			return
		}
		in.spare = &spare{st: st, conn: ours}
	}()
}

// startSpare starts sc on the spare, if there is a live one: st is nil
// (and err nil) when there is none, or it died, and the caller starts a
// fresh stage.
func (in *initState) startSpare(sc *stageConfig, files []*os.File) (*stageProc, *stageReport, error) {
	in.spareMu.Lock()
	sp := in.spare
	in.spare = nil
	in.spareMu.Unlock()
	if sp == nil {
		return nil, nil, nil
	}
	defer sp.conn.Close()
	drop := func() (*stageProc, *stageReport, error) {
		if sp.st.pidfd >= 0 {
			unix.PidfdSendSignal(sp.st.pidfd, unix.SIGKILL, nil, 0)
			unix.Close(sp.st.pidfd)
		}
		go func() { <-sp.st.ip.exit }()
		return nil, nil, nil
	}
	in.procsMu.Lock()
	alive := in.procs[sp.st.pid] == sp.st.ip
	in.procsMu.Unlock()
	if !alive {
		return drop()
	}
	fds := []int{int(files[0].Fd()), int(files[1].Fd()), int(files[2].Fd())}
	if err := sp.conn.Send(sc, fds...); err != nil {
		// Dead (its end is closed) or the config does not fit one
		// message: a fresh stage takes it.
		return drop()
	}
	// A report before exec, or EOF: its end closed on exec.
	var rep stageReport
	if _, err := sp.conn.Recv(&rep); err != nil {
		if errors.Is(err, initkit.ErrClosed) {
			return sp.st, nil, nil
		}
		// Not a report: it is not known to have stopped short of the
		// exec, so it is killed.
		unix.PidfdSendSignal(sp.st.pidfd, unix.SIGKILL, nil, 0)
		return sp.st, &stageReport{Code: boundary.ExitRefused, Err: "stage failed: " + err.Error()}, nil
	}
	if rep.Code == 0 {
		rep = stageReport{Code: boundary.ExitRefused, Err: "stage failed: " + rep.Err}
	}
	return sp.st, &rep, nil
}
