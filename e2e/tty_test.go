//go:build linux

package e2e

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/internal/testenv"
)

// A terminal for moat: the test is the terminal emulator (the master) and
// moat gets the slave as its stdio and controlling terminal, in the
// terminal's foreground, as from an interactive shell.
type testTTY struct {
	emu  *os.File // master, non-blocking so that reads take deadlines
	tty  *os.File // slave: moat's stdin, stdout, stderr
	emuF int
	ttyF int
}

func newTestTTY(t *testing.T) *testTTY {
	t.Helper()
	mfd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	testenv.Need(t, err == nil, fmt.Sprintf("no /dev/ptmx: %v", err))
	if err := unix.IoctlSetPointerInt(mfd, unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	sfd, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(mfd), unix.TIOCGPTPEER, uintptr(unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC))
	if e != 0 {
		t.Fatalf("TIOCGPTPEER: %v", e)
	}
	if err := unix.IoctlSetWinsize(mfd, unix.TIOCSWINSZ, &unix.Winsize{Row: 31, Col: 97}); err != nil {
		t.Fatal(err)
	}
	p := &testTTY{emu: os.NewFile(uintptr(mfd), "ptmx"), tty: os.NewFile(sfd, "pts"), emuF: mfd, ttyF: int(sfd)}
	t.Cleanup(func() { p.emu.Close(); p.tty.Close() })
	return p
}

// ttyState is everything of a terminal a workload must not change.
type ttyState struct {
	termios unix.Termios
	flags   int
	ws      unix.Winsize
	excl    int
}

func (p *testTTY) state(t *testing.T) ttyState {
	t.Helper()
	tio, err := unix.IoctlGetTermios(p.ttyF, unix.TCGETS)
	if err != nil {
		t.Fatal(err)
	}
	fl, err := unix.FcntlInt(uintptr(p.ttyF), unix.F_GETFL, 0)
	if err != nil {
		t.Fatal(err)
	}
	ws, err := unix.IoctlGetWinsize(p.ttyF, unix.TIOCGWINSZ)
	if err != nil {
		t.Fatal(err)
	}
	excl, err := unix.IoctlGetInt(p.ttyF, unix.TIOCGEXCL)
	if err != nil {
		t.Fatal(err)
	}
	return ttyState{*tio, fl, *ws, excl}
}

// start runs argv with the slave as stdio and controlling terminal.
func (p *testTTY) start(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	cmd.Stdin, cmd.Stdout, cmd.Stderr = p.tty, p.tty, p.tty
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
}

// readUntil reads what was written to the terminal until want appears.
func (p *testTTY) readUntil(t *testing.T, acc *bytes.Buffer, want string, d time.Duration) {
	t.Helper()
	buf := make([]byte, 4096)
	p.emu.SetReadDeadline(time.Now().Add(d))
	for !strings.Contains(acc.String(), want) {
		n, err := p.emu.Read(buf)
		acc.Write(buf[:n])
		if err != nil {
			t.Fatalf("waiting for %q on the terminal: %v; it shows:\n%q", want, err, acc.String())
		}
	}
}

// ttyScript reports whether stdin is a terminal and its size, reads a
// typed line, then changes everything it can of its terminal: echo off,
// window size, O_NONBLOCK and exclusive mode (TIOCEXCL).
const ttyScript = `[ -t 0 ] && echo "isatty yes"; echo "size $(stty size)"; read line; echo "got $line"; ` + ttyMess + `echo "messed up"`

// ttyMess changes what it can of its stdin; each step says when it fails
// (on gVisor stdin is no terminal inside: see ttyBackends).
const ttyMess = `stty -echo rows 5 cols 7 || echo "stty failed"; ` +
	`perl -e 'use Fcntl; fcntl(STDIN, F_SETFL, fcntl(STDIN, F_GETFL, 0)|O_NONBLOCK) or die "nonblock: $!"'; ` +
	`perl -e 'ioctl(STDIN, 0x540C, 0) or die "TIOCEXCL: $!"'; `

// ttyPolicy grants the system directories read-only and nothing
// read-write: the terminal is all these workloads use.
func ttyPolicy(e *env) string {
	e.t.Helper()
	p := filepath.Join(e.dir, "tty-policy.yaml")
	y := fmt.Sprintf(`version: 1
filesystem:
  read_only: [/usr, /bin, /lib, /lib64]
process:
  env: {PATH: /usr/bin:/bin}
audit:
  dir: %s
`, e.auditDir)
	if err := os.WriteFile(p, []byte(y), 0o644); err != nil {
		e.t.Fatal(err)
	}
	return p
}

// ttyBackends: native, and as root gVisor. On gVisor the workload's
// terminal is the pty too (a terminal OCI process, whose console is
// runsc exec's controlling terminal, the pty), with the caller's size, and
// a signal moat forwards goes to the process inside (runsc kill --pid),
// so the exit code is the workload's there too. The caller's terminal
// staying as it was is checked on both (runsc sets O_NONBLOCK on the
// descriptions it imports).
func ttyBackends(t *testing.T) []string {
	b := []string{"native"}
	if os.Geteuid() == 0 {
		_, err := exec.LookPath("runsc")
		testenv.Need(t, err == nil, "runsc is not installed")
		b = append(b, "gvisor")
	}
	return b
}

// On a terminal, the workload gets a pty of moat's: it is a terminal, it
// has the caller's window size, typed input and its output are relayed,
// and what it changes of its terminal leaves the caller's exactly as it
// was (termios, file-status flags, window size, exclusive mode).
func TestRunTerminalIsRelayed(t *testing.T) {
	e := newEnv(t)
	pol := ttyPolicy(e)
	for _, backend := range ttyBackends(t) {
		t.Run(backend, func(t *testing.T) {
			p := newTestTTY(t)
			before := p.state(t)
			cmd := e.command("run", "--backend", backend, "--policy", pol, "--", "sh", "-c", ttyScript)
			p.start(t, cmd)
			defer cmd.Process.Kill()
			var out bytes.Buffer
			p.readUntil(t, &out, "size ", 60*time.Second)
			p.readUntil(t, &out, "\n", 5*time.Second)
			// moat's terminal is raw while it relays.
			if st := p.state(t); st.termios.Lflag&(unix.ICANON|unix.ECHO|unix.ISIG) != 0 {
				t.Errorf("the caller's terminal is not raw while relaying: lflag %#x", st.termios.Lflag)
			}
			p.emu.Write([]byte("hello\r"))
			p.readUntil(t, &out, "messed up", 30*time.Second)
			if err := cmd.Wait(); err != nil {
				t.Fatalf("moat: %v; terminal:\n%s", err, out.String())
			}
			s := out.String()
			if !strings.Contains(s, "isatty yes") {
				t.Errorf("the workload's stdin is not a terminal:\n%s", s)
			}
			if !strings.Contains(s, "size 31 97") {
				t.Errorf("the workload's terminal does not have the caller's size 97x31:\n%s", s)
			}
			if !strings.Contains(s, "got hello") {
				t.Errorf("typed input did not reach the workload:\n%s", s)
			}
			if after := p.state(t); after != before {
				t.Errorf("the caller's terminal changed:\nbefore %+v\nafter  %+v", before, after)
			}
		})
	}
}

// Control for the test above: the same script given the terminal directly
// (no moat) changes every one of the things compared.
func TestTerminalScriptChangesADirectTerminal(t *testing.T) {
	_, err := exec.LookPath("perl")
	testenv.Need(t, err == nil, "perl is not installed")
	p := newTestTTY(t)
	before := p.state(t)
	cmd := exec.Command("sh", "-c", ttyScript)
	p.start(t, cmd)
	var out bytes.Buffer
	p.readUntil(t, &out, "isatty yes", 10*time.Second)
	p.emu.Write([]byte("hello\r"))
	p.readUntil(t, &out, "messed up", 10*time.Second)
	cmd.Wait()
	after := p.state(t)
	if after.termios.Lflag&unix.ECHO != 0 || after.termios == before.termios {
		t.Errorf("echo not turned off")
	}
	if after.flags&unix.O_NONBLOCK == 0 {
		t.Errorf("O_NONBLOCK not set")
	}
	if after.ws.Row != 5 || after.ws.Col != 7 {
		t.Errorf("window size not changed: %+v", after.ws)
	}
	if after.excl == 0 {
		t.Errorf("TIOCEXCL not set")
	}
}

// Every way the run ends restores the caller's terminal: the workload
// killed, moat sent SIGTERM (forwarded), ^C typed (relayed to the pty,
// whose line discipline or moat signals the workload).
func TestRunTerminalRestoredOnEveryExit(t *testing.T) {
	e := newEnv(t)
	pol := ttyPolicy(e)
	prep := ttyMess
	for _, backend := range ttyBackends(t) {
		for _, tc := range []struct {
			name   string
			script string
			act    func(p *testTTY, cmd *exec.Cmd)
			code   int
		}{
			{"workload killed", prep + `echo ready; kill -9 $$`, nil, 137},
			{"SIGTERM to moat", prep + `trap 'exit 42' TERM; echo ready; while :; do sleep 0.1; done`,
				func(p *testTTY, cmd *exec.Cmd) { cmd.Process.Signal(syscall.SIGTERM) }, 42},
			{"^C typed", prep + `trap 'exit 43' INT; echo ready; while :; do sleep 0.1; done`,
				func(p *testTTY, cmd *exec.Cmd) { p.emu.Write([]byte{3}) }, 43},
		} {
			t.Run(backend+"/"+tc.name, func(t *testing.T) {
				p := newTestTTY(t)
				before := p.state(t)
				cmd := e.command("run", "--backend", backend, "--policy", pol, "--", "sh", "-c", tc.script)
				p.start(t, cmd)
				defer cmd.Process.Kill()
				var out bytes.Buffer
				p.readUntil(t, &out, "ready", 60*time.Second)
				if tc.act != nil {
					time.Sleep(200 * time.Millisecond) // the trap is set
					tc.act(p, cmd)
				}
				done := make(chan struct{})
				go func() { cmd.Wait(); close(done) }()
				select {
				case <-done:
				case <-time.After(30 * time.Second):
					t.Fatalf("moat did not exit; terminal:\n%q", out.String())
				}
				if got := cmd.ProcessState.ExitCode(); got != tc.code {
					t.Errorf("exit %d, want %d; terminal:\n%q", got, tc.code, out.String())
				}
				if after := p.state(t); after != before {
					t.Errorf("the caller's terminal changed:\nbefore %+v\nafter  %+v", before, after)
				}
			})
		}
	}
}

// moat sandbox exec on a terminal uses the same relay: the process is on
// a pty of the client's, the caller's terminal stays as it was, and a
// signal to the client (and ^C typed) reaches the process.
func TestSandboxExecTerminalIsRelayed(t *testing.T) {
	e := newEnv(t)
	pol := ttyPolicy(e)
	if r := e.moat("sandbox", "create", "--name", "tty", "--policy", pol); r.code != 0 {
		t.Fatalf("create: %s", r)
	}
	defer e.moat("sandbox", "delete", "tty")
	p := newTestTTY(t)
	before := p.state(t)
	cmd := e.command("sandbox", "exec", "tty", "--tty", "--", "sh", "-c", ttyScript)
	p.start(t, cmd)
	defer cmd.Process.Kill()
	var out bytes.Buffer
	p.readUntil(t, &out, "size ", 60*time.Second)
	p.readUntil(t, &out, "\n", 5*time.Second)
	p.emu.Write([]byte("hello\r"))
	p.readUntil(t, &out, "messed up", 30*time.Second)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exec: %v; terminal:\n%s", err, out.String())
	}
	s := out.String()
	for _, want := range []string{"isatty yes", "size 31 97", "got hello"} {
		if !strings.Contains(s, want) {
			t.Errorf("the terminal does not show %q:\n%s", want, s)
		}
	}
	if after := p.state(t); after != before {
		t.Errorf("the caller's terminal changed:\nbefore %+v\nafter  %+v", before, after)
	}
	for _, tc := range []struct {
		name string
		act  func(cmd *exec.Cmd)
		code int
	}{
		{"SIGTERM to the client", func(cmd *exec.Cmd) { cmd.Process.Signal(syscall.SIGTERM) }, 42},
		{"^C typed", func(*exec.Cmd) { p.emu.Write([]byte{3}) }, 43},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := p.state(t)
			cmd := e.command("sandbox", "exec", "tty", "--", "sh", "-c",
				ttyMess+`trap 'exit 42' TERM; trap 'exit 43' INT; echo ready; while :; do sleep 0.1; done`)
			p.start(t, cmd)
			defer cmd.Process.Kill()
			var out bytes.Buffer
			p.readUntil(t, &out, "ready", 30*time.Second)
			time.Sleep(200 * time.Millisecond)
			tc.act(cmd)
			done := make(chan struct{})
			go func() { cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				t.Fatalf("the client did not exit; terminal:\n%q", out.String())
			}
			if got := cmd.ProcessState.ExitCode(); got != tc.code {
				t.Errorf("exit %d, want %d; terminal:\n%q", got, tc.code, out.String())
			}
			if after := p.state(t); after != before {
				t.Errorf("the caller's terminal changed:\nbefore %+v\nafter  %+v", before, after)
			}
		})
	}
}

// TestRunCtrlCLoop: ^C typed at a real terminal at many offsets from
// moat run's start: during start-up (the terminal still cooked, so the
// line discipline signals moat, which stops the start) and while the
// workload runs (moat's terminal raw, the ^C relayed to the workload's
// pty, whose line discipline signals the workload). Every time: moat
// exits 130 (128+SIGINT), or, before it installed its handler, dies of
// SIGINT itself having made no run; the run's journal verifies with a
// terminal record of exit code 130 (never "failed", the 125 of the
// newcomer's report); nothing of the run is left in the temporary
// directory or in cgroupfs. Native: 200 tries in CI (CI=true or
// MOAT_REQUIRE_ALL=1) as root, 50 in CI's second pass as uid 65534 (the
// same start without cgroups; 200 more would add 40 s), 20 elsewhere,
// offsets 0-300 ms (a native start takes about 100-250 ms here; 200 tries
// take 40-65 s on CI's host). gVisor (as root): 5 tries in CI, 2
// elsewhere, offsets 0-2.5 s: a gVisor run takes 2-3 s to start and end,
// so 200 would take 10 minutes. Seeded; the seed is logged
// (MOAT_SIGNAL_SEED replays it).
func TestRunCtrlCLoop(t *testing.T) {
	e := newEnv(t)
	pol := ttyPolicy(e)
	ci := os.Getenv("CI") == "true" || testenv.RequireAll()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("MOAT_SIGNAL_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d (MOAT_SIGNAL_SEED replays it)", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	for _, backend := range ttyBackends(t) {
		tries, span := 20, 300*time.Millisecond
		switch {
		case ci && os.Geteuid() == 0:
			tries = 200
		case ci:
			tries = 50
		}
		if backend == "gvisor" {
			tries, span = 2, 2500*time.Millisecond
			if ci {
				tries = 5
			}
		}
		t.Run(backend, func(t *testing.T) {
			start := time.Now()
			outcomes := map[string]int{}
			for i := range tries {
				delay := time.Duration(rng.Int64N(int64(span)))
				outcomes[ctrlCTry(t, e, pol, backend, i, delay)]++
			}
			t.Logf("%d tries in %v: %v", tries, time.Since(start).Round(time.Millisecond), outcomes)
		})
	}
}

// ctrlCTry is one try of TestRunCtrlCLoop; it returns the outcome.
func ctrlCTry(t *testing.T, e *env, pol, backend string, i int, delay time.Duration) string {
	t.Helper()
	auditDir := filepath.Join(e.dir, fmt.Sprintf("ctrlc-%s-%d", backend, i))
	p := newTestTTY(t)
	cmd := e.command("run", "--backend", backend, "--policy", pol, "--audit-dir", auditDir, "--", "/bin/sleep", "30")
	p.start(t, cmd)
	defer cmd.Process.Kill()
	// What moat writes to the terminal is drained so that it never blocks.
	var out bytes.Buffer
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		buf := make([]byte, 4096)
		p.emu.SetReadDeadline(time.Now().Add(60 * time.Second))
		for {
			n, err := p.emu.Read(buf)
			out.Write(buf[:n])
			if err != nil {
				return
			}
		}
	}()
	time.Sleep(delay)
	if _, err := p.emu.Write([]byte{3}); err != nil {
		t.Fatalf("try %d: typing ^C: %v", i, err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		// Its goroutines' stacks, on the terminal, say where it hangs.
		cmd.Process.Signal(syscall.SIGQUIT)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		p.emu.SetReadDeadline(time.Now().Add(time.Second))
		<-drained
		t.Fatalf("try %d (^C after %v): moat did not exit; terminal:\n%s", i, delay, out.String())
	}
	p.emu.SetReadDeadline(time.Now())
	<-drained
	ws := cmd.ProcessState.Sys().(syscall.WaitStatus)
	runs, _ := filepath.Glob(filepath.Join(auditDir, "*"))
	fail := func(format string, a ...any) {
		t.Helper()
		var journals strings.Builder
		for _, run := range runs {
			b, _ := os.ReadFile(filepath.Join(run, audit.JournalFile))
			lines := strings.Split(strings.TrimSpace(string(b)), "\n")
			for _, l := range lines[max(0, len(lines)-3):] {
				if len(l) > 400 {
					l = l[:400] + "…"
				}
				journals.WriteString("\n  " + l)
			}
		}
		t.Fatalf("try %d (^C after %v): %s; terminal:\n%q\njournal's last records:%s", i, delay, fmt.Sprintf(format, a...), out.String(), journals.String())
	}
	outcome := "exit 130"
	switch {
	case ws.Exited() && ws.ExitStatus() == 130:
	case ws.Signaled() && ws.Signal() == syscall.SIGINT && len(runs) == 0:
		outcome = "killed before its handler, no run"
	default:
		fail("moat ended with %v (made %d runs), want exit 130", ws, len(runs))
	}
	if len(runs) > 1 {
		fail("%d run directories: %v", len(runs), runs)
	}
	for _, run := range runs {
		res, _ := audit.VerifyFiles(filepath.Join(run, audit.JournalFile), filepath.Join(run, audit.PublicKeyFile), "")
		if res.Status != audit.Complete || res.Terminal == nil {
			fail("the journal of %s is not complete: %s", run, res.Reason)
		}
		if res.Terminal.ExitCode != 130 || res.Terminal.Reason == audit.ReasonFailed {
			fail("terminal record %+v, want exit code 130 and not failed", *res.Terminal)
		}
		outcome += " (" + string(res.Terminal.Reason) + ")"
		id := filepath.Base(run)
		left := func() []string {
			m, _ := filepath.Glob(filepath.Join(os.TempDir(), "moat-"+id+"-*"))
			for _, pat := range []string{"/sys/fs/cgroup/moat-", "/sys/fs/cgroup/*/moat-", "/sys/fs/cgroup/*" + ownCgroupV1("memory") + "/moat-", "/sys/fs/cgroup/*" + ownCgroupV1("pids") + "/moat-"} {
				c, _ := filepath.Glob(pat + id)
				m = append(m, c...)
			}
			return m
		}
		if !pollUntil(10*time.Second, func() bool { return len(left()) == 0 }) {
			fail("left behind: %v", left())
		}
	}
	return outcome
}
