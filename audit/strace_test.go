package audit

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/internal/testenv"
)

// syscallEvent is one system call from an strace -f log: its name, its
// text up to the return value, and the log lines where it began and ended.
type syscallEvent struct {
	name, args, ret string
	start, end      int
}

var (
	straceLine    = regexp.MustCompile(`^(\d+)\s+(.*)$`)
	straceResumed = regexp.MustCompile(`^<\.\.\. (\w+) resumed>(.*)$`)
	straceCall    = regexp.MustCompile(`^(\w+)\((.*)$`)
)

// parseStrace reads an `strace -f` log into completed system calls, in the
// order they began, joining "<unfinished ...>" and "<... resumed>" halves.
func parseStrace(log string) []syscallEvent {
	var out []*syscallEvent
	pending := map[string]*syscallEvent{}
	for i, l := range strings.Split(log, "\n") {
		m := straceLine.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		pid, rest := m[1], m[2]
		if r := straceResumed.FindStringSubmatch(rest); r != nil {
			if ev := pending[pid]; ev != nil && ev.name == r[1] {
				ev.end, ev.ret = i, retOf(r[2])
				delete(pending, pid)
			}
			continue
		}
		c := straceCall.FindStringSubmatch(rest)
		if c == nil {
			continue
		}
		ev := &syscallEvent{name: c[1], args: c[2], start: i, end: i}
		out = append(out, ev)
		if strings.HasSuffix(rest, "<unfinished ...>") {
			pending[pid] = ev
		} else {
			ev.ret = retOf(c[2])
		}
	}
	var evs []syscallEvent
	for _, ev := range out {
		evs = append(evs, *ev)
	}
	return evs
}

func retOf(s string) string {
	i := strings.LastIndex(s, " = ")
	if i < 0 {
		return ""
	}
	return strings.Fields(s[i+3:])[0]
}

// checkSyncBeforeAck checks, for every "ACK <line hash>" written to
// stdout, that an fsync of the journal's fd began after that line's
// write(2) had returned and returned 0 before the ACK's write began.
// lines are the journal's lines in order.
func checkSyncBeforeAck(evs []syscallEvent, lines []string) error {
	jfd, opened := "", 0
	for _, ev := range evs {
		if ev.name == "openat" && strings.Contains(ev.args, JournalFile) && ev.ret != "" && ev.ret[0] != '-' {
			jfd, opened = ev.ret, ev.end
		}
	}
	if jfd == "" {
		return fmt.Errorf("no openat of %s in the trace", JournalFile)
	}
	var writes, syncs []syscallEvent
	acks := map[string]syscallEvent{}
	for _, ev := range evs {
		switch {
		case ev.start <= opened: // the fd number may have served another file before
		case ev.name == "write" && strings.HasPrefix(ev.args, jfd+", "):
			writes = append(writes, ev)
		case (ev.name == "fsync" || ev.name == "fdatasync") && (strings.HasPrefix(ev.args, jfd+")") || strings.HasPrefix(ev.args, jfd+" <unfinished")) && ev.ret == "0":
			syncs = append(syncs, ev)
		case ev.name == "write" && strings.HasPrefix(ev.args, `1, "ACK `):
			acks[ev.args[len(`1, "ACK `):][:64]] = ev
		}
	}
	if len(writes) != len(lines) {
		return fmt.Errorf("%d journal writes in the trace, want %d", len(writes), len(lines))
	}
	if err := checkCreatedBeforeAck(evs, acks); err != nil {
		return err
	}
	if len(acks) != len(lines) {
		return fmt.Errorf("%d ACKs in the trace, want %d", len(acks), len(lines))
	}
	for k, l := range lines {
		ack, ok := acks[LineHash([]byte(l))]
		if !ok {
			return fmt.Errorf("line %d: no ACK", k+1)
		}
		w := writes[k]
		synced := false
		for _, s := range syncs {
			if s.start > w.end && s.end < ack.start {
				synced = true
				break
			}
		}
		if !synced {
			return fmt.Errorf("line %d: Append returned (log line %d) with no fsync of fd %s between its write (log line %d) and then", k+1, ack.start, jfd, w.end)
		}
	}
	return nil
}

// checkCreatedBeforeAck checks that pubkey.pem and the run directory were
// fsynced (Create leaves both to the background) before the first ACK.
func checkCreatedBeforeAck(evs []syscallEvent, acks map[string]syscallEvent) error {
	first := -1
	for _, a := range acks {
		if first < 0 || a.start < first {
			first = a.start
		}
	}
	pathOf := func(args string) string {
		if i := strings.IndexByte(args, '"'); i >= 0 {
			if j := strings.IndexByte(args[i+1:], '"'); j >= 0 {
				return args[i+1 : i+1+j]
			}
		}
		return ""
	}
	var run string
	for _, ev := range evs {
		if p := pathOf(ev.args); ev.name == "openat" && filepath.Base(p) == JournalFile {
			run = filepath.Dir(p)
		}
	}
	for _, want := range []string{filepath.Join(run, PublicKeyFile), run} {
		fd, opened, synced := "", 0, false
		onFD := func(ev syscallEvent) bool {
			return fd != "" && ev.start > opened && (strings.HasPrefix(ev.args, fd+")") || strings.HasPrefix(ev.args, fd+" <unfinished"))
		}
		for _, ev := range evs {
			switch {
			case ev.name == "openat" && pathOf(ev.args) == want && ev.ret != "" && ev.ret[0] != '-':
				fd, opened = ev.ret, ev.end
			case ev.name == "close" && onFD(ev):
				fd = "" // the number may serve another file next
			case ev.name == "fsync" && onFD(ev) && ev.ret == "0" && ev.end < first:
				synced = true
			}
		}
		if !synced {
			return fmt.Errorf("no fsync of %s (fd %q) returned before the first ACK (log line %d)", want, fd, first)
		}
	}
	return nil
}

// TestSyncBeforeAppendReturns traces a writer subprocess's system calls and
// shows that each line is fsynced before its Append returns, and the key
// and run directory before the first; a writer with its fsync disabled,
// and one that never syncs its key and directory, traced the same way,
// are caught.
func TestSyncBeforeAppendReturns(t *testing.T) {
	strace, err := exec.LookPath("strace")
	testenv.Need(t, err == nil, "strace not found in PATH")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		role   string
		wantOK bool
		want   string // what the checker names for a writer it must catch
	}{{"writer", true, ""}, {"writer-nosync", false, "no fsync of fd"}, {"writer-nokeysync", false, PublicKeyFile + " (fd"}} {
		t.Run(c.role, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "run")
			logPath := filepath.Join(t.TempDir(), "strace.log")
			cmd := exec.Command(strace, "-f", "-qq", "-s", "80", "-e", "trace=openat,write,fsync,fdatasync,close", "-o", logPath, exe, helperName(c.role), dir, "16")
			if out, err := cmd.CombinedOutput(); err != nil {
				testenv.Need(t, !strings.Contains(string(out), "PTRACE"), "strace cannot trace here: "+string(out))
				t.Fatalf("traced writer: %v: %s", err, out)
			}
			log, err := os.ReadFile(logPath)
			if err != nil {
				t.Fatal(err)
			}
			j, err := os.Open(filepath.Join(dir, JournalFile))
			if err != nil {
				t.Fatal(err)
			}
			defer j.Close()
			var lines []string
			sc := bufio.NewScanner(j)
			sc.Buffer(nil, MaxLineBytes)
			for sc.Scan() {
				lines = append(lines, sc.Text())
			}
			if len(lines) != 19 {
				t.Fatalf("%d journal lines, want 19", len(lines))
			}
			err = checkSyncBeforeAck(parseStrace(string(log)), lines)
			if c.wantOK && err != nil {
				t.Fatalf("fsync ordering: %v", err)
			}
			if !c.wantOK && (err == nil || !strings.Contains(err.Error(), c.want)) {
				t.Fatalf("the checker did not catch %s: %v, want an error naming %q", c.role, err, c.want)
			}
			t.Logf("%s: %v", c.role, err)
		})
	}
}
