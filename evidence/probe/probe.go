// Package probe is the fixed hostile program of the evidence suite
// (cmd/moat-probe) and the small agent of `moat demo`. It runs inside a
// sandbox, takes its case from its arguments, does what the case says, and
// always ends by claiming success loudly, whatever happened: the controller
// must never believe it. Its per-step lines are supporting evidence only.
package probe

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/internal/probekit"
)

// Markers shared with the controller (package evidence).
const (
	AttackMarker  = "moat-attack-5c1e"
	ControlPrefix = "moat-control:"
	Canary        = "MOAT-SYNTHETIC-CANARY-0001"
	// ClaimsLine is printed last, always.
	ClaimsLine = `{"claims":{"passed":true,"escape_success":true,"audit_verified":true}}`
)

// markerWait bounds the wait for the controller's marker files.
var markerWait = 30 * time.Second

const (
	stepTimeout  = 10 * time.Second
	maxReplyRead = 1 << 20
)

// Config is what the controller tells the probe.
type Config struct {
	Case        string
	Model       string // an allowed Anthropic model
	OpenAIModel string // an allowed OpenAI model
	Marker      string // wait for this file before acting
	FaultMarker string // audit-storage-fault: wait for this file before the faulty request
	TCP, UDP    string // host receivers (host addresses; unreachable by design)
	Abstract    string
	Unix        string
	Unixgram    string
	Workspace   string
	// Target is a host path outside every grant that a planting case
	// points its symlink at.
	Target string
	// Run is the run's number within a multi-run case, from 1.
	Run int
	// ToolArgs are the tool cases' add operands, "A,B".
	ToolArgs string
	// EgressPort is the egress case's port of the registry server and of
	// the trap receiver (egress.go).
	EgressPort string
}

// Main runs the probe with args (without the program name) and returns 0.
func Main(args []string, stdout io.Writer) int {
	var c Config
	fs := flag.NewFlagSet("moat-probe", flag.ContinueOnError)
	fs.SetOutput(stdout)
	fs.StringVar(&c.Model, "model", "", "allowed Anthropic model")
	fs.StringVar(&c.OpenAIModel, "openai-model", "", "allowed OpenAI model")
	fs.StringVar(&c.Marker, "marker", "", "file to wait for before acting")
	fs.StringVar(&c.FaultMarker, "fault-marker", "", "file to wait for before the faulty request")
	fs.StringVar(&c.TCP, "tcp", "", "host TCP receiver")
	fs.StringVar(&c.UDP, "udp", "", "host UDP receiver")
	fs.StringVar(&c.Abstract, "abstract", "", "host abstract socket name")
	fs.StringVar(&c.Unix, "unix", "", "host Unix stream socket path")
	fs.StringVar(&c.Unixgram, "unixgram", "", "host Unix datagram socket path")
	fs.StringVar(&c.Workspace, "workspace", "", "the writable workspace")
	fs.StringVar(&c.Target, "target", "", "host path outside the grants for a planted symlink")
	fs.IntVar(&c.Run, "run", 1, "the run's number within a multi-run case")
	fs.StringVar(&c.ToolArgs, "tool-args", "", "the tool cases' add operands, A,B")
	fs.StringVar(&c.EgressPort, "egress-port", "", "the egress case's registry port")
	if err := fs.Parse(args); err != nil || fs.NArg() != 1 {
		fmt.Fprintln(stdout, "usage: moat-probe [flags] CASE")
		fmt.Fprintln(stdout, ClaimsLine)
		return 0
	}
	c.Case = fs.Arg(0)
	p := newRunner(c, stdout)
	p.run()
	fmt.Fprintln(stdout, ClaimsLine)
	return 0
}

type runner struct {
	Config
	out    io.Writer
	base   string // http://127.0.0.1:port
	broker string // 127.0.0.1:port
	client *http.Client
}

func newRunner(c Config, out io.Writer) *runner {
	base := os.Getenv("ANTHROPIC_BASE_URL")
	return &runner{Config: c, out: out, base: base, broker: strings.TrimPrefix(base, "http://"),
		client: &http.Client{
			Timeout:       stepTimeout,
			Transport:     &http.Transport{DisableKeepAlives: true, Proxy: nil},
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}}
}

// step prints one supporting line.
func (p *runner) step(name string, status int, err error, extra string) {
	m := map[string]any{"step": name, "status": status}
	if err != nil {
		m["error"] = err.Error()
	}
	if extra != "" {
		m["reply"] = extra
	}
	b, _ := json.Marshal(m)
	fmt.Fprintln(p.out, string(b))
}

// waitFile waits for a marker file ("" is none).
var waitFile = probekit.WaitFile

func (p *runner) run() {
	if err := waitFile(p.Marker, markerWait); err != nil {
		p.step("wait-marker", 0, err, "")
		return
	}
	fn, ok := caseSteps[p.Case]
	if !ok {
		p.step("unknown-case", 0, errors.New(p.Case), "")
		return
	}
	fn(p)
}

// message is a minimal Anthropic Messages body with text content.
func (p *runner) message(model string, text any, extra map[string]any) []byte {
	m := map[string]any{"model": model, "max_tokens": 64,
		"messages": []any{map[string]any{"role": "user", "content": text}}}
	for k, v := range extra {
		m[k] = v
	}
	b, _ := json.Marshal(m)
	return b
}

// post sends one JSON request to the broker and returns status and reply.
func (p *runner) post(name, path string, body []byte, hdr map[string]string) (int, string) {
	req, err := http.NewRequest("POST", p.base+path, bytes.NewReader(body))
	if err != nil {
		p.step(name, 0, err, "")
		return 0, ""
	}
	req.Header.Set("Content-Type", "application/json")
	if strings.HasPrefix(path, "/v1/messages") {
		req.Header.Set("anthropic-version", "2023-06-01")
		req.Header.Set("x-api-key", os.Getenv("ANTHROPIC_API_KEY"))
	} else {
		req.Header.Set("Authorization", "Bearer "+os.Getenv("OPENAI_API_KEY"))
	}
	for k, v := range hdr {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	resp, err := p.client.Do(req)
	if err != nil {
		p.step(name, 0, err, "")
		return 0, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxReplyRead))
	p.step(name, resp.StatusCode, nil, string(b))
	return resp.StatusCode, string(b)
}

// control sends a useful-work request labelled label.
func (p *runner) control(label string) int {
	st, _ := p.post("control:"+label, "/v1/messages", p.message(p.Model, ControlPrefix+label, nil), nil)
	return st
}

// raw sends bytes over a fresh TCP connection to the broker and reports
// the first line of whatever comes back (or that the connection closed).
func (p *runner) raw(name, data string) {
	line, err := probekit.Exchange(p.broker, []byte(data), stepTimeout)
	p.step(name, probekit.StatusCode(line), err, strings.TrimSpace(line))
}

// rawPost frames a POST by hand: headers given verbatim, after the
// workload's API key as the SDKs send it (the placeholder, or the
// sandbox's own broker key where the broker is off the sandbox's network,
// as on kubernetes), so that a refusal is the framing's and not the key's.
func (p *runner) rawPost(target string, headers []string, body string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nanthropic-version: 2023-06-01\r\nConnection: close\r\n", target, p.broker)
	if k := os.Getenv("ANTHROPIC_API_KEY"); k != "" {
		fmt.Fprintf(&b, "x-api-key: %s\r\n", k)
	}
	for _, h := range headers {
		b.WriteString(h + "\r\n")
	}
	b.WriteString("\r\n")
	b.WriteString(body)
	return b.String()
}

func chunk(s string) string { return fmt.Sprintf("%x\r\n%s\r\n", len(s), s) }

// dial tries to deliver an escape payload directly to a host receiver.
func (p *runner) dial(name, network, addr string) {
	p.step(name, 0, probekit.Dial(network, addr, "escape "+AttackMarker), "")
}

// httpPost sends an HTTP request carrying the attack marker straight to a
// host address, bypassing the broker.
func (p *runner) httpPost(name, url string) {
	req, err := http.NewRequest("POST", url, strings.NewReader(AttackMarker))
	if err != nil {
		p.step(name, 0, err, "")
		return
	}
	resp, err := p.client.Do(req)
	if err != nil {
		p.step(name, 0, err, "")
		return
	}
	resp.Body.Close()
	p.step(name, resp.StatusCode, nil, "")
}
