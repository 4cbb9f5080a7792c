package probekit

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/receiver"
	"github.com/moat-sandbox/moat/internal/reexec"
	"github.com/moat-sandbox/moat/internal/reexec/reexectest"
)

// The test binary is a probe too: fork re-runs it as EUIDHelper.
func TestMain(m *testing.M) {
	reexectest.Main(m, reexec.Helper{Name: EUIDHelper, Main: EUIDMain})
}

func run(t *testing.T, extra map[string]Action, actions ...string) (string, int) {
	t.Helper()
	var out bytes.Buffer
	code := Main(&out, extra, actions)
	return out.String(), code
}

// lineOf is the result after "action " on its line.
func lineOf(t *testing.T, out, action string) string {
	t.Helper()
	for _, l := range strings.Split(out, "\n") {
		if r, ok := strings.CutPrefix(l, action+" "); ok {
			return r
		}
	}
	t.Fatalf("no line for %q in\n%s", action, out)
	return ""
}

func TestMainLines(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "f")
	out, code := run(t, map[string]Action{
		"mine": func(arg string) (string, error) { return "got " + arg + "\nsecond line", nil },
	}, "write="+f, "read="+f, "read="+filepath.Join(dir, "missing"), "nosuch=1", "mine=x")
	if code != 0 {
		t.Fatalf("code %d\n%s", code, out)
	}
	for _, tc := range []struct{ action, want string }{
		{"write=" + f, "ok"},
		{"read=" + f, fmt.Sprintf("ok %d bytes", len(Written))},
		{"nosuch=1", `err unknown action "nosuch"`},
		{"mine=x", `ok got x\nsecond line`},
	} {
		if got := lineOf(t, out, tc.action); got != tc.want {
			t.Errorf("%s: got %q, want %q", tc.action, got, tc.want)
		}
	}
	if got := lineOf(t, out, "read="+filepath.Join(dir, "missing")); !strings.HasPrefix(got, "err ") || !strings.Contains(got, "no such file") {
		t.Errorf("a missing file: got %q, want an err line", got)
	}
	if n := strings.Count(out, "\n"); n != 5 {
		t.Errorf("%d lines for 5 actions:\n%s", n, out)
	}
}

// An extension never replaces a kit action (one behaviour per action);
// the control is the distinct extension of TestMainLines.
func TestMainRefusesReplacedAction(t *testing.T) {
	out, code := run(t, map[string]Action{"read": func(string) (string, error) { return "", nil }}, "read=/x")
	if code != 2 || !strings.Contains(out, `"read" would replace the kit's`) || strings.Contains(out, "read=/x") {
		t.Errorf("code %d, output %q: want 2 and the refusal before any action", code, out)
	}
}

// The network actions deliver to a receiver (the control), and a dial to
// nothing is an err line.
func TestDialActions(t *testing.T) {
	r, err := receiver.Start(receiver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	nowhere := closed.Addr().String()
	closed.Close()
	out, _ := run(t, nil, "tcp="+r.TCP.Addr().String(), "udp="+r.UDP.LocalAddr().String(), "tcp="+nowhere, "tcp=")
	if got := lineOf(t, out, "tcp="+r.TCP.Addr().String()); got != "ok" {
		t.Errorf("tcp to the receiver: %q", got)
	}
	if got := lineOf(t, out, "tcp="+nowhere); !strings.HasPrefix(got, "err ") {
		t.Errorf("tcp to a closed port: %q, want err", got)
	}
	if got := lineOf(t, out, "tcp="); got != "err no address given" {
		t.Errorf("tcp without an address: %q", got)
	}
	seen := map[string]bool{}
	deadline := time.After(5 * time.Second)
	for len(seen) < 2 {
		select {
		case e := <-r.Events:
			seen[e.Net] = true
			if e.Net == "udp" && string(e.Data) != Payload {
				t.Errorf("udp payload %q", e.Data)
			}
		case <-deadline:
			t.Fatalf("the receiver saw %v, want tcp and udp", seen)
		}
	}
}

func TestRawStatuses(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var answers = make(chan string, 4)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			io.ReadAll(c) // until the probe's CloseWrite
			io.WriteString(c, <-answers)
			c.Close()
		}
	}()
	t.Setenv("MOAT_BROKER_URL", "http://"+l.Addr().String())
	req := base64.StdEncoding.EncodeToString([]byte("GET / HTTP/1.1\r\n\r\n"))
	for _, tc := range []struct{ answer, want string }{
		{"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", "ok 200"},
		{"HTTP/1.1 400 Bad Request\r\n\r\n", "ok 400"},
		{"", "ok closed-without-response"},
		{"garbage", "ok closed-without-response"},
	} {
		answers <- tc.answer
		out, _ := run(t, nil, "raw="+req)
		if got := lineOf(t, out, "raw="+req); got != tc.want {
			t.Errorf("answer %q: got %q, want %q", tc.answer, got, tc.want)
		}
	}
	out, _ := run(t, nil, "raw=%%%")
	if got := lineOf(t, out, "raw=%%%"); !strings.HasPrefix(got, "err illegal base64") {
		t.Errorf("bad base64: %q", got)
	}
	closed, _ := net.Listen("tcp", "127.0.0.1:0")
	t.Setenv("MOAT_BROKER_URL", "http://"+closed.Addr().String())
	closed.Close()
	out, _ = run(t, nil, "raw="+req, "broker=")
	if got := lineOf(t, out, "raw="+req); !strings.HasPrefix(got, "err ") {
		t.Errorf("raw to no broker: %q, want err", got)
	}
	if got := lineOf(t, out, "broker="); !strings.HasPrefix(got, "err ") {
		t.Errorf("broker= with no broker: %q, want err", got)
	}
}

func TestStatusCode(t *testing.T) {
	for line, want := range map[string]int{
		"HTTP/1.1 200 OK": 200, "HTTP/1.1 404": 404, "HTTP/1.0 200 OK": 0, "HTTP/1.1 20": 0,
		"HTTP/1.1 abc": 0, "": 0, "HTTP/1.1 099 x": 0,
	} {
		if got := StatusCode(line); got != want {
			t.Errorf("StatusCode(%q) = %d, want %d", line, got, want)
		}
	}
}

func TestWaitFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "marker")
	if err := WaitFile(p, 50*time.Millisecond); err == nil {
		t.Error("WaitFile returned before the file existed")
	}
	go func() { time.Sleep(30 * time.Millisecond); os.WriteFile(p, nil, 0o644) }()
	if err := WaitFile(p, 5*time.Second); err != nil {
		t.Error(err)
	}
	if err := WaitFile("", 0); err != nil {
		t.Errorf("an empty path: %v", err)
	}
}

// fork runs this binary again as EUIDHelper; exec-euid runs a named one.
func TestForkRunsEUIDHelper(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("ok euid=%d", os.Geteuid())
	out, _ := run(t, nil, "fork=", "exec-euid="+exe, "exec-euid=/nonexistent/moat")
	if got := lineOf(t, out, "fork="); got != want {
		t.Errorf("fork: %q, want %q", got, want)
	}
	if got := lineOf(t, out, "exec-euid="+exe); got != want {
		t.Errorf("exec-euid: %q, want %q", got, want)
	}
	if got := lineOf(t, out, "exec-euid=/nonexistent/moat"); !strings.HasPrefix(got, "err ") {
		t.Errorf("exec-euid of nothing: %q, want err", got)
	}
}

func TestKindsAreTheUnion(t *testing.T) {
	kinds := strings.Join(Kinds(), " ")
	// The e2e probe's, the conformance probe's, and the evidence probe's
	// network and set-id attempts, once each.
	for _, k := range []string{"read", "write", "tcp", "udp", "unix", "abstract", "unixgram", "broker", "raw", "wait-file", "infer", "dns-udp", "env", "sleep", "fork", "exec-euid"} {
		if !strings.Contains(" "+kinds+" ", " "+k+" ") {
			t.Errorf("kit lacks %q: %s", k, kinds)
		}
	}
}
