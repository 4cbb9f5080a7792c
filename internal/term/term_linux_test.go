package term

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/reexec/reexectest"
	"github.com/moat-sandbox/moat/internal/testenv"
)

// workloadHelper doubles the test binary as the workload: on its stdin
// terminal it reads a line, then turns echo off, sets the window size to
// 7x5, sets O_NONBLOCK and TIOCEXCL, and says each.
var workloadHelper = reexectest.Helper("term-workload", workload)

func TestMain(m *testing.M) { reexectest.Main(m, workloadHelper) }

func workload([]string) int {
	if _, err := unix.IoctlGetTermios(0, unix.TCGETS); err == nil {
		fmt.Println("isatty yes")
	}
	line := make([]byte, 100)
	n, _ := unix.Read(0, line)
	fmt.Printf("got %s\n", strings.TrimSpace(string(line[:n])))
	steps := []struct {
		name string
		f    func() error
	}{
		{"-echo", func() error {
			t, err := unix.IoctlGetTermios(0, unix.TCGETS)
			if err != nil {
				return err
			}
			t.Lflag &^= unix.ECHO
			return unix.IoctlSetTermios(0, unix.TCSETS, t)
		}},
		{"winsize", func() error { return unix.IoctlSetWinsize(0, unix.TIOCSWINSZ, &unix.Winsize{Row: 5, Col: 7}) }},
		{"nonblock", func() error { return unix.SetNonblock(0, true) }},
		{"excl", func() error { return unix.IoctlSetInt(0, unix.TIOCEXCL, 0) }},
	}
	for _, s := range steps {
		if err := s.f(); err != nil {
			fmt.Printf("%s failed: %v\n", s.name, err)
			return 1
		}
	}
	fmt.Println("workload done")
	return 0
}

// callerTTY is a pty standing in for the caller's terminal: moat's side is
// the slave, the test's (the "terminal emulator") the master.
func callerTTY(t *testing.T) (emu, tty *os.File) {
	t.Helper()
	m, s, err := openPTY()
	testenv.Need(t, err == nil, fmt.Sprintf("no pty: %v", err))
	t.Cleanup(func() { m.Close(); s.Close() })
	if err := unix.IoctlSetWinsize(fdOf(m), unix.TIOCSWINSZ, &unix.Winsize{Row: 31, Col: 97}); err != nil {
		t.Fatal(err)
	}
	return m, s
}

type ttyState struct {
	termios unix.Termios
	flags   int
	ws      unix.Winsize
}

func stateOf(t *testing.T, f *os.File) ttyState {
	t.Helper()
	tio, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	if err != nil {
		t.Fatal(err)
	}
	fl, err := unix.FcntlInt(f.Fd(), unix.F_GETFL, 0)
	if err != nil {
		t.Fatal(err)
	}
	ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ)
	if err != nil {
		t.Fatal(err)
	}
	return ttyState{*tio, fl, *ws}
}

// readUntil reads the emulator side until want appears.
func readUntil(t *testing.T, f *os.File, want string) string {
	t.Helper()
	var acc []byte
	buf := make([]byte, 4096)
	f.SetReadDeadline(time.Now().Add(10 * time.Second))
	for !bytes.Contains(acc, []byte(want)) {
		n, err := f.Read(buf)
		acc = append(acc, buf[:n]...)
		if err != nil {
			t.Fatalf("waiting for %q: %v (got %q)", want, err, acc)
		}
	}
	return string(acc)
}

// The workload gets the relay's pty as its terminal: what it changes there
// (echo, O_NONBLOCK, TIOCEXCL, window size) stays off the caller's
// terminal, which is raw while relaying and exactly as before after Stop.
func TestRelayKeepsCallerTerminal(t *testing.T) {
	emu, tty := callerTTY(t)
	before := stateOf(t, tty)
	r, err := Start(tty, tty)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	if st := stateOf(t, tty); st.termios.Lflag&(unix.ECHO|unix.ICANON|unix.ISIG) != 0 {
		t.Errorf("the caller's terminal is not raw while relaying: lflag %#x", st.termios.Lflag)
	}
	if ws, _ := unix.IoctlGetWinsize(int(r.Slave().Fd()), unix.TIOCGWINSZ); ws.Row != 31 || ws.Col != 97 {
		t.Errorf("the pty's window size %dx%d is not the caller's 97x31", ws.Col, ws.Row)
	}
	cmd := reexectest.Command(workloadHelper.Name)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = r.Slave(), r.Slave(), r.Slave()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r.CloseSlave()
	readUntil(t, emu, "isatty yes")
	// Typed input reaches the workload through the relay.
	time.Sleep(200 * time.Millisecond)
	emu.Write([]byte("hello\r"))
	if err := cmd.Wait(); err != nil {
		t.Fatalf("workload: %v", err)
	}
	if err := r.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	out := readUntil(t, emu, "workload done")
	if !strings.Contains(out, "got hello") {
		t.Errorf("typed input did not reach the workload: %q", out)
	}
	after := stateOf(t, tty)
	if after != before {
		t.Errorf("the caller's terminal changed:\nbefore %+v\nafter  %+v", before, after)
	}
	// TIOCEXCL would make a second open fail with EBUSY (for non-root).
	n, err := unix.IoctlGetInt(int(tty.Fd()), unix.TIOCGEXCL)
	if err == nil && n != 0 {
		t.Errorf("the caller's terminal was left in exclusive mode")
	}
}

// Positive control for the test above: the same workload given the
// caller's terminal directly leaves it changed.
func TestDirectTerminalIsChanged(t *testing.T) {
	emu, tty := callerTTY(t)
	before := stateOf(t, tty)
	cmd := reexectest.Command(workloadHelper.Name)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
	done := make(chan error, 1)
	go func() { done <- cmd.Run() }()
	readUntil(t, emu, "isatty yes")
	time.Sleep(200 * time.Millisecond)
	emu.Write([]byte("hello\r"))
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	after := stateOf(t, tty)
	if after.termios.Lflag&unix.ECHO != 0 || after.ws.Row != 5 || after.flags&unix.O_NONBLOCK == 0 {
		t.Errorf("the control workload did not change the terminal (%+v); the relay test proves nothing", after)
	}
	if n, err := unix.IoctlGetInt(fdOf(tty), unix.TIOCGEXCL); err != nil || n == 0 {
		t.Errorf("the control workload did not set TIOCEXCL (%d %v)", n, err)
	}
	unix.IoctlSetInt(fdOf(tty), unix.TIOCNXCL, 0)
	_ = before
}

// SIGWINCH: the caller's new window size reaches the pty.
func TestRelayFollowsWindowSize(t *testing.T) {
	emu, tty := callerTTY(t)
	r, err := Start(tty, tty)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	unix.IoctlSetWinsize(fdOf(emu), unix.TIOCSWINSZ, &unix.Winsize{Row: 44, Col: 132})
	syscall.Kill(os.Getpid(), syscall.SIGWINCH) // the terminal signals its foreground group, not this test
	deadline := time.Now().Add(5 * time.Second)
	for {
		ws, _ := unix.IoctlGetWinsize(int(r.Slave().Fd()), unix.TIOCGWINSZ)
		if ws.Row == 44 && ws.Col == 132 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pty window size %dx%d, want 132x44", ws.Col, ws.Row)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Input from a pipe is relayed, ended with the pty's EOF character, and
// the pipe's flags are restored too.
func TestRelayFromPipe(t *testing.T) {
	emu, tty := callerTTY(t)
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	r, err := Start(pr, tty)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	cmd := exec.Command("sh", "-c", `[ -t 0 ] && echo tty; cat; echo "cat done"`)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = r.Slave(), r.Slave(), r.Slave()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r.CloseSlave()
	pw.Write([]byte("line one\npartial"))
	pw.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	r.Stop()
	out := readUntil(t, emu, "cat done")
	if !strings.Contains(out, "tty") || !strings.Contains(out, "line one") || !strings.Contains(out, "partial") {
		t.Errorf("relayed output: %q", out)
	}
	if strings.Count(out, "line one") != 1 {
		t.Errorf("input from a pipe was echoed: %q", out)
	}
}

// TestRelayKeepsEarlyInterrupt: ^C typed while the pty has no foreground
// process group and before SetOnSignal (the workload not started yet) is
// given to the function SetOnSignal sets, once; with nothing typed, it
// gets nothing (the control).
func TestRelayKeepsEarlyInterrupt(t *testing.T) {
	for _, typed := range []bool{true, false} {
		emu, tty := callerTTY(t)
		r, err := Start(tty, tty)
		if err != nil {
			t.Fatal(err)
		}
		if typed {
			emu.Write([]byte{3})
		}
		emu.Write([]byte("x\r"))
		// The relay has read what was typed once the line reaches the pty.
		deadline := time.Now().Add(10 * time.Second)
		for {
			var n int
			n, _ = unix.IoctlGetInt(int(r.Slave().Fd()), unix.TIOCINQ)
			if n > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("typed input did not reach the pty")
			}
			time.Sleep(5 * time.Millisecond)
		}
		var got []os.Signal
		r.SetOnSignal(func(s os.Signal) { got = append(got, s) })
		r.Stop()
		want := 0
		if typed {
			want = 1
		}
		if len(got) != want || want == 1 && got[0] != syscall.SIGINT {
			t.Errorf("typed ^C %v: got %v, want %d SIGINT", typed, got, want)
		}
	}
}
