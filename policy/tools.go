package policy

import (
	"encoding/json"
	"errors"
	"fmt"
	neturl "net/url"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/moat-sandbox/moat/internal/fsutil"
	"github.com/moat-sandbox/moat/internal/grants"
)

// Tools configures the tool servers that the workload may reach, only
// through the broker's listener (MCP streamable HTTP at /mcp/<name>).
//
// A tools.mcp entry names one MCP server:
//
//	tools:
//	  mcp:
//	    - name: calc                       # [a-z][a-z0-9-]*: /mcp/calc, MOAT_MCP_CALC_URL
//	      command: [/opt/mcp/calc, --stdio] # a stdio server moat starts in a sandbox of its own
//	      env: {LANG: C.UTF-8}             # the server's whole environment; nothing is inherited
//	      credential_env: CALC_TOKEN       # moat's variable, given to the server, never to the workload
//	      tools: [add, mul]                # allowlist; "*" (alone) allows every tool
//	      max_calls: 64                    # tools/call allowance of the run
//	      max_argument_bytes: 64Ki         # canonical arguments per call
//	      timeout: 30s                     # per call
//	      filesystem:                      # the server's own grants (command servers only)
//	        read_only: [/opt/mcp]
//
// Exactly one of command and url is given. A url server is reached over
// MCP streamable HTTP: https, or plain http to 127.0.0.0/8, ::1 or
// localhost. A url whose host is not a loopback address is dialled
// through the run's egress guard (internal/netguard: one resolution,
// global unicast only, the checked address dialled), and its redirects
// are refused, whatever host it names.
type Tools struct {
	MCP []MCPServer `yaml:"mcp,omitempty" json:"mcp,omitempty"`
}

// MCPServer is one tools.mcp entry.
type MCPServer struct {
	Name    string   `yaml:"name" json:"name"`
	Command []string `yaml:"command,omitempty" json:"command,omitempty"`
	URL     string   `yaml:"url,omitempty" json:"url,omitempty"`
	// Env is a command server's whole environment (plus the credential).
	// Always present for command servers ({} for none).
	Env           map[string]string `yaml:"env,omitempty" json:"env,omitempty"`
	CredentialEnv string            `yaml:"credential_env,omitempty" json:"credential_env,omitempty"`
	// Tools is the allowlist of tool names; ["*"] allows all.
	Tools            []string `yaml:"tools" json:"tools"`
	MaxCalls         int      `yaml:"max_calls" json:"max_calls"`
	MaxArgumentBytes Size     `yaml:"max_argument_bytes" json:"max_argument_bytes"`
	Timeout          Duration `yaml:"timeout" json:"timeout"`
	// Filesystem is a command server's own grants (nothing else of the
	// host is visible to it; its executable must lie inside one).
	Filesystem *ServerFilesystem `yaml:"filesystem,omitempty" json:"filesystem,omitempty"`
}

// ServerFilesystem is a command server's grants: host paths mounted at the
// same path inside the server's sandbox.
type ServerFilesystem struct {
	ReadOnly  []string `yaml:"read_only" json:"read_only"`
	ReadWrite []string `yaml:"read_write" json:"read_write"`
}

// AllowsTool reports whether the entry's allowlist names tool (or is "*").
func (s *MCPServer) AllowsTool(tool string) bool {
	return slices.Contains(s.Tools, AllTools) || slices.Contains(s.Tools, tool)
}

// EnvName is the workload variable that holds the server's URL:
// MOAT_MCP_<NAME>_URL, the name upper-cased with '-' as '_'.
func (s *MCPServer) EnvName() string { return MCPEnvName(s.Name) }

// MCPEnvName: see MCPServer.EnvName.
func MCPEnvName(name string) string {
	return "MOAT_MCP_" + strings.ReplaceAll(strings.ToUpper(name), "-", "_") + "_URL"
}

// Tool server defaults and limits.
const (
	AllTools                     = "*"
	DefaultMaxToolCalls          = 64
	MaxToolCallsLimit            = 1 << 20
	DefaultMaxArgumentBytes Size = 64 << 10
	MinArgumentBytes        Size = 2 // {}
	MaxArgumentBytesLimit   Size = 1 << 20
	DefaultToolTimeout           = Duration(30 * time.Second)
	MinToolTimeout               = Duration(100 * time.Millisecond)
	MaxToolTimeout               = Duration(10 * time.Minute)
	MaxMCPServers                = 16
	MaxServerTools               = 256
	MaxCommandArgs               = 64
	maxServerNameLen             = 32
	maxToolNameLen               = 128
)

var (
	toolsKeys    = []string{"mcp"}
	mcpKeys      = []string{"name", "command", "url", "env", "credential_env", "tools", "max_calls", "max_argument_bytes", "timeout", "filesystem"}
	serverFSKeys = []string{"read_only", "read_write"}
)

// Duration is a time span written as Go writes it ("30s", "1m30s").
type Duration time.Duration

func (d Duration) String() string { return time.Duration(d).String() }

// MarshalYAML writes the Go form, which the decoder reads back.
func (d Duration) MarshalYAML() (any, error) { return d.String(), nil }

// MarshalJSON writes the Go form as a JSON string.
func (d Duration) MarshalJSON() ([]byte, error) { return []byte(`"` + d.String() + `"`), nil }

// UnmarshalJSON reads back what MarshalJSON writes: the Go form as a JSON
// string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration: want a string such as \"10s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("duration: %w", err)
	}
	*d = Duration(v)
	return nil
}

// validServerName: 1-32 of [a-z0-9-], starting with a letter, not ending
// with '-', no "--" (so that names and their variables stay readable).
func validServerName(s string) bool {
	if s == "" || len(s) > maxServerNameLen || s[0] < 'a' || s[0] > 'z' || s[len(s)-1] == '-' || strings.Contains(s, "--") {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// ValidToolName is MCP's tool name rule: 1-128 of [A-Za-z0-9_.-].
func ValidToolName(s string) bool {
	if s == "" || len(s) > maxToolNameLen {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-') {
			return false
		}
	}
	return true
}

func (d *decoder) tools(n *yaml.Node, t *Tools) {
	f := d.mapping(n, "tools", toolsKeys...)
	if n := f["mcp"]; n != nil {
		envNames := map[string]string{}
		for i, item := range d.seq(n, "tools.mcp", MaxMCPServers) {
			ip := fmt.Sprintf("tools.mcp[%d]", i)
			if s, ok := d.mcpServer(item, ip); ok {
				if prev, dup := envNames[s.EnvName()]; dup {
					d.add(item, CodeDuplicate, ip+".name", "server name %q gives the variable %s, which %s already uses; choose another name", s.Name, s.EnvName(), prev)
					continue
				}
				envNames[s.EnvName()] = ip
				t.MCP = append(t.MCP, s)
			}
		}
	}
}

func (d *decoder) mcpServer(n *yaml.Node, ip string) (MCPServer, bool) {
	s := MCPServer{MaxCalls: DefaultMaxToolCalls, MaxArgumentBytes: DefaultMaxArgumentBytes, Timeout: DefaultToolTimeout}
	nprobs := len(d.probs)
	f := d.mapping(n, ip, mcpKeys...)
	if n.Kind != yaml.MappingNode {
		return s, false
	}
	if v := f["name"]; v != nil {
		if name, ok := d.str(v, ip+".name"); ok {
			if !validServerName(name) {
				d.add(v, CodeBadValue, ip+".name", "name %q must be 1-%d characters of a-z, 0-9 and '-', starting with a letter, not ending with '-' and without \"--\" (it becomes /mcp/<name> and MOAT_MCP_<NAME>_URL)", name, maxServerNameLen)
			}
			s.Name = name
		}
	} else {
		d.add(n, CodeMissing, ip+".name", "missing; every tool server needs a name")
	}
	cmd, url := f["command"], f["url"]
	switch {
	case cmd == nil && url == nil:
		d.add(n, CodeMissing, ip+".command", "missing; give command (the argv of a stdio MCP server that moat starts) or url (a streamable-HTTP MCP server)")
	case cmd != nil && url != nil:
		d.add(url, CodeBadValue, ip+".url", "command and url are both given; a server is either started by moat (command) or reached at url, not both")
	case cmd != nil:
		s.Command = d.command(cmd, ip+".command")
		s.Env = map[string]string{}
		s.Filesystem = &ServerFilesystem{ReadOnly: []string{}, ReadWrite: []string{}}
	default:
		if u, ok := d.str(url, ip+".url"); ok {
			if msg := checkToolURL(u); msg != "" {
				d.add(url, CodeURL, ip+".url", "%s", msg)
			}
			s.URL = u
		}
	}
	if v := f["env"]; v != nil {
		if url != nil {
			d.add(v, CodeBadValue, ip+".env", "env applies to a command server; a url server runs elsewhere (use credential_env for its bearer token)")
		} else {
			s.Env = d.env(v, ip+".env")
		}
	}
	if v := f["credential_env"]; v != nil {
		if c, ok := d.str(v, ip+".credential_env"); ok {
			if !validEnvName(c) {
				d.add(v, CodeBadValue, ip+".credential_env", "%q is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)", c)
			} else if _, dup := s.Env[c]; dup {
				d.add(v, CodeDuplicate, ip+".credential_env", "%s is also set in %s.env; the credential comes from moat's environment only", c, ip)
			}
			s.CredentialEnv = c
		}
	}
	if v := f["tools"]; v != nil {
		s.Tools = d.toolNames(v, ip+".tools")
	} else {
		d.add(n, CodeMissing, ip+".tools", "missing; list the tool names the workload may call, or write [\"*\"] to allow every tool of this server")
	}
	if v := f["max_calls"]; v != nil {
		if x, ok := d.limit(v, ip+".max_calls", 0, MaxToolCallsLimit); ok {
			s.MaxCalls = x
		}
	}
	if v := f["max_argument_bytes"]; v != nil {
		if x, ok := d.size(v, ip+".max_argument_bytes", MinArgumentBytes); ok {
			if x > MaxArgumentBytesLimit {
				d.add(v, CodeBadValue, ip+".max_argument_bytes", "%d bytes is above the limit of %d", int64(x), int64(MaxArgumentBytesLimit))
			}
			s.MaxArgumentBytes = x
		}
	}
	if v := f["timeout"]; v != nil {
		if x, ok := d.duration(v, ip+".timeout"); ok {
			s.Timeout = x
		}
	}
	if v := f["filesystem"]; v != nil {
		if url != nil {
			d.add(v, CodeBadValue, ip+".filesystem", "filesystem applies to a command server, which moat starts in a sandbox of its own")
		} else if s.Filesystem != nil {
			ff := d.mapping(v, ip+".filesystem", serverFSKeys...)
			if g := ff["read_only"]; g != nil {
				s.Filesystem.ReadOnly = d.serverPaths(g, ip+".filesystem.read_only")
			}
			if g := ff["read_write"]; g != nil {
				s.Filesystem.ReadWrite = d.serverPaths(g, ip+".filesystem.read_write")
			}
		}
	}
	if len(s.Command) > 0 && s.Filesystem != nil && filepath.IsAbs(s.Command[0]) {
		fs := s.Filesystem
		if !slices.ContainsFunc(append(slices.Clone(fs.ReadOnly), fs.ReadWrite...), func(g string) bool { return fsutil.Within(s.Command[0], g) }) {
			d.add(cmd, CodeBadPath, ip+".command[0]", "%s is outside the server's grants, so its sandbox could not see it; grant its directory in %s.filesystem.read_only", s.Command[0], ip)
		}
	}
	return s, len(d.probs) == nprobs
}

// command decodes an argv: 1 to MaxCommandArgs strings, argv[0] a path
// (relative ones resolve against the policy's directory).
func (d *decoder) command(n *yaml.Node, path string) []string {
	items := d.seq(n, path, MaxCommandArgs)
	if n.Kind == yaml.SequenceNode && len(items) == 0 {
		d.add(n, CodeMissing, path, "empty; give the server's argv, e.g. [/opt/mcp/calc]")
		return nil
	}
	var out []string
	for i, item := range items {
		ip := fmt.Sprintf("%s[%d]", path, i)
		if i == 0 {
			if p, ok := d.path(item, ip); ok {
				out = append(out, p)
			}
			continue
		}
		a, ok := d.str(item, ip)
		if !ok {
			continue
		}
		if strings.IndexByte(a, 0) >= 0 || len(a) > maxPathLen {
			d.add(item, CodeBadValue, ip, "argument must be at most %d bytes with no NUL", maxPathLen)
			continue
		}
		out = append(out, a)
	}
	return out
}

func (d *decoder) toolNames(n *yaml.Node, path string) []string {
	items := d.seq(n, path, MaxServerTools)
	if n.Kind == yaml.SequenceNode && len(items) == 0 {
		d.add(n, CodeMissing, path, "empty; a server with no allowed tools can do nothing: list tool names, or write [\"*\"]")
	}
	out := []string{}
	seen := map[string]int{}
	for i, item := range items {
		ip := fmt.Sprintf("%s[%d]", path, i)
		t, ok := d.str(item, ip)
		if !ok {
			continue
		}
		switch j, dup := seen[t]; {
		case dup:
			d.add(item, CodeDuplicate, ip, "tool %q is already listed at %s[%d]", t, path, j)
			continue
		case t == AllTools && len(items) > 1:
			d.add(item, CodeBadValue, ip, "\"*\" allows every tool and must be the only item; remove it or the other names")
			continue
		case t != AllTools && !ValidToolName(t):
			d.add(item, CodeBadValue, ip, "tool name %q must be 1-%d characters of A-Z, a-z, 0-9, '_', '.' and '-'", t, maxToolNameLen)
			continue
		}
		seen[t] = i
		out = append(out, t)
	}
	return out
}

func (d *decoder) duration(n *yaml.Node, path string) (Duration, bool) {
	s, ok := d.str(n, path)
	if !ok {
		return 0, false
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		d.add(n, CodeBadValue, path, "%q is not a duration: write one such as 30s or 2m", s)
		return 0, false
	}
	if x := Duration(v); x < MinToolTimeout || x > MaxToolTimeout {
		d.add(n, CodeBadValue, path, "%s is out of range [%s, %s]", x, MinToolTimeout, MaxToolTimeout)
		return 0, false
	}
	return Duration(v), true
}

// serverPaths decodes a server's grant list. These are not the workload's
// grants: they are kept apart (validateTools checks them).
func (d *decoder) serverPaths(n *yaml.Node, path string) []string {
	out := []string{}
	for i, item := range d.seq(n, path, MaxGrants) {
		ip := fmt.Sprintf("%s[%d]", path, i)
		if s, ok := d.path(item, ip); ok {
			out = append(out, s)
		}
	}
	return out
}

// checkToolURL is checkBaseURL: https, or http to a loopback host. A
// remote url is dialled through the egress guard (IsLoopbackURL says
// which are not).
func checkToolURL(s string) string {
	if msg := checkBaseURL(s); msg != "" {
		return strings.Replace(msg, "base_url", "url", 1)
	}
	return ""
}

// IsLoopbackURL reports whether a tools.mcp url names a loopback host
// (127.0.0.0/8, ::1 or localhost), which moat dials directly; any other
// is dialled through the egress guard.
func IsLoopbackURL(s string) bool {
	u, err := neturl.Parse(s)
	return err == nil && isLoopbackHost(u.Hostname())
}

// validateTools checks each command server's grants as a backend would
// resolve them (they exist, no Unix socket, no symlink others can plant)
// and keeps the audit directory out of them.
func (d *decoder) validateTools(p *Policy) {
	for i, s := range p.Tools.MCP {
		if s.Filesystem == nil {
			continue
		}
		ip := fmt.Sprintf("tools.mcp[%d].filesystem", i)
		var specs []grants.Spec
		for j, g := range s.Filesystem.ReadOnly {
			specs = append(specs, grants.Spec{Key: fmt.Sprintf("%s.read_only[%d]", ip, j), Path: g})
		}
		for j, g := range s.Filesystem.ReadWrite {
			specs = append(specs, grants.Spec{Key: fmt.Sprintf("%s.read_write[%d]", ip, j), Path: g, Write: true})
		}
		if _, err := grants.Resolve(specs, p.Audit.Dir); err != nil {
			var ge *grants.Error
			if errors.As(err, &ge) {
				for _, pr := range ge.Problems {
					d.add(d.nodes[pr.Key], pr.Code, pr.Key, "%s", pr.Message)
				}
			} else {
				d.add(nil, CodeNotFound, ip, "%v", err)
			}
		}
		for _, sp := range specs {
			if overlaps(sp.Path, p.Audit.Dir) || overlaps(realPrefix(sp.Path), realPrefix(p.Audit.Dir)) {
				d.add(d.nodes[sp.Key], CodeAuditInside, sp.Key, "grant %s overlaps the audit directory %s; a tool server must not reach the journal", sp.Path, p.Audit.Dir)
			}
		}
	}
}

// ServerPolicy is the policy of a command server's own sandbox: its
// grants, its environment (without the credential, which the caller adds),
// no providers, and the workload policy's identity, limits and Landlock
// floor. nil for a url server.
func (p *Policy) ServerPolicy(s *MCPServer) *Policy {
	if s.Filesystem == nil || len(s.Command) == 0 {
		return nil
	}
	q := defaults()
	q.Backend, q.Landlock, q.Audit = p.Backend, p.Landlock, p.Audit
	q.Process.UID, q.Process.GID = p.Process.UID, p.Process.GID
	q.Process.HostUID, q.Process.HostGID = p.Process.HostUID, p.Process.HostGID
	q.Process.Limits = p.Process.Limits
	q.Process.SupervisorTimeout = p.Process.SupervisorTimeout
	q.Filesystem.ReadOnly = slices.Clone(s.Filesystem.ReadOnly)
	q.Filesystem.ReadWrite = slices.Clone(s.Filesystem.ReadWrite)
	q.Process.Env = map[string]string{}
	for k, v := range s.Env {
		q.Process.Env[k] = v
	}
	q.Process.Workdir = "/tmp"
	if len(q.Filesystem.ReadWrite) > 0 {
		q.Process.Workdir = q.Filesystem.ReadWrite[0]
	}
	q.Inference.MaxRequests = 0
	q.Source = p.Source
	return q
}
