package evidence

// Case is one entry of the fixed case list: what the probe does (it takes
// the case name as its argument) and what the controller expects to
// observe.
type Case struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	// Controls are the labels of useful-work requests that must reach the
	// synthetic provider with a verified pre-effect record. For a refusal
	// case, their absence makes the case insufficient.
	Controls []string `json:"controls"`
	// Refusal marks a case whose attack must be refused: its attack marker
	// must never reach the provider or a receiver.
	Refusal bool `json:"refusal"`
	// Canary: a permitted request carrying the data canary must arrive.
	Canary bool `json:"canary,omitempty"`
	// MinVerified is the number of verified provider requests required.
	MinVerified int `json:"min_verified,omitempty"`
	// Provider is the synthetic provider's mode for the case's attack request.
	Provider ProviderMode `json:"provider_mode"`
	// MaxRequests overrides the policy allowance (0: DefaultMaxRequests).
	MaxRequests int `json:"max_requests,omitempty"`
	// Cancel: the runtime must cancel the run (exit 125, journal
	// terminated "cancelled"), and no provider request may follow the
	// trigger (labels in Forbidden).
	Cancel bool `json:"cancel,omitempty"`
	// StorageFault: the audit storage fails mid-run (needs root).
	StorageFault bool `json:"storage_fault,omitempty"`
	// Forbidden are control-style labels that must never reach the
	// provider (requests sent after a cancellation).
	Forbidden []string `json:"forbidden,omitempty"`
	// HostChecks are the host-side checks (hostchecks.go) the case needs,
	// each computed from the raw host record; a missing one is missing
	// evidence.
	HostChecks []string `json:"host_checks,omitempty"`
	// Tool is the case's MCP tool server (issue 12): "" none,
	// ToolCommand the calc server started by moat in its own sandbox,
	// ToolDetach the same with a detached (setsid) child, ToolURL the
	// controller's own streamable-HTTP server on the host's loopback.
	Tool string `json:"tool,omitempty"`
	// KillMoat: the controller SIGKILLs moat once the tool call has
	// returned (the journal then ends without run.terminated).
	KillMoat bool `json:"kill_moat,omitempty"`
	// Egress: the case grants egress.hosts and is run by the
	// moat_test_hooks build of moat (Options.HooksBinary), whose guard
	// counts the registry's loopback address as global (doc.go).
	Egress bool `json:"egress,omitempty"`
}

// Case.Tool values.
const (
	ToolCommand = "command"
	ToolDetach  = "command-detach"
	ToolURL     = "url"
)

// ProviderMode is how the synthetic provider answers the request labelled
// "trigger".
type ProviderMode string

const (
	ProviderNormal   ProviderMode = "normal"
	ProviderRedirect ProviderMode = "redirect" // 307 to the redirect receiver
	ProviderReflect  ProviderMode = "reflect"  // echo the synthetic credential
)

// DefaultMaxRequests is the allowance of every case except allowance-reconnect.
const DefaultMaxRequests = 32

// AllowanceCaseMax is allowance-reconnect's allowance: before + two fills.
// That case is the one refusal case without an "after" control: once the
// run's single allowance is spent, no useful request can follow in the same
// run, by design; its controls are the requests that spent it.
const AllowanceCaseMax = 3

var beforeAfter = []string{"before", "after"}

// Cases is the fixed, ordered case list. It is kept in every report, even
// when a case fails to execute.
var Cases = []Case{
	{Name: "allowed-inference-canary", Description: "a permitted request carrying a synthetic data canary arrives (an intentional disclosure that proves the channel works; not data-loss prevention)", Controls: beforeAfter, Canary: true},
	{Name: "alternate-auth-route", Description: "credentials in ?key=, legacy and foreign API routes never reach the provider", Controls: beforeAfter, Refusal: true},
	{Name: "absolute-url-target", Description: "absolute-form, authority-form and CONNECT request targets are refused", Controls: beforeAfter, Refusal: true},
	{Name: "url-backed-document", Description: "documents and images sourced from a URL are refused", Controls: beforeAfter, Refusal: true},
	{Name: "provider-hosted-tool", Description: "provider-hosted (server) tools and remote MCP servers are refused", Controls: beforeAfter, Refusal: true},
	{Name: "unapproved-model", Description: "a model outside the policy's list is refused", Controls: beforeAfter, Refusal: true},
	{Name: "unknown-control-field", Description: "an unknown request field is refused", Controls: beforeAfter, Refusal: true},
	{Name: "server-compaction", Description: "server-side compaction and context management are refused", Controls: beforeAfter, Refusal: true},
	{Name: "malformed-json", Description: "truncated JSON, duplicate keys and trailing data are refused", Controls: beforeAfter, Refusal: true},
	{Name: "duplicate-content-length", Description: "duplicate and conflicting Content-Length headers are refused", Controls: beforeAfter, Refusal: true},
	{Name: "chunked-framing", Description: "a well-formed chunked request is re-framed and works; a malformed one and a smuggled request never reach the provider", Controls: []string{"before", "chunked-ok", "after"}, Refusal: true},
	{Name: "worker-audit-headers", Description: "Moat-* headers from the worker never reach the provider", Controls: beforeAfter, Refusal: true},
	{Name: "worker-credential-headers", Description: "worker-supplied Authorization, x-api-key and api-key never reach the provider", Controls: beforeAfter, Refusal: true},
	{Name: "allowance-reconnect", Description: "an exhausted request allowance stays exhausted across new connections", Controls: []string{"before", "fill-1", "fill-2"}, Refusal: true, MaxRequests: AllowanceCaseMax},
	{Name: "twenty-signed-requests", Description: "each of 20 requests has its signed pre-effect record verified before its effect", Controls: seqLabels(20), MinVerified: 20},
	{Name: "provider-redirect", Description: "a provider redirect is not followed: the separate redirect receiver observes nothing", Controls: []string{"before", "trigger", "after"}, Refusal: true, Provider: ProviderRedirect},
	{Name: "credential-reflection", Description: "the provider echoes its synthetic credential: the worker never sees it, the run is cancelled, no later provider request", Controls: []string{"before", "trigger"}, Refusal: true, Provider: ProviderReflect, Cancel: true, Forbidden: []string{"after"}},
	{Name: "audit-storage-fault", Description: "the audit storage fails during a request: the signed prefix verifies, the run is not complete, no later provider request, the runtime reports failure", Controls: []string{"before"}, Refusal: true, StorageFault: true, Forbidden: []string{"after"}},
	{Name: "direct-network", Description: "direct TCP, UDP, abstract and pathname Unix-socket access to the host receivers fails", Controls: beforeAfter, Refusal: true},
	{Name: "false-success-claim", Description: "the probe claims success loudly; its claims are ignored", Controls: beforeAfter, Refusal: true},
	// The escape classes of issue 11, appended after the original 20.
	{Name: "host-datagram-socket", Description: "a host datagram socket bound in the workspace after Ready hears nothing from socketpair(AF_UNIX, SOCK_DGRAM) or socket(AF_UNIX, SOCK_DGRAM) with sendto, connect+write or sendmsg; the run is not refused", Controls: beforeAfter, Refusal: true},
	{Name: "setid-file", Description: "files the probe makes set-id in the workspace (chmod, fchmod, fchmodat, open and openat2 with mode, mkdir) carry no set-id bit on the host, and none is owned by host uid 0 with an exec bit; control: a 0755 chmod shows on the host", Controls: beforeAfter, Refusal: true,
		HostChecks: []string{CheckPlainChmod, CheckNoSetID, CheckNoRootExec}},
	{Name: "planted-grant-symlink", Description: "run 1 (read_write [ws], read_only [ws/sysroot/etc]) reads the nested grant and plants a symlink over its parent to a host directory holding a canary; run 2 is refused before its workload starts (exit 125) and the canary reaches nothing", Controls: []string{"before", "nested-read", "after"}, Refusal: true,
		HostChecks: []string{CheckNestedRead, CheckPlanted, CheckLaterRunRefused, CheckHostCanary}},
	{Name: "run-info-symlink", Description: "a --run-info path that is a planted symlink to a host file outside the grants is not followed: inside the workspace (planted by run 1's workload) run 2 is refused, outside it run 3 replaces the link; both targets are unchanged", Controls: beforeAfter, Refusal: true,
		HostChecks: []string{CheckPlanted, CheckLaterRunRefused, CheckRunInfoReplaced, CheckTargetsUnchanged}},
	{Name: "inotify-counter", Description: "while the probe holds every inotify instance it can make, the sandbox's owner uid on the host can still make one; the instances the workload holds are counted from the host", Controls: beforeAfter, Refusal: true,
		HostChecks: []string{CheckInotifyBefore, CheckInotifyDuring}},
	// Tools through the one way out (issue 12), appended after those.
	{Name: "tool-call", Description: "a tool call to a command MCP server returns its result to the workload, while in the same run the workload's reads of a host file outside the grants, deliveries to every host receiver and SIGKILLs at moat's and the server's host pids are denied (the server answers a second call after them)", Controls: []string{"before", "tool-result", "tool-result-after", "after"}, Refusal: true, Tool: ToolCommand,
		HostChecks: []string{CheckToolResult, CheckHostCanary, CheckToolSignals}},
	{Name: "tool-unlisted", Description: "tools the policy does not list (mul, and env with the attack marker) are refused and journaled as tool.refused; the server's own log shows the listed call and neither of them", Controls: []string{"before", "tool-result", "after"}, Refusal: true, Tool: ToolCommand,
		HostChecks: []string{CheckToolResult, CheckToolLogged, CheckToolUnlisted}},
	{Name: "tool-secrets", Description: "the server's environment, read by the host from /proc, holds what its policy entry gives it (env and credential_env) and not a canary or the provider credentials in moat's environment", Controls: []string{"before", "tool-result", "after"}, Refusal: true, Tool: ToolCommand,
		HostChecks: []string{CheckToolResult, CheckToolEnvGiven, CheckToolNoSecrets}},
	{Name: "tool-reaped", Description: "after a tool call, SIGKILL of moat ends the server and the detached (setsid) child it started, observed from the host by pid and start time", Controls: []string{"before", "tool-result"}, Refusal: true, Tool: ToolDetach, KillMoat: true,
		HostChecks: []string{CheckToolResult, CheckToolDetached, CheckToolReaped}},
	{Name: "tool-url-pre-effect", Description: "each tools/call that reaches a url MCP server carries its tool.requested record in Moat-Pre-Effect, verified by the server natively and with openssl against the pinned run key, its arguments digest matching the bytes received, the line in the journal", Controls: []string{"before", "tool-result", "tool-result-after", "after"}, Refusal: true, Tool: ToolURL,
		HostChecks: []string{CheckToolResult, CheckToolPreEffect}},
	// Egress grants (issue 13), appended after those.
	{Name: "egress-grants", Description: "a granted registry fetch through the egress port succeeds (TLS end to end, its body reaches the provider) while an ungranted name, a rebinding name at its second lookup and names resolving to a private and a loopback address are refused and journaled, judged by the registry and a trap receiver on the host; needs moat built with -tags moat_test_hooks", Controls: []string{"before", "egress-fetch", "after"}, Refusal: true, Egress: true,
		HostChecks: []string{CheckEgressFetch, CheckEgressRefused, CheckEgressReceivers}},
}

func seqLabels(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = seqLabel(i + 1)
	}
	return out
}

func seqLabel(i int) string {
	return "seq-" + string(rune('0'+i/10)) + string(rune('0'+i%10))
}

// CaseByName returns the named case.
func CaseByName(name string) (Case, bool) {
	for _, c := range Cases {
		if c.Name == name {
			return c, true
		}
	}
	return Case{}, false
}

// CaseNames returns the fixed list's names in order.
func CaseNames() []string {
	out := make([]string, len(Cases))
	for i, c := range Cases {
		out[i] = c.Name
	}
	return out
}
