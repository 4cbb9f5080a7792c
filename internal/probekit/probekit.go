// Package probekit is the one kit of in-sandbox probe actions: what the
// e2e tests' probe (the test binary in e2e), the conformance suite's probe
// (moat's hidden helper __moat-conf-probe) and the evidence suite's probe
// (package evidence/probe) attempt inside a sandbox. Each thing a probe
// tries exists here once, with one behaviour: a dial with a payload
// (Dial), a raw exchange with the broker (Exchange), a datagram sent one
// of several ways (SendDatagram), a set-id attempt (SetID, ChmodNew), a
// wait for a marker file (WaitFile), and the command-line actions built on
// them (Actions).
//
// The command-line form is one argument per action, "kind=arg", and one
// line of output per action: "kind=arg ok", "kind=arg ok DETAIL" or
// "kind=arg err REASON". A probe only reports what it tried; the tests
// judge the lines together with what host-side receivers observed, and
// never believe an "ok" that a receiver contradicts.
//
// A probe may add actions of its own (Main's extra): the e2e probe adds
// the model SDK and MCP client calls, which must not enter the moat
// binary. An extension never replaces a kit action.
package probekit

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/internal/reexec"
)

// Limits.
const (
	// DialTimeout bounds one connection attempt.
	DialTimeout = 2 * time.Second
	// WaitFileTimeout bounds the wait-file action.
	WaitFileTimeout = 10 * time.Second
	// ExchangeTimeout bounds the raw action's exchange with the broker.
	ExchangeTimeout = 10 * time.Second
	// inferTimeout bounds the infer action's request.
	inferTimeout = 10 * time.Second
)

// Payload is what the network actions send: any arrival at a receiver
// counts, whatever it carries.
const Payload = "moat probe escape attempt\n"

// Written is what the write action writes, so that the host can tell a
// write that landed.
const Written = "written by a moat probe\n"

// EUIDHelper is the hidden helper that prints "euid=N" (its effective
// uid): the fork, exec-euid and unshare-user actions run it, and the
// conformance suite runs a setuid-root copy of moat as it outside the
// sandbox. internal/cli/hidden.go lists it; a test binary that is a probe
// lists it in its TestMain.
const EUIDHelper = reexec.Prefix + "probe-euid"

// EUIDMain is EUIDHelper's entry function.
func EUIDMain([]string) int { fmt.Printf("euid=%d\n", os.Geteuid()); return 0 }

// An Action attempts one thing with the argument after "kind=" and
// returns a detail for its ok line (may be ""), or why it failed.
type Action func(arg string) (detail string, err error)

// Actions returns the kit's actions by kind, a new map on each call.
func Actions() map[string]Action {
	m := map[string]Action{
		"read": func(path string) (string, error) {
			b, err := os.ReadFile(path)
			if err != nil {
				return "", err
			}
			return fmt.Sprintf("%d bytes", len(b)), nil
		},
		"write": func(path string) (string, error) {
			return "", os.WriteFile(path, []byte(Written), 0o644)
		},
		"tcp":      dialAction("tcp", ""),
		"udp":      dialAction("udp", ""),
		"unix":     dialAction("unix", ""),
		"abstract": dialAction("unix", "@"),
		"unixgram": dialAction("unixgram", ""),
		"broker": func(string) (string, error) {
			c, err := net.DialTimeout("tcp", BrokerAddr(), DialTimeout)
			if err != nil {
				return "", err
			}
			return "", c.Close()
		},
		"raw":       raw,
		"wait-file": func(path string) (string, error) { return "", WaitFile(path, WaitFileTimeout) },
		"infer":     infer,
		"dns-udp":   dnsUDP,
		"env":       func(string) (string, error) { return strings.Join(os.Environ(), " "), nil },
		"sleep": func(arg string) (string, error) {
			n, err := strconv.Atoi(arg)
			if err != nil || n < 0 {
				return "", fmt.Errorf("sleep wants whole seconds, got %q", arg)
			}
			time.Sleep(time.Duration(n) * time.Second)
			return "", nil
		},
		"fork": func(string) (string, error) {
			exe, err := os.Executable()
			if err != nil {
				return "", err
			}
			return euid(exec.Command(exe, EUIDHelper))
		},
		"exec-euid": func(path string) (string, error) { return euid(exec.Command(path, EUIDHelper)) },
	}
	addOSActions(m)
	return m
}

func dialAction(network, prefix string) Action {
	return func(addr string) (string, error) { return "", Dial(network, prefix+addr, Payload) }
}

// euid runs cmd (an EUIDHelper) and returns what it printed.
func euid(cmd *exec.Cmd) (string, error) {
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%v: %s", err, bytes.TrimSpace(out))
	}
	return strings.TrimSpace(string(out)), nil
}

// Main attempts each action ("kind=arg") in order with the kit's actions
// and extra's, writes one line for each to w, and returns 0: what a probe
// claims is never a verdict. An unknown kind gets an err line. An extra
// kind that the kit has already is a bug in the probe: Main says so on w
// and returns 2 before it attempts anything.
func Main(w io.Writer, extra map[string]Action, actions []string) int {
	kit := Actions()
	for kind, a := range extra {
		if _, dup := kit[kind]; dup {
			fmt.Fprintf(w, "probekit: the probe's own action %q would replace the kit's (one behaviour per action)\n", kind)
			return 2
		}
		kit[kind] = a
	}
	for _, a := range actions {
		kind, arg, _ := strings.Cut(a, "=")
		act, ok := kit[kind]
		if !ok {
			fmt.Fprintf(w, "%s err unknown action %q\n", a, kind)
			continue
		}
		detail, err := act(arg)
		switch {
		case err != nil:
			fmt.Fprintf(w, "%s err %s\n", a, oneLine(err.Error()))
		case detail != "":
			fmt.Fprintf(w, "%s ok %s\n", a, oneLine(detail))
		default:
			fmt.Fprintf(w, "%s ok\n", a)
		}
	}
	return 0
}

// Kinds lists the kit's action kinds, sorted.
func Kinds() []string {
	var ks []string
	for k := range Actions() {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// oneLine keeps a result on its line.
func oneLine(s string) string { return strings.NewReplacer("\r", `\r`, "\n", `\n`).Replace(s) }

// Dial connects to addr over network ("tcp", "udp", "unix" with "@name"
// for an abstract socket, "unixgram") within DialTimeout and sends
// payload: an arrival is what a receiver observes.
func Dial(network, addr, payload string) error {
	if addr == "" || addr == "@" {
		return errors.New("no address given")
	}
	c, err := net.DialTimeout(network, addr, DialTimeout)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(DialTimeout))
	_, err = io.WriteString(c, payload)
	return err
}

// BrokerAddr is the broker's host:port from MOAT_BROKER_URL, which moat
// gives every workload.
func BrokerAddr() string {
	return strings.TrimSuffix(strings.TrimPrefix(os.Getenv("MOAT_BROKER_URL"), "http://"), "/")
}

// ErrNotSent wraps Exchange's write error: the peer stopped the request
// before it was all sent (a refusal as much as an answer is).
var ErrNotSent = errors.New("the request could not be sent")

// Exchange sends data over a new TCP connection to addr, closes its
// sending side, and returns the first line that comes back, without its
// line end, within timeout. The error is the dial's, the write's
// (wrapping ErrNotSent) or the read's (io.EOF when the peer closed before
// a whole line; line then holds what came).
func Exchange(addr string, data []byte, timeout time.Duration) (line string, err error) {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write(data); err != nil {
		return "", fmt.Errorf("%w: %v", ErrNotSent, err)
	}
	if tc, ok := c.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
	line, err = bufio.NewReader(c).ReadString('\n')
	return strings.TrimRight(line, "\r\n"), err
}

// StatusCode is the status code of an HTTP/1.1 status line, or 0.
func StatusCode(line string) int {
	rest, ok := strings.CutPrefix(line, "HTTP/1.1 ")
	if !ok || len(rest) < 3 {
		return 0
	}
	n, err := strconv.Atoi(rest[:3])
	if err != nil || n < 100 || n > 999 {
		return 0
	}
	return n
}

// raw: arg is base64 of bytes sent to the broker on a new connection; the
// detail is the status code it answered, "write-failed" when it stopped
// the request while it was being sent, "closed-without-response", or
// "error: …" when the read failed first. Only a failed dial is an err.
func raw(arg string) (string, error) {
	b, err := base64.StdEncoding.DecodeString(arg)
	if err != nil {
		return "", err
	}
	line, err := Exchange(BrokerAddr(), b, ExchangeTimeout)
	switch code := StatusCode(line); {
	case code != 0:
		return strconv.Itoa(code), nil
	case errors.Is(err, ErrNotSent):
		return "write-failed", nil
	case err == nil || errors.Is(err, io.EOF):
		return "closed-without-response", nil
	case line == "" && isDialError(err):
		return "", err
	default:
		return "error: " + err.Error(), nil
	}
}

func isDialError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// WaitFile waits until path exists, for at most d; "" is nothing to wait
// for.
func WaitFile(path string, d time.Duration) error {
	if path == "" {
		return nil
	}
	deadline := time.Now().Add(d)
	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out waiting for %s", path)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// infer makes one allowed Anthropic Messages request for the model arg
// through the broker, configured only by the environment that moat set.
func infer(model string) (string, error) {
	base := os.Getenv("ANTHROPIC_BASE_URL")
	if base == "" {
		return "", fmt.Errorf("ANTHROPIC_BASE_URL is not set")
	}
	body := fmt.Sprintf(`{"model":%s,"max_tokens":16,"messages":[{"role":"user","content":"probe"}]}`, strconv.Quote(model))
	req, err := http.NewRequest("POST", base+"/v1/messages", strings.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("anthropic-version", "2023-06-01")
	req.Header.Set("x-api-key", os.Getenv("ANTHROPIC_API_KEY"))
	cl := &http.Client{Timeout: inferTimeout}
	resp, err := cl.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != 200 {
		return "", fmt.Errorf("status %d: %s", resp.StatusCode, bytes.TrimSpace(b))
	}
	return "status 200", nil
}

// dnsQuery is a minimal DNS query for "moat-probe.invalid." A.
var dnsQuery = []byte{0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0,
	10, 'm', 'o', 'a', 't', '-', 'p', 'r', 'o', 'b', 'e',
	7, 'i', 'n', 'v', 'a', 'l', 'i', 'd', 0, 0, 1, 0, 1}

// DNSQuery sends a DNS query over UDP to addr and returns the size of the
// answer; the host side uses it too, as the control that a resolver
// answers.
func DNSQuery(addr string) (int, error) {
	c, err := net.DialTimeout("udp", addr, DialTimeout)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	if _, err := c.Write(dnsQuery); err != nil {
		return 0, err
	}
	c.SetReadDeadline(time.Now().Add(DialTimeout))
	buf := make([]byte, 512)
	return c.Read(buf)
}

func dnsUDP(addr string) (string, error) {
	n, err := DNSQuery(addr)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("answer of %d bytes", n), nil
}
