package evidence

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
)

// The host checks of the tool cases (issue 12). Their raw observations
// are host.json's tool_procs and tool_env (what the controller read in
// /proc), tool-calls.jsonl (the calc server's own log of the calls that
// reached it) and tool-events.jsonl (the url server's record of each
// request, with its Moat-Pre-Effect verification), besides the journal
// and the provider's events.
const (
	CheckToolResult    = "tool-result"     // control: a verified provider request carries the add result, and the journal a tool.completed
	CheckToolSignals   = "tool-signals"    // moat and the server live on, same start time, after the probe's SIGKILLs
	CheckToolLogged    = "tool-logged"     // control: the server's own log holds the listed call with its canonical arguments
	CheckToolUnlisted  = "tool-unlisted"   // the refused tools are journaled tool.refused and absent from the server's log
	CheckToolEnvGiven  = "tool-env-given"  // control: the server's environment holds its env and credential
	CheckToolNoSecrets = "tool-no-secrets" // and none of moat's canary and provider credentials, by name or value
	CheckToolDetached  = "tool-detached"   // control: the server and a detached (other session) child seen alive before the kill
	CheckToolReaped    = "tool-reaped"     // every one of them gone after moat was killed
	CheckToolPreEffect = "tool-pre-effect" // every tools/call at the url server carried a verified, journaled tool.requested
)

// Keys of HostRecord.Values for the tool cases.
const (
	ValueToolArgs    = "tool-args" // the add call's arguments in canonical JSON
	ValueToolSum     = "tool-sum"  // their sum, as the server prints it
	ValueToolEnvSHA  = "tool-env"  // NAME=sha256 of value pairs, comma-separated: what the entry gives the server
	ValueSecretsSHA  = "secrets"   // NAME=sha256 of value pairs of moat's environment the server must not see
	ToolCanaryEnv    = "MOAT_EVIDENCE_TOOL_CANARY"
	ToolCredEnv      = "MOAT_EVIDENCE_TOOL_TOKEN"
	toolServerLang   = "C.UTF-8"
	toolUnlistedMul  = "mul"
	toolUnlistedEnv  = "env"
	toolAllowed      = "add"
	procWhenReady    = "ready"       // at Ready
	procWhenSignaled = "signalled"   // after the probe's signals
	procWhenBefore   = "before-kill" // just before moat is killed
	procWhenAfter    = "after-kill"  // once moat is gone (and the reap waited for)
)

// ProcRecord is the host's view of one process of a tool case.
type ProcRecord struct {
	When  string `json:"when"`
	Role  string `json:"role"` // "moat" or "server"
	PID   int    `json:"pid"`
	Start string `json:"start"` // field 22 of /proc/<pid>/stat when first seen
	SID   int    `json:"sid"`
	// Alive: the pid exists, is no zombie, and has the recorded start time.
	Alive bool `json:"alive"`
}

// ToolLogLine is one line of the calc server's log.
type ToolLogLine struct {
	Tool      string `json:"tool"`
	Arguments string `json:"arguments"`
}

// ToolEvent is one request the url tool server received.
type ToolEvent struct {
	N               int    `json:"n"`
	Time            string `json:"time"`
	Method          string `json:"method"` // the JSON-RPC method ("" if unreadable)
	Tool            string `json:"tool,omitempty"`
	Arguments       string `json:"arguments,omitempty"` // params.arguments, the exact bytes
	PreEffect       string `json:"pre_effect,omitempty"`
	PreEffectCount  int    `json:"pre_effect_count"`
	NativeVerified  bool   `json:"native_verified"`
	OpenSSLVerified bool   `json:"openssl_verified"`
	Detail          string `json:"detail,omitempty"`
}

func sha256Hex(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

// shaPairs parses "NAME=sha,…".
func shaPairs(s string) map[string]string {
	out := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			out[k] = v
		}
	}
	return out
}

func (in checkInput) journalHas(typ string, match func(map[string]any) bool) bool {
	return slices.ContainsFunc(in.records, func(r journalRecord) bool { return r.Type == typ && (match == nil || match(r.Fields)) })
}

func checkToolResult(in checkInput) (bool, bool, string) {
	sum := in.host.Values[ValueToolSum]
	if sum == "" {
		return false, false, "no operands recorded"
	}
	want := []byte(ControlPrefix + "tool-result data=" + sum)
	arrived := slices.ContainsFunc(in.verified, func(b []byte) bool { return bytes.Contains(b, want) })
	completed := in.journalHas("tool.completed", nil)
	return true, arrived && completed, fmt.Sprintf("a verified request carried the tool's result %s: %v; the journal holds a tool.completed: %v", sum, arrived, completed)
}

func (h HostRecord) procs(when string) []ProcRecord {
	var out []ProcRecord
	for _, p := range h.ToolProcs {
		if p.When == when {
			out = append(out, p)
		}
	}
	return out
}

func procList(ps []ProcRecord) string {
	var s []string
	for _, p := range ps {
		s = append(s, fmt.Sprintf("%s pid %d sid %d alive %v", p.Role, p.PID, p.SID, p.Alive))
	}
	return strings.Join(s, "; ")
}

func checkToolSignals(in checkInput) (bool, bool, string) {
	before, after := in.host.procs(procWhenReady), in.host.procs(procWhenSignaled)
	roles := map[string]bool{}
	for _, p := range before {
		roles[p.Role] = p.Alive
	}
	if !roles["moat"] || !roles["server"] || len(after) != len(before) {
		return false, false, fmt.Sprintf("moat and the server not both seen alive at Ready (%s), or not seen again after the probe's signals (%s)", procList(before), procList(after))
	}
	dead := slices.ContainsFunc(after, func(p ProcRecord) bool { return !p.Alive })
	return true, !dead, "after the probe's SIGKILLs: " + procList(after)
}

func checkToolLogged(in checkInput) (bool, bool, string) {
	args := in.host.Values[ValueToolArgs]
	if !in.toolLogExists || args == "" {
		return false, false, "no server log or no operands recorded"
	}
	ok := slices.Contains(in.toolLog, ToolLogLine{Tool: toolAllowed, Arguments: args})
	return true, ok, fmt.Sprintf("the server's log holds %s %s: %v (%d lines)", toolAllowed, args, ok, len(in.toolLog))
}

func checkToolUnlisted(in checkInput) (bool, bool, string) {
	refused := func(tool string) bool {
		return in.journalHas("tool.refused", func(f map[string]any) bool { return f["tool"] == tool })
	}
	if !in.toolLogExists || !refused(toolUnlistedMul) || !refused(toolUnlistedEnv) {
		return false, false, fmt.Sprintf("server log present: %v; the journal refused %s: %v, %s: %v", in.toolLogExists, toolUnlistedMul, refused(toolUnlistedMul), toolUnlistedEnv, refused(toolUnlistedEnv))
	}
	var bad []string
	for _, l := range in.toolLog {
		if l.Tool != toolAllowed || strings.Contains(l.Arguments, AttackMarker) {
			bad = append(bad, l.Tool+" "+l.Arguments)
		}
	}
	if len(bad) > 0 {
		return true, false, "reached the server: " + strings.Join(bad, "; ")
	}
	return true, true, fmt.Sprintf("journaled tool.refused; the server's %d logged call(s) are all %s", len(in.toolLog), toolAllowed)
}

func checkToolEnvGiven(in checkInput) (bool, bool, string) {
	want := shaPairs(in.host.Values[ValueToolEnvSHA])
	if in.host.ToolEnv == nil || len(want) == 0 {
		return false, false, "the server's environment was not read"
	}
	var missing []string
	for k, v := range want {
		if in.host.ToolEnv[k] != v {
			missing = append(missing, k)
		}
	}
	slices.Sort(missing)
	if len(missing) > 0 {
		return true, false, "the server's environment lacks (or has another value for) " + strings.Join(missing, ", ")
	}
	return true, true, fmt.Sprintf("the server's environment (%d variables) holds its entry's env and credential", len(in.host.ToolEnv))
}

func checkToolNoSecrets(in checkInput) (bool, bool, string) {
	secrets := shaPairs(in.host.Values[ValueSecretsSHA])
	if in.host.ToolEnv == nil || len(secrets) == 0 {
		return false, false, "the server's environment was not read"
	}
	var bad []string
	for name, sum := range in.host.ToolEnv {
		for sn, ss := range secrets {
			if name == sn || sum == ss {
				bad = append(bad, name+" (is "+sn+")")
			}
		}
	}
	slices.Sort(bad)
	if len(bad) > 0 {
		return true, false, "the server sees moat's " + strings.Join(bad, ", ")
	}
	return true, true, fmt.Sprintf("none of %d secrets of moat's environment is in the server's, by name or value", len(secrets))
}

func checkToolDetached(in checkInput) (bool, bool, string) {
	ps := in.host.procs(procWhenBefore)
	var srv []ProcRecord
	for _, p := range ps {
		if p.Role == "server" {
			srv = append(srv, p)
		}
	}
	if len(srv) == 0 {
		return false, false, "no server process seen before the kill"
	}
	sids := map[int]bool{}
	alive := true
	for _, p := range srv {
		sids[p.SID] = true
		alive = alive && p.Alive
	}
	return true, alive && len(srv) >= 2 && len(sids) >= 2, "before the kill: " + procList(srv) + " (want the server and a child in another session, alive)"
}

func checkToolReaped(in checkInput) (bool, bool, string) {
	before, after := in.host.procs(procWhenBefore), in.host.procs(procWhenAfter)
	if len(before) == 0 || len(after) != len(before) {
		return false, false, fmt.Sprintf("%d process(es) seen before the kill, %d after", len(before), len(after))
	}
	left := slices.ContainsFunc(after, func(p ProcRecord) bool { return p.Alive })
	return true, !left, "after moat was killed: " + procList(after)
}

func checkToolPreEffect(in checkInput) (bool, bool, string) {
	if !in.toolEventsExist {
		return false, false, "no url server events"
	}
	requested := map[string]bool{}
	for _, r := range in.records {
		if r.Type == "tool.requested" {
			requested[r.Line] = true
		}
	}
	calls, bad := 0, []string{}
	for _, ev := range in.toolEvents {
		if ev.Method != "tools/call" {
			continue
		}
		calls++
		err := checkToolPreEffectLine([]byte(ev.PreEffect), ev.Tool, []byte(ev.Arguments), in.runID, in.pub)
		switch {
		case !ev.NativeVerified || !ev.OpenSSLVerified:
			bad = append(bad, fmt.Sprintf("call %d: not verified by the server (%s)", ev.N, ev.Detail))
		case err != nil:
			bad = append(bad, fmt.Sprintf("call %d: %v", ev.N, err))
		case !requested[ev.PreEffect]:
			bad = append(bad, fmt.Sprintf("call %d: its record is not a line of the journal", ev.N))
		}
	}
	if calls == 0 {
		return false, false, "no tools/call reached the url server"
	}
	if len(bad) > 0 {
		return true, false, strings.Join(bad, "; ")
	}
	return true, true, fmt.Sprintf("%d tools/call(s), each with its journaled tool.requested verified natively and with openssl", calls)
}
