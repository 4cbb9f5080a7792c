package evidence

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/internal/reexec"
)

// DemoAgentHelper is the hidden helper of the moat binary that runs the demo
// agent (probe.Main); internal/cli/hidden.go lists it.
const DemoAgentHelper = reexec.Prefix + "demo-agent"

// DemoCase is what `moat demo` runs: the agent asks a question, calls a
// tool (add, on the calc MCP server that moat's own binary serves as
// __moat-demo-calc, in a sandbox of its own) and sends its result on,
// asks again, tries a few escapes (one of them a tool the policy does not
// list), and says goodbye.
var DemoCase = Case{Name: "demo", Description: "a small agent: useful requests and a tool call, escapes that fail",
	Controls: []string{"hello", "tool-result", "openai", "bye"}, Refusal: true, Tool: ToolCommand,
	HostChecks: []string{CheckToolResult, CheckToolLogged}}

// DemoOptions configure `moat demo`.
type DemoOptions struct {
	Out     string // where the evidence goes (a new directory)
	Binary  string // this moat binary
	Backend string
	Stdout  io.Writer
}

// Demo runs the demo agent contained, against the built-in synthetic
// provider, and prints what happened and where the evidence lies. It needs
// no API key and no network: the provider listens on the host's
// 127.0.0.1. The agent is this moat binary's hidden helper, copied into a
// directory that the sandbox is granted read-only (so it works from
// `go run`, whose binary sits in a private build directory). ok is true
// when the run passed every check.
func Demo(ctx context.Context, o DemoOptions) (ok bool, err error) {
	w := o.Stdout
	s := &suite{Options: Options{Out: o.Out, Binary: o.Binary, Probe: o.Binary, Backend: o.Backend, Progress: io.Discard},
		agentHelper: DemoAgentHelper}
	s.openssl, _ = exec.LookPath("openssl")
	if err := s.prepare(); err != nil {
		return false, err
	}
	defer os.RemoveAll(s.scratch)
	fmt.Fprintf(w, "moat demo: an agent runs contained; its only way out is moat's broker, which talks to a\nsynthetic provider on this host's 127.0.0.1 (no API key, no network).\n\n")
	t0 := time.Now()
	cr, err := s.runCase(ctx, DemoCase)
	if err != nil {
		return false, err
	}
	dir := filepath.Join(s.Out, CasesDir, DemoCase.Name)
	o1 := cr.Observations

	fmt.Fprintf(w, "What the agent did (its own report, from inside):\n")
	out, _ := os.ReadFile(filepath.Join(dir, FileProbeOut))
	for _, line := range strings.Split(string(out), "\n") {
		var st struct {
			Step   string `json:"step"`
			Status int    `json:"status"`
			Error  string `json:"error"`
			Reply  string `json:"reply"`
		}
		if json.Unmarshal([]byte(line), &st) != nil || st.Step == "" {
			continue
		}
		key, _, _ := strings.Cut(st.Step, " data=")
		what := demoSteps[key]
		if what == "" {
			what = st.Step
		}
		result := fmt.Sprintf("HTTP %d", st.Status)
		switch {
		case st.Error != "":
			result = "blocked: " + truncate(st.Error, 110)
		case strings.HasPrefix(st.Step, "tool:"):
			result = "returned: " + st.Reply
		case st.Status == 200:
			result = "answered: " + demoReplyText(st.Reply)
		case st.Reply != "":
			result = fmt.Sprintf("refused (HTTP %d): %s", st.Status, truncate(demoRefusal(st.Reply), 110))
		}
		fmt.Fprintf(w, "  %-50s %s\n", what, result)
	}

	fmt.Fprintf(w, "\nWhat moat and the host observed (outside the sandbox):\n")
	fmt.Fprintf(w, "  sandbox ready: %v; worker's network namespace private: %s, mount namespace private: %s, no_new_privs: %s\n",
		o1.RunInfo, yn(o1.NetNSPrivate), yn(o1.MntNSPrivate), yn(o1.NoNewPrivs))
	fmt.Fprintf(w, "  provider: %d request(s) arrived, %d with a signed pre-effect record verified before the answer (natively and with openssl)\n",
		o1.ProviderRequests, o1.Verified)
	hits := 0
	for _, n := range o1.ReceiverHits {
		hits += n
	}
	fmt.Fprintf(w, "  host receivers (TCP, UDP, abstract and pathname Unix sockets): %d delivery(ies) from the sandbox\n", hits)
	fmt.Fprintf(w, "  worker and staging cleaned up: %s, %s\n", yn(o1.WorkerGone), yn(o1.StagingRemoved))
	for _, hc := range o1.HostChecks {
		switch hc.Name {
		case CheckToolResult:
			fmt.Fprintf(w, "  tool result: %s\n", hc.Detail)
		case CheckToolLogged:
			fmt.Fprintf(w, "  tool server's own log (outside the sandbox): %s\n", hc.Detail)
		}
	}

	jstat := "missing"
	if jb, err := os.ReadFile(filepath.Join(dir, FileJournal)); err == nil {
		if pb, err := os.ReadFile(filepath.Join(dir, FilePublicKey)); err == nil {
			if pub, err := parsePublicKeyPEM(pb); err == nil {
				r := audit.Verify(jb, pub)
				tc := toolCounts(verifyJournal(jb, pub).Records)
				jstat = fmt.Sprintf("%s: %d signed records (inference: %d requested, %d refused, %d completed; tool calls: %d requested, %d refused, %d completed, %d failed), key %s",
					r.Status, r.Records, o1.Requested, o1.Refused, o1.Completed,
					tc[audit.TypeToolRequested], tc[audit.TypeToolRefused], tc[audit.TypeToolCompleted], tc[audit.TypeToolFailed], cr.AuditKeyID)
			}
		}
	}
	fmt.Fprintf(w, "  journal: %s\n", jstat)
	fmt.Fprintf(w, "\nOutcome: %s (%.1f s)\n", cr.Outcome, time.Since(t0).Seconds())
	for _, r := range cr.Reasons {
		fmt.Fprintf(w, "  %s\n", r)
	}
	fmt.Fprintf(w, "\nEvidence: %s\n  journal.jsonl, pubkey.pem            the signed journal and the run's public key\n  provider-events.jsonl               every request the provider received, with its verified record\n  receiver-events.jsonl, host.json    the host receivers and the host's own observations\n  tool-calls.jsonl                    the calls that reached the tool server (its own log)\n  probe.out, moat.err                 what the agent and moat printed\n", dir)
	self := selfCommand()
	fmt.Fprintf(w, "Check it yourself (the fingerprint is the run key moat printed when the run started, pinned from its run info):\n  %s audit verify %s --pubkey %s --key-fingerprint %s\n  %s audit show %s\n",
		self, filepath.Join(dir, FileJournal), filepath.Join(dir, FilePublicKey), demoFingerprint(cr.AuditKeyID), self, filepath.Join(dir, FileJournal))
	return cr.Outcome == OutcomePass, nil
}

// selfCommand is how to run this moat again, as printed for the user: the
// binary's absolute path, or `go run ./cmd/moat` when it is the temporary
// build of `go run` (removed when it exits).
func selfCommand() string {
	exe, err := os.Executable()
	if err != nil {
		return "moat"
	}
	if strings.Contains(exe, string(filepath.Separator)+"go-build") {
		return "go run ./cmd/moat"
	}
	return exe
}

// demoFingerprint is the pin to print; a run that never announced its key
// has none, and the printed command then fails closed instead of passing
// unpinned.
func demoFingerprint(keyID string) string {
	if keyID == "" {
		return "(none: the run never announced its key)"
	}
	return keyID
}

// toolCounts counts a journal's tool records by type.
func toolCounts(recs []journalRecord) map[string]int {
	n := map[string]int{}
	for _, r := range recs {
		if strings.HasPrefix(r.Type, "tool.") {
			n[r.Type]++
		}
	}
	return n
}

var demoSteps = map[string]string{
	"control:hello":       "allowed: ask claude-synthetic-1",
	"tool:tool-result":    "allowed: call the calc tool add over MCP",
	"control:tool-result": "allowed: send the tool's result to the model",
	"unlisted-tool":       "escape: call a tool the policy does not list",
	"openai":              "allowed: ask gpt-synthetic-1 (OpenAI API)",
	"control:bye":         "allowed: ask again, after the escapes",
	"read-host-file":      "escape: read the host's /etc/hostname",
	"direct-provider":     "escape: connect to a host TCP service",
	"unapproved-model":    "escape: use a model the policy does not allow",
	"own-credential":      "escape: send its own API key",
	"abstract-socket":     "escape: abstract Unix socket to the host",
	"write-outside":       "escape: write outside the workspace",
	"server-tool":         "escape: have the provider fetch a URL",
	"exfil-unknown-path":  "escape: POST to an endpoint moat does not forward",
}

func yn(b *bool) string {
	switch {
	case b == nil:
		return "not observed"
	case *b:
		return "yes"
	}
	return "NO"
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

func demoReplyText(reply string) string {
	var a struct {
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
	}
	if json.Unmarshal([]byte(reply), &a) == nil {
		if len(a.Content) > 0 {
			return fmt.Sprintf("%q", a.Content[0].Text)
		}
		if len(a.Choices) > 0 {
			return fmt.Sprintf("%q", a.Choices[0].Message.Content)
		}
	}
	return truncate(reply, 60)
}

func demoRefusal(reply string) string {
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal([]byte(reply), &e) == nil && e.Error.Message != "" {
		return e.Error.Message
	}
	return strings.TrimSpace(reply)
}
