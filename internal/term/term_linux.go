// Package term gives a workload a terminal of its own: a pty that moat
// allocates and relays to the caller's terminal, so that the caller's
// terminal (its open file description, termios, window size, exclusive
// mode, file-status flags) never enters a sandbox.
//
// While relaying, the caller's terminal is in raw mode (when moat's stdin
// is a terminal); every key, ^C included, goes to the pty, whose line
// discipline signals the workload. The window size follows the caller's
// (SIGWINCH → TIOCSWINSZ on the master). Stop restores the termios and the
// file-status flags (O_NONBLOCK…) of the caller's stdin and stdout as they
// were at Start; callers defer it so that it runs on every exit path that
// returns (normal exit, workload killed, moat error, a forwarded signal).
// Only SIGKILL of moat itself, or a signal moat does not handle, can leave
// the caller's terminal raw.
package term

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Drain bounds: after the workload exited, its output is relayed until the
// pty hangs up or is quiet for drainQuiet, for at most drainMax.
const (
	drainQuiet = 150 * time.Millisecond
	drainMax   = 3 * time.Second
)

// IsTerminal reports whether f is a terminal.
func IsTerminal(f *os.File) bool {
	if f == nil {
		return false
	}
	_, err := unix.IoctlGetTermios(fdOf(f), unix.TCGETS)
	return err == nil
}

// saved is one caller descriptor's state at Start.
type saved struct {
	fd      int
	termios *unix.Termios // nil when not a terminal
	flags   int
	flagsOK bool
}

func save(fd int) saved {
	s := saved{fd: fd}
	if t, err := unix.IoctlGetTermios(fd, unix.TCGETS); err == nil {
		s.termios = t
	}
	if fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0); err == nil {
		s.flags, s.flagsOK = fl, true
	}
	return s
}

func (s saved) restore() error {
	var errs []error
	if s.flagsOK {
		if _, err := unix.FcntlInt(uintptr(s.fd), unix.F_SETFL, s.flags); err != nil {
			errs = append(errs, fmt.Errorf("fd %d: restoring file-status flags: %w", s.fd, err))
		}
	}
	if s.termios != nil {
		// TCSETSW: after the output relayed so far has been transmitted.
		if err := unix.IoctlSetTermios(s.fd, unix.TCSETSW, s.termios); err != nil {
			errs = append(errs, fmt.Errorf("fd %d: restoring terminal modes: %w", s.fd, err))
		}
	}
	return errors.Join(errs...)
}

// Relay is a pty given to a workload, relayed to the caller's stdin and
// stdout.
type Relay struct {
	master *os.File
	slave  *os.File
	in     int // caller's stdin
	out    int // caller's stdout
	saved  []saved

	onSignal atomic.Pointer[func(os.Signal)]
	sigMu    sync.Mutex
	pending  []os.Signal // typed before SetOnSignal, with no foreground group

	stopping  atomic.Bool
	stopR     *os.File // closed/written by Stop to end the stdin pump
	stopW     *os.File
	winch     chan os.Signal
	inDone    chan struct{}
	outDone   chan struct{}
	winchDone chan struct{}
	stopOnce  sync.Once
	stopErr   error
	drainFrom atomic.Int64 // unix nanos when the drain started
}

// Start allocates a pty for a workload. Its window size and, when stdin is
// a terminal, its modes are copied from the caller's terminal; the
// caller's terminal is then put in raw mode and relaying starts. in and
// out are moat's stdin and stdout (either or both may be terminals).
func Start(in, out *os.File) (r *Relay, err error) {
	master, slave, err := openPTY()
	if err != nil {
		return nil, err
	}
	r = &Relay{master: master, slave: slave, in: fdOf(in), out: fdOf(out),
		inDone: make(chan struct{}), outDone: make(chan struct{}), winchDone: make(chan struct{})}
	defer func() {
		if err != nil {
			master.Close()
			slave.Close()
		}
	}()
	r.saved = []saved{save(r.in)}
	if r.out != r.in {
		r.saved = append(r.saved, save(r.out))
	}
	sfd := fdOf(slave)
	if t := r.saved[0].termios; t != nil {
		tt := *t
		if err := unix.IoctlSetTermios(sfd, unix.TCSETS, &tt); err != nil {
			return nil, fmt.Errorf("pty: setting its modes: %w", err)
		}
	} else if t, err := unix.IoctlGetTermios(sfd, unix.TCGETS); err == nil {
		// Input from a pipe or file is not echoed back to the output.
		t.Lflag &^= unix.ECHO | unix.ECHONL
		unix.IoctlSetTermios(sfd, unix.TCSETS, t)
	}
	r.resize()
	r.stopR, r.stopW, err = os.Pipe()
	if err != nil {
		return nil, err
	}
	if t := r.saved[0].termios; t != nil {
		raw := *t
		makeRaw(&raw)
		if err := unix.IoctlSetTermios(r.in, unix.TCSETSW, &raw); err != nil {
			r.stopR.Close()
			r.stopW.Close()
			return nil, fmt.Errorf("putting the terminal in raw mode: %w", err)
		}
	}
	r.winch = make(chan os.Signal, 1)
	signal.Notify(r.winch, syscall.SIGWINCH)
	go r.pumpIn()
	go r.pumpOut()
	go func() {
		defer close(r.winchDone)
		for range r.winch {
			r.resize()
		}
	}()
	return r, nil
}

// openPTY opens a new pty pair; neither end becomes moat's controlling
// terminal.
func openPTY() (master, slave *os.File, err error) {
	// Non-blocking, so that os.NewFile puts the master in Go's poller:
	// reads can then be given deadlines and interrupted by Close.
	mfd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("pty: %w", err)
	}
	m := os.NewFile(uintptr(mfd), "/dev/ptmx")
	if err := unix.IoctlSetPointerInt(mfd, unix.TIOCSPTLCK, 0); err != nil {
		m.Close()
		return nil, nil, fmt.Errorf("pty: unlock: %w", err)
	}
	// TIOCGPTPEER opens the slave from the master, not by a /dev/pts path.
	fd, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(mfd), unix.TIOCGPTPEER, uintptr(unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC))
	if e != 0 {
		m.Close()
		return nil, nil, fmt.Errorf("pty: opening the slave: %w", e)
	}
	return m, os.NewFile(fd, "pty-slave"), nil
}

// fdOf returns f's descriptor without (*os.File).Fd, which would switch
// a non-blocking file (the caller's stdin, the master) to blocking mode.
func fdOf(f *os.File) int {
	fd := -1
	if rc, err := f.SyscallConn(); err == nil {
		rc.Control(func(u uintptr) { fd = int(u) })
	}
	return fd
}

// ctl runs f on the master's descriptor while it is open.
func (r *Relay) ctl(f func(mfd int)) {
	if rc, err := r.master.SyscallConn(); err == nil {
		rc.Control(func(u uintptr) { f(int(u)) })
	}
}

// termios returns the pty's modes (the slave's, read through the master).
func (r *Relay) termios() (*unix.Termios, error) {
	t, err := (*unix.Termios)(nil), error(unix.EBADF)
	r.ctl(func(mfd int) { t, err = unix.IoctlGetTermios(mfd, unix.TCGETS) })
	return t, err
}

// Slave is the pty's slave end, to give the workload as stdin, stdout,
// stderr and controlling terminal.
func (r *Relay) Slave() *os.File { return r.slave }

// CloseSlave closes moat's copy of the slave once the workload holds its
// own, so that the master sees the hangup when the workload is gone.
func (r *Relay) CloseSlave() {
	if r.slave != nil {
		r.slave.Close()
	}
}

// resize copies the caller's window size to the pty.
func (r *Relay) resize() {
	for _, fd := range []int{r.out, r.in} {
		if ws, err := unix.IoctlGetWinsize(fd, unix.TIOCGWINSZ); err == nil {
			r.ctl(func(mfd int) { unix.IoctlSetWinsize(mfd, unix.TIOCSWINSZ, ws) })
			return
		}
	}
}

// pumpIn relays the caller's stdin to the master. It polls stdin together
// with the stop pipe, so that it ends when Stop asks, and never changes
// stdin's flags.
func (r *Relay) pumpIn() {
	defer close(r.inDone)
	buf := make([]byte, 4096)
	last := byte('\n')
	fds := []unix.PollFd{{Fd: int32(r.in), Events: unix.POLLIN}, {Fd: int32(r.stopR.Fd()), Events: unix.POLLIN}}
	for {
		fds[0].Revents, fds[1].Revents = 0, 0
		if _, err := unix.Poll(fds, -1); err != nil {
			if err == unix.EINTR {
				continue
			}
			return
		}
		if fds[1].Revents != 0 {
			return
		}
		if fds[0].Revents&(unix.POLLIN|unix.POLLHUP|unix.POLLERR) == 0 {
			continue
		}
		n, err := unix.Read(r.in, buf)
		if err == unix.EINTR || err == unix.EAGAIN {
			continue
		}
		if n <= 0 {
			// End of input: a pipe or file ended, or the terminal hung
			// up. A canonical-mode reader gets its end-of-file.
			r.sendEOF(last)
			return
		}
		r.interrupts(buf[:n])
		if _, err := r.master.Write(buf[:n]); err != nil {
			return
		}
		last = buf[n-1]
	}
}

// sendEOF types the pty's EOF character (twice after a partial line).
func (r *Relay) sendEOF(last byte) {
	t, err := r.termios()
	if err != nil || t.Lflag&unix.ICANON == 0 {
		return
	}
	eof := []byte{t.Cc[unix.VEOF]}
	if last != '\n' {
		r.master.Write(eof)
	}
	r.master.Write(eof)
}

// SetOnSignal sets f to be called with SIGINT or SIGQUIT when the caller
// types the pty's interrupt or quit character and the pty is no process's
// controlling terminal (a backend that cannot make it one); with a
// controlling terminal the pty's line discipline signals the workload
// itself. One typed before SetOnSignal while the pty had no foreground
// process group (the workload not started yet: the line discipline would
// drop it) is kept and given to f here (found by the ^C loop under a pty:
// a ^C typed just after the terminal went raw was lost, and the run went
// on).
func (r *Relay) SetOnSignal(f func(os.Signal)) {
	r.sigMu.Lock()
	r.onSignal.Store(&f)
	pending := r.pending
	r.pending = nil
	r.sigMu.Unlock()
	for _, sig := range pending {
		f(sig)
	}
}

// interrupts delivers ^C/^\ through the OnSignal function when the pty has no
// foreground process group to deliver them to.
func (r *Relay) interrupts(b []byte) {
	t, err := r.termios()
	if err != nil || t.Lflag&unix.ISIG == 0 {
		return
	}
	pg := -1
	r.ctl(func(mfd int) { pg, err = unix.IoctlGetInt(mfd, unix.TIOCGPGRP) })
	if err != nil || pg != 0 {
		return // the line discipline signals the foreground group
	}
	var sigs []os.Signal
	for _, c := range b {
		switch {
		case c == t.Cc[unix.VINTR] && c != 0:
			sigs = append(sigs, syscall.SIGINT)
		case c == t.Cc[unix.VQUIT] && c != 0:
			sigs = append(sigs, syscall.SIGQUIT)
		}
	}
	if len(sigs) == 0 {
		return
	}
	r.sigMu.Lock()
	fp := r.onSignal.Load()
	if fp == nil {
		if len(r.pending) < 8 {
			r.pending = append(r.pending, sigs...)
		}
		r.sigMu.Unlock()
		return
	}
	r.sigMu.Unlock()
	for _, sig := range sigs {
		(*fp)(sig)
	}
}

// pumpOut relays the master to the caller's stdout until the pty hangs up
// (every slave closed), or, once Stop began, it has been quiet a while.
func (r *Relay) pumpOut() {
	defer close(r.outDone)
	buf := make([]byte, 32*1024)
	for {
		n, err := r.master.Read(buf)
		if n > 0 {
			if writeAll(r.out, buf[:n]) != nil {
				return
			}
			if r.stopping.Load() {
				if time.Since(time.Unix(0, r.drainFrom.Load())) > drainMax {
					return
				}
				r.master.SetReadDeadline(time.Now().Add(drainQuiet))
			}
		}
		if err != nil {
			return // EIO: hung up; a deadline: quiet; closed: stopped
		}
	}
}

// writeAll writes b to fd, waiting when fd is non-blocking and full.
func writeAll(fd int, b []byte) error {
	for len(b) > 0 {
		n, err := unix.Write(fd, b)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}, 1000)
			continue
		case err != nil:
			return err
		}
		b = b[n:]
	}
	return nil
}

// Stop relays what the workload wrote before it exited, stops relaying,
// and restores the caller's stdin and stdout: terminal modes and
// file-status flags as they were at Start. It is idempotent; the error
// says what could not be restored.
func (r *Relay) Stop() error {
	r.stopOnce.Do(func() {
		r.drainFrom.Store(time.Now().UnixNano())
		r.stopping.Store(true)
		r.master.SetReadDeadline(time.Now().Add(drainQuiet))
		<-r.outDone
		signal.Stop(r.winch)
		close(r.winch)
		<-r.winchDone
		r.stopW.Write([]byte{0})
		r.master.Close() // unblocks a write to a full pty
		<-r.inDone
		r.stopR.Close()
		r.stopW.Close()
		r.slave.Close()
		var errs []error
		for _, s := range r.saved {
			if err := s.restore(); err != nil {
				errs = append(errs, err)
			}
		}
		r.stopErr = errors.Join(errs...)
	})
	return r.stopErr
}

// makeRaw is cfmakeraw(3).
func makeRaw(t *unix.Termios) {
	t.Iflag &^= unix.IGNBRK | unix.BRKINT | unix.PARMRK | unix.ISTRIP | unix.INLCR | unix.IGNCR | unix.ICRNL | unix.IXON
	t.Oflag &^= unix.OPOST
	t.Lflag &^= unix.ECHO | unix.ECHONL | unix.ICANON | unix.ISIG | unix.IEXTEN
	t.Cflag &^= unix.CSIZE | unix.PARENB
	t.Cflag |= unix.CS8
	t.Cc[unix.VMIN] = 1
	t.Cc[unix.VTIME] = 0
}
