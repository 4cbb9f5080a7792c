package policy

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/internal/testenv"
)

// fixture is a policy directory with a workspace, a read-only data
// directory and an audit parent, all real.
type fixture struct {
	dir, ws, data string
}

func newFixture(t *testing.T) fixture {
	t.Helper()
	dir := t.TempDir()
	f := fixture{dir: dir, ws: filepath.Join(dir, "workspace"), data: filepath.Join(dir, "data")}
	for _, d := range []string{f.ws, f.data} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

func (f fixture) parse(t *testing.T, y string) (*Policy, *Error) {
	t.Helper()
	p, err := Parse([]byte(y), f.dir)
	if err == nil {
		return p, nil
	}
	var pe *Error
	if !errors.As(err, &pe) {
		t.Fatalf("Parse error %T %v, want *Error", err, err)
	}
	if p != nil {
		t.Errorf("Parse returned a policy along with an error")
	}
	return nil, pe
}

func TestParseValid(t *testing.T) {
	f := newFixture(t)
	tests := []struct {
		name  string
		yaml  string
		check func(t *testing.T, p *Policy)
	}{
		{"version alone is all defaults", "version: 1\n", func(t *testing.T, p *Policy) {
			want := defaults()
			want.Process.Workdir = "/tmp"
			want.Audit.Dir = defaultAuditDir()
			if !reflect.DeepEqual(p, want) {
				t.Errorf("got %+v, want %+v", p, want)
			}
		}},
		{"run-wide caps", "inference: {max_refusals: 0}\naudit: {max_bytes: 1Mi}\n", func(t *testing.T, p *Policy) {
			if p.Inference.MaxRefusals != 0 || p.Audit.MaxBytes != 1<<20 {
				t.Errorf("max_refusals %d, max_bytes %d; want 0 and %d", p.Inference.MaxRefusals, p.Audit.MaxBytes, 1<<20)
			}
		}},
		{"run-wide caps default", "version: 1\n", func(t *testing.T, p *Policy) {
			if p.Inference.MaxRefusals != DefaultMaxRefusals || p.Audit.MaxBytes != DefaultAuditMaxBytes {
				t.Errorf("max_refusals %d, max_bytes %d; want %d and %d", p.Inference.MaxRefusals, p.Audit.MaxBytes, DefaultMaxRefusals, DefaultAuditMaxBytes)
			}
		}},
		{"comments and version", "# nothing else\nversion: 1 # the format\n", func(t *testing.T, p *Policy) {
			if p.Version != 1 || p.Backend != "native" {
				t.Errorf("got version %d backend %q, want 1 native", p.Version, p.Backend)
			}
		}},
		{"relative paths resolve against the policy directory", `
filesystem:
  read_only: [./data, /usr]
  read_write: [workspace]
audit: {dir: runs}
`, func(t *testing.T, p *Policy) {
			if got, want := p.Filesystem.ReadWrite, []string{f.ws}; !reflect.DeepEqual(got, want) {
				t.Errorf("read_write got %v, want %v", got, want)
			}
			if got, want := p.Filesystem.ReadOnly, []string{f.data, "/usr"}; !reflect.DeepEqual(got, want) {
				t.Errorf("read_only got %v, want %v", got, want)
			}
			if got, want := p.Process.Workdir, f.ws; got != want {
				t.Errorf("workdir got %q, want first read_write %q", got, want)
			}
			if got, want := p.Audit.Dir, filepath.Join(f.dir, "runs"); got != want {
				t.Errorf("audit.dir got %q, want %q", got, want)
			}
		}},
		{"sizes", `
filesystem: {tmp_size: 1Gi}
process: {limits: {memory: 268435456, pids: 10, open_files: 64}}
`, func(t *testing.T, p *Policy) {
			if p.Filesystem.TmpSize != 1<<30 || p.Process.Limits.Memory != 256<<20 {
				t.Errorf("got tmp_size %d memory %d, want %d %d", p.Filesystem.TmpSize, p.Process.Limits.Memory, 1<<30, 256<<20)
			}
			if p.Process.Limits.Pids != 10 || p.Process.Limits.OpenFiles != 64 {
				t.Errorf("got pids %d open_files %d, want 10 64", p.Process.Limits.Pids, p.Process.Limits.OpenFiles)
			}
		}},
		{"env given replaces the default env", "process: {env: {PATH: /bin, LANG: C}}\n", func(t *testing.T, p *Policy) {
			if want := map[string]string{"PATH": "/bin", "LANG": "C"}; !reflect.DeepEqual(p.Process.Env, want) {
				t.Errorf("env got %v, want %v", p.Process.Env, want)
			}
		}},
		{"empty env is empty", "process: {env: {}}\n", func(t *testing.T, p *Policy) {
			if len(p.Process.Env) != 0 {
				t.Errorf("env got %v, want empty", p.Process.Env)
			}
		}},
		{"ids and zero allowances", `
process: {uid: 4242, gid: 4343, host_uid: 5000, host_gid: 5001}
inference: {max_requests: 0, max_output_tokens: 0, require_attribution: true}
`, func(t *testing.T, p *Policy) {
			pr := p.Process
			if pr.UID != 4242 || pr.GID != 4343 || pr.HostUID != 5000 || pr.HostGID != 5001 {
				t.Errorf("got ids %d %d %d %d, want 4242 4343 5000 5001", pr.UID, pr.GID, pr.HostUID, pr.HostGID)
			}
			if p.Inference.MaxRequests != 0 || p.Inference.MaxOutputTokens != 0 || !p.Inference.RequireAttribution {
				t.Errorf("got inference %+v", p.Inference)
			}
		}},
		{"providers, loopback http", `
inference:
  providers:
    - {name: local, api: openai-chat, base_url: "http://127.0.0.7:8080", credential_env: LOCAL_KEY, models: [m1]}
    - {name: local6, api: openai-responses, base_url: "http://[::1]:9/x", credential_env: K6, models: [m2, m3]}
    - {name: lh, api: anthropic-messages, base_url: "http://localhost", credential_env: _K, models: [m4]}
    - {name: real, api: anthropic-messages, base_url: "https://api.anthropic.com", credential_env: ANTHROPIC_API_KEY, models: [claude-sonnet-4-5]}
`, func(t *testing.T, p *Policy) {
			if len(p.Inference.Providers) != 4 || p.Inference.Providers[1].Models[1] != "m3" {
				t.Errorf("got providers %+v", p.Inference.Providers)
			}
		}},
		{"gvisor backend and workdir /tmp", "backend: gvisor\nfilesystem: {read_write: [workspace]}\nprocess: {workdir: /tmp}\nlandlock: {abi_floor: 8}\n", func(t *testing.T, p *Policy) {
			if p.Backend != "gvisor" || p.Process.Workdir != "/tmp" || p.Landlock.ABIFloor != 8 {
				t.Errorf("got backend %q workdir %q abi_floor %d", p.Backend, p.Process.Workdir, p.Landlock.ABIFloor)
			}
		}},
		{"a file grant", "filesystem: {read_only: [/etc/hostname]}\n", func(t *testing.T, p *Policy) {}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, perr := f.parse(t, v1(tt.yaml))
			if perr != nil {
				t.Fatalf("Parse: %v", perr)
			}
			tt.check(t, p)
		})
	}
}

// v1 puts "version: 1" in front of a policy that does not say it.
func v1(y string) string {
	if strings.HasPrefix(y, "version:") || strings.Contains(y, "\nversion:") {
		return y
	}
	return "version: 1\n" + y
}

// TestVersionRequired: an empty policy, one of comments only and one
// without version are refused, each with the line and a message that says
// what to write; "version: 1" added to each is the control.
func TestVersionRequired(t *testing.T) {
	f := newFixture(t)
	tests := []struct {
		name, yaml string
		path       string
		line       int
		msg        string
		fixed      string // the control; default "version: 1\n" + yaml
	}{
		{"empty file", "", "", 1, `the policy is empty (no keys, at most comments); write at least "version: 1"`, ""},
		{"whitespace only", "\n  \n", "", 1, "the policy is empty", ""},
		{"comments only", "# a policy\n# to be written\n", "", 1, "the policy is empty", ""},
		{"no version", "# grants\nfilesystem:\n  read_write: [workspace]\n", "version", 2, `missing; write "version: 1" as the first line`, ""},
		{"no version, flow style", "{filesystem: {read_only: [data]}}\n", "version", 1, `write "version: 1"`, "{version: 1, filesystem: {read_only: [data]}}\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, perr := f.parse(t, tt.yaml)
			if perr == nil {
				t.Fatalf("Parse accepted %q", tt.yaml)
			}
			if len(perr.Problems) != 1 {
				t.Fatalf("got %d problems, want 1: %v", len(perr.Problems), perr)
			}
			got := perr.Problems[0]
			if got.Code != CodeMissing || got.Path != tt.path || got.Line != tt.line || !strings.Contains(got.Message, tt.msg) {
				t.Errorf("got %s %q line %d %q; want %s %q line %d containing %q", got.Code, got.Path, got.Line, got.Message, CodeMissing, tt.path, tt.line, tt.msg)
			}
			// Control: the same file with the version written loads.
			fixed := tt.fixed
			if fixed == "" {
				fixed = "version: 1\n" + tt.yaml
			}
			if _, perr := f.parse(t, fixed); perr != nil {
				t.Errorf("with version: 1: %v", perr)
			}
		})
	}
	// A file without version that has other problems reports all of them.
	_, perr := f.parse(t, "process: {uid: 0}\n")
	if perr == nil || !perr.Has(CodeMissing, "version") || !perr.Has(CodeRootID, "process.uid") {
		t.Errorf("got %v, want missing version and uid 0 both", perr)
	}
}

type want struct{ code, path string }

func TestParseErrors(t *testing.T) {
	f := newFixture(t)
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(f.ws, "f"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(f.dir, "link")); err != nil {
		t.Fatal(err)
	}
	prov := func(fields string) string {
		return "inference:\n  providers:\n    - {" + fields + "}\n"
	}
	const okProv = `name: a, api: openai-chat, base_url: "https://x.example", credential_env: K, models: [m]`
	tests := []struct {
		name string
		yaml string
		want []want
	}{
		{"not yaml", "version: [1\n", []want{{CodeSyntax, ""}}},
		{"two documents", "version: 1\n---\nversion: 1\n", []want{{CodeSyntax, ""}}},
		{"top level list", "- 1\n", []want{{CodeWrongType, ""}}},
		{"unknown top key", "versoin: 1\n", []want{{CodeUnknownKey, "versoin"}}},
		{"unknown nested key", "process: {limits: {cpu: 1}}\n", []want{{CodeUnknownKey, "process.limits.cpu"}}},
		{"duplicate key", "version: 1\nversion: 1\n", []want{{CodeDuplicate, "version"}}},
		{"duplicate nested key", "filesystem:\n  read_only: [/usr]\n  read_only: [/bin]\n", []want{{CodeDuplicate, "filesystem.read_only"}}},
		{"version 2", "version: 2\n", []want{{CodeBadValue, "version"}}},
		{"version string", "version: \"1\"\n", []want{{CodeWrongType, "version"}}},
		{"unknown backend", "backend: docker\n", []want{{CodeBadValue, "backend"}}},
		{"backend number", "backend: 1\n", []want{{CodeWrongType, "backend"}}},
		{"null section", "process:\n", []want{{CodeNull, "process"}}},
		{"anchor", "version: &a 1\n", []want{{CodeAlias, "version"}}},
		{"alias value", "process:\n  uid: &u 1001\n  gid: *u\n", []want{{CodeAlias, "process.uid"}, {CodeAlias, "process.gid"}}},
		{"merge key", "landlock: &l {abi_floor: 6}\nfilesystem: {<<: *l}\n", []want{{CodeAlias, "landlock"}}},
		{"abi floor 0", "landlock: {abi_floor: 0}\n", []want{{CodeBadValue, "landlock.abi_floor"}}},
		{"abi floor huge", "landlock: {abi_floor: 65}\n", []want{{CodeBadValue, "landlock.abi_floor"}}},
		{"uid 0", "process: {uid: 0}\n", []want{{CodeRootID, "process.uid"}}},
		{"gid 0", "process: {gid: 0}\n", []want{{CodeRootID, "process.gid"}}},
		{"host_uid 0", "process: {host_uid: 0}\n", []want{{CodeRootID, "process.host_uid"}}},
		{"host_gid 0", "process: {host_gid: 0}\n", []want{{CodeRootID, "process.host_gid"}}},
		{"uid negative", "process: {uid: -5}\n", []want{{CodeBadValue, "process.uid"}}},
		{"uid string", "process: {uid: \"1000\"}\n", []want{{CodeWrongType, "process.uid"}}},
		{"uid float", "process: {uid: 1000.5}\n", []want{{CodeWrongType, "process.uid"}}},
		{"uid huge", "process: {uid: 99999999999999999999999}\n", []want{{CodeWrongType, "process.uid"}}},
		{"negative pids", "process: {limits: {pids: -1}}\n", []want{{CodeNegative, "process.limits.pids"}}},
		{"negative open_files", "process: {limits: {open_files: -1}}\n", []want{{CodeNegative, "process.limits.open_files"}}},
		{"negative max_requests", "inference: {max_requests: -1}\n", []want{{CodeNegative, "inference.max_requests"}}},
		{"negative max_output_tokens", "inference: {max_output_tokens: -100}\n", []want{{CodeNegative, "inference.max_output_tokens"}}},
		{"negative max_refusals", "inference: {max_refusals: -1}\n", []want{{CodeNegative, "inference.max_refusals"}}},
		{"max_refusals huge", "inference: {max_refusals: 1048577}\n", []want{{CodeBadValue, "inference.max_refusals"}}},
		{"max_refusals string", "inference: {max_refusals: \"64\"}\n", []want{{CodeWrongType, "inference.max_refusals"}}},
		{"max_refusals null", "inference: {max_refusals: }\n", []want{{CodeNull, "inference.max_refusals"}}},
		{"audit max_bytes too small", "audit: {max_bytes: 1Ki}\n", []want{{CodeBadValue, "audit.max_bytes"}}},
		{"audit max_bytes negative", "audit: {max_bytes: -1}\n", []want{{CodeNegative, "audit.max_bytes"}}},
		{"audit max_bytes bad size", "audit: {max_bytes: 64MB}\n", []want{{CodeBadSize, "audit.max_bytes"}}},
		{"audit max_bytes list", "audit: {max_bytes: [1]}\n", []want{{CodeWrongType, "audit.max_bytes"}}},
		{"audit unknown key", "audit: {max_byte: 1Mi}\n", []want{{CodeUnknownKey, "audit.max_byte"}}},
		{"zero pids", "process: {limits: {pids: 0}}\n", []want{{CodeBadValue, "process.limits.pids"}}},
		{"negative memory", "process: {limits: {memory: -1}}\n", []want{{CodeNegative, "process.limits.memory"}}},
		{"negative memory suffix", "process: {limits: {memory: -64Mi}}\n", []want{{CodeNegative, "process.limits.memory"}}},
		{"decimal size suffix", "process: {limits: {memory: 64M}}\n", []want{{CodeBadSize, "process.limits.memory"}}},
		{"fraction size", "filesystem: {tmp_size: 1.5Gi}\n", []want{{CodeBadSize, "filesystem.tmp_size"}}},
		{"size overflow", "filesystem: {tmp_size: 99999999999999Ti}\n", []want{{CodeBadSize, "filesystem.tmp_size"}}},
		{"size too small", "filesystem: {tmp_size: 1Ki}\n", []want{{CodeBadValue, "filesystem.tmp_size"}}},
		{"size zero", "filesystem: {tmp_size: 0}\n", []want{{CodeBadValue, "filesystem.tmp_size"}}},
		{"size bool", "filesystem: {tmp_size: true}\n", []want{{CodeBadSize, "filesystem.tmp_size"}}},
		{"bool as string", "inference: {require_attribution: \"yes\"}\n", []want{{CodeWrongType, "inference.require_attribution"}}},
		{"grants not a list", "filesystem: {read_only: /usr}\n", []want{{CodeWrongType, "filesystem.read_only"}}},
		{"relative escapes", "filesystem: {read_write: [./workspace, ../x]}\n", []want{{CodeEscapes, "filesystem.read_write[1]"}}},
		{"relative escapes through symlink", "filesystem: {read_write: [link]}\n", []want{{CodeEscapes, "filesystem.read_write[0]"}}},
		{"tilde", "filesystem: {read_only: [~/x]}\n", []want{{CodeBadPath, "filesystem.read_only[0]"}}},
		{"empty path", "filesystem: {read_only: [\"\"]}\n", []want{{CodeBadPath, "filesystem.read_only[0]"}}},
		{"grant missing", "filesystem: {read_only: [./nope]}\n", []want{{CodeNotFound, "filesystem.read_only[0]"}}},
		{"grant root", "filesystem: {read_only: [/]}\n", []want{{CodeForbidden, "filesystem.read_only[0]"}}},
		{"grant proc", "filesystem: {read_only: [/proc/self]}\n", []want{{CodeForbidden, "filesystem.read_only[0]"}}},
		{"grant dev", "filesystem: {read_write: [/dev/shm]}\n", []want{{CodeForbidden, "filesystem.read_write[0]"}}},
		{"grant twice", "filesystem: {read_only: [./data], read_write: [data]}\n", []want{{CodeDuplicate, "filesystem.read_write[0]"}}},
		{"audit inside grant", "filesystem: {read_write: [workspace]}\naudit: {dir: workspace/runs}\n", []want{{CodeAuditInside, "audit.dir"}}},
		{"audit equals grant", "filesystem: {read_write: [workspace]}\naudit: {dir: ./workspace}\n", []want{{CodeAuditInside, "audit.dir"}}},
		{"audit contains grant", "filesystem: {read_only: [data]}\naudit: {dir: .}\n", []want{{CodeAuditInside, "audit.dir"}}},
		{"audit inside read-only grant", "filesystem: {read_only: [data]}\naudit: {dir: data/x/y}\n", []want{{CodeAuditInside, "audit.dir"}}},
		{"workdir in the private tmpfs", "process: {workdir: /tmp/sub}\n", []want{{CodeBadPath, "process.workdir"}}},
		{"workdir outside grants", "filesystem: {read_write: [workspace]}\nprocess: {workdir: /usr}\n", []want{{CodeBadPath, "process.workdir"}}},
		{"env bad name", "process: {env: {\"A=B\": x}}\n", []want{{CodeBadValue, "process.env.A=B"}}},
		{"env number value", "process: {env: {N: 1}}\n", []want{{CodeWrongType, "process.env.N"}}},
		{"env duplicate", "process: {env: {A: x, A: y}}\n", []want{{CodeDuplicate, "process.env.A"}}},
		{"unknown api", prov(`name: a, api: gemini, base_url: "https://x.example", credential_env: K, models: [m]`), []want{{CodeBadValue, "inference.providers[0].api"}}},
		{"http to a remote host", prov(`name: a, api: openai-chat, base_url: "http://example.com", credential_env: K, models: [m]`), []want{{CodeURL, "inference.providers[0].base_url"}}},
		{"http to 10/8", prov(`name: a, api: openai-chat, base_url: "http://10.0.0.1", credential_env: K, models: [m]`), []want{{CodeURL, "inference.providers[0].base_url"}}},
		{"http to a loopback-looking name", prov(`name: a, api: openai-chat, base_url: "http://127.0.0.1.example.com", credential_env: K, models: [m]`), []want{{CodeURL, "inference.providers[0].base_url"}}},
		{"ftp url", prov(`name: a, api: openai-chat, base_url: "ftp://x.example", credential_env: K, models: [m]`), []want{{CodeURL, "inference.providers[0].base_url"}}},
		{"url with userinfo", prov(`name: a, api: openai-chat, base_url: "https://u:p@x.example", credential_env: K, models: [m]`), []want{{CodeURL, "inference.providers[0].base_url"}}},
		{"url with query", prov(`name: a, api: openai-chat, base_url: "https://x.example/?k=1", credential_env: K, models: [m]`), []want{{CodeURL, "inference.providers[0].base_url"}}},
		{"no models", prov(`name: a, api: openai-chat, base_url: "https://x.example", credential_env: K, models: []`), []want{{CodeMissing, "inference.providers[0].models"}}},
		{"models missing", prov(`name: a, api: openai-chat, base_url: "https://x.example", credential_env: K`), []want{{CodeMissing, "inference.providers[0].models"}}},
		{"duplicate model", prov(`name: a, api: openai-chat, base_url: "https://x.example", credential_env: K, models: [m, m]`), []want{{CodeDuplicate, "inference.providers[0].models[1]"}}},
		{"credential_env missing", prov(`name: a, api: openai-chat, base_url: "https://x.example", models: [m]`), []want{{CodeMissing, "inference.providers[0].credential_env"}}},
		{"credential_env invalid", prov(`name: a, api: openai-chat, base_url: "https://x.example", credential_env: "MY-KEY", models: [m]`), []want{{CodeBadValue, "inference.providers[0].credential_env"}}},
		{"credential_env empty", prov(`name: a, api: openai-chat, base_url: "https://x.example", credential_env: "", models: [m]`), []want{{CodeBadValue, "inference.providers[0].credential_env"}}},
		{"duplicate provider names", "inference:\n  providers:\n    - {" + okProv + "}\n    - {" + okProv + "}\n", []want{{CodeDuplicate, "inference.providers[1].name"}}},
		{"provider unknown key", prov(okProv + ", api_key: sk-x"), []want{{CodeUnknownKey, "inference.providers[0].api_key"}}},
		{"model served twice for one api", "inference:\n  providers:\n    - {" + okProv + "}\n    - {name: b, api: openai-chat, base_url: \"https://y.example\", credential_env: K, models: [n, m]}\n", []want{{CodeDuplicate, "inference.providers[1].models[1]"}}},
		{"workdir is a file", "filesystem: {read_write: [workspace/f]}\n", []want{{CodeBadPath, "process.workdir"}}},
		{"workdir missing inside a grant", "filesystem: {read_write: [workspace]}\nprocess: {workdir: workspace/none}\n", []want{{CodeNotFound, "process.workdir"}}},
		{"ca_file missing", prov(okProv + ", ca_file: ./ca.pem"), []want{{CodeNotFound, "inference.providers[0].ca_file"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, perr := f.parse(t, tt.yaml)
			if perr == nil {
				t.Fatalf("Parse accepted:\n%s", tt.yaml)
			}
			for _, w := range tt.want {
				if !perr.Has(w.code, w.path) {
					t.Errorf("got %v\nwant a %s problem at %q", perr, w.code, w.path)
				}
			}
			for _, p := range perr.Problems {
				if p.Message == "" || p.Code == "" {
					t.Errorf("problem without code or message: %+v", p)
				}
			}
		})
	}
}

// TestAllProblemsReported checks that one load reports every problem, each
// with its key path and line.
func TestAllProblemsReported(t *testing.T) {
	f := newFixture(t)
	y := `version: 1
backend: native
filesystem:
  read_write: [./workspace, ../x, ./nope]
process:
  uid: 0
  limits: {pids: -3}
bogus: true
`
	_, perr := f.parse(t, y)
	if perr == nil {
		t.Fatal("Parse accepted a bad policy")
	}
	want := []Problem{
		{Code: CodeEscapes, Path: "filesystem.read_write[1]", Line: 4},
		{Code: CodeNotFound, Path: "filesystem.read_write[2]", Line: 4},
		{Code: CodeRootID, Path: "process.uid", Line: 6},
		{Code: CodeNegative, Path: "process.limits.pids", Line: 7},
		{Code: CodeUnknownKey, Path: "bogus", Line: 8},
	}
	if len(perr.Problems) != len(want) {
		t.Fatalf("got %d problems, want %d:\n%v", len(perr.Problems), len(want), perr)
	}
	for i, w := range want {
		got := perr.Problems[i]
		if got.Code != w.Code || got.Path != w.Path || got.Line != w.Line {
			t.Errorf("problem %d: got %s %s line %d, want %s %s line %d", i, got.Code, got.Path, got.Line, w.Code, w.Path, w.Line)
		}
	}
	msg := perr.Error()
	for _, s := range []string{`line 4: filesystem.read_write[1]: path "../x" escapes the policy's directory ` + f.dir, "line 6: process.uid: uid 0 is root", "5 problems:"} {
		if !strings.Contains(msg, s) {
			t.Errorf("message %q does not contain %q", msg, s)
		}
	}
}

func TestLoadNamesFile(t *testing.T) {
	f := newFixture(t)
	p := filepath.Join(f.dir, "p.yaml")
	if err := os.WriteFile(p, []byte("version: 1\nprocess:\n  uid: 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Load(p)
	if err == nil {
		t.Fatal("Load accepted uid 0")
	}
	if want := p + ":3: process.uid: uid 0 is root"; !strings.HasPrefix(err.Error(), want) {
		t.Errorf("got %q, want prefix %q", err, want)
	}
	if err := os.WriteFile(p, []byte("version: 1\nfilesystem: {read_write: [workspace]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	pol, err := Load(p)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if pol.Source != p || pol.Filesystem.ReadWrite[0] != f.ws {
		t.Errorf("got source %q read_write %v, want %q [%s]", pol.Source, pol.Filesystem.ReadWrite, p, f.ws)
	}
	if _, err := Load(filepath.Join(f.dir, "missing.yaml")); err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load of a missing file: got %v, want ErrNotExist", err)
	}
}

func TestRelativeWithoutBaseDir(t *testing.T) {
	_, err := Parse([]byte("filesystem: {read_only: [usr]}\n"), "")
	var pe *Error
	if !errors.As(err, &pe) || !pe.Has(CodeBadPath, "filesystem.read_only[0]") {
		t.Errorf("got %v, want a bad_path problem", err)
	}
	if _, err := Parse([]byte("version: 1\nfilesystem: {read_only: [/usr]}\n"), ""); err != nil {
		t.Errorf("absolute path without base dir: %v", err)
	}
}

// TestSocketInGrant: a Unix socket inside a grant does not make the policy
// refuse (a crash or a hostile workload can leave one there; the seccomp
// filter keeps the workload from connecting to it), but a grant that is
// itself a socket is refused, as neither a directory nor a regular file.
func TestSocketInGrant(t *testing.T) {
	f := newFixture(t)
	sock := filepath.Join(f.ws, "deep", "er", "s.sock")
	if err := os.MkdirAll(filepath.Dir(sock), 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	pol, perr := f.parse(t, v1("filesystem: {read_write: [workspace], read_only: [data]}\n"))
	if perr != nil {
		t.Fatalf("a socket inside a grant: got %v, want the policy to load", perr)
	}
	if _, err := pol.ResolveGrants(); err != nil {
		t.Fatalf("ResolveGrants with a socket inside a grant: %v", err)
	}
	_, perr = f.parse(t, v1("filesystem: {read_only: [workspace/deep/er/s.sock]}\n"))
	if perr == nil || !perr.Has(CodeBadType, "filesystem.read_only[0]") {
		t.Errorf("grant of a socket: got %v, want bad_type", perr)
	}
}

func TestAuditThroughSymlink(t *testing.T) {
	f := newFixture(t)
	// audit.dir is a symlink (outside the grant, as written) that points
	// into the workspace.
	if err := os.Symlink(f.ws, filepath.Join(f.dir, "alias")); err != nil {
		t.Fatal(err)
	}
	_, perr := f.parse(t, v1("filesystem: {read_write: [workspace]}\naudit: {dir: /"+filepath.Join(f.dir, "alias", "runs")[1:]+"}\n"))
	if perr == nil || !perr.Has(CodeAuditInside, "audit.dir") {
		t.Errorf("got %v, want audit_inside", perr)
	}
	if _, perr := f.parse(t, v1("filesystem: {read_write: [workspace]}\naudit: {dir: runs}\n")); perr != nil {
		t.Errorf("control: audit beside the workspace: %v", perr)
	}
}

func TestDefault(t *testing.T) {
	p := Default()
	if p.Process.UID == 0 || p.Process.Workdir != "/tmp" || len(p.Filesystem.ReadWrite) != 0 || len(p.Inference.Providers) != 0 {
		t.Errorf("Default grants more than documented: %+v", p)
	}
	for _, g := range p.Filesystem.ReadOnly {
		if _, err := os.Stat(g); err != nil {
			t.Errorf("Default grants %s, which does not exist: %v", g, err)
		}
	}
	if _, err := p.ResolveGrants(); err != nil {
		t.Errorf("Default's grants: %v", err)
	}
	// Its YAML is a valid policy that means the same.
	y, err := p.YAML()
	if err != nil {
		t.Fatal(err)
	}
	q, err := Parse(y, "")
	if err != nil {
		t.Fatalf("Parse(Default().YAML()): %v\n%s", err, y)
	}
	if !reflect.DeepEqual(p, q) || p.SHA256() != q.SHA256() {
		t.Errorf("round trip changed the policy:\n got %+v\nwant %+v", q, p)
	}
}

func TestRoundTripAndSHA256(t *testing.T) {
	f := newFixture(t)
	y := `version: 1
filesystem: {read_only: [data], read_write: [workspace], tmp_size: 1048577}
process: {uid: 5, host_uid: 7, env: {A: "1"}, limits: {memory: 100Mi}}
inference:
  providers:
    - {name: a, api: openai-chat, base_url: "https://x.example", credential_env: K, models: [m]}
`
	p, perr := f.parse(t, y)
	if perr != nil {
		t.Fatal(perr)
	}
	out, err := p.YAML()
	if err != nil {
		t.Fatal(err)
	}
	q, err := Parse(out, "")
	if err != nil {
		t.Fatalf("reparse: %v\n%s", err, out)
	}
	if !reflect.DeepEqual(p, q) {
		t.Errorf("round trip:\n got %+v\nwant %+v", q, p)
	}
	h := p.SHA256()
	if len(h) != 64 || h != q.SHA256() {
		t.Errorf("SHA256 got %q and %q, want equal 64-hex digests", h, q.SHA256())
	}
	q.Inference.MaxRequests++
	if q.SHA256() == h {
		t.Errorf("SHA256 did not change when max_requests changed")
	}
	c, err := p.CanonicalJSON()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(c), `{"audit":{"dir":`) || strings.Contains(string(c), " ") && !strings.Contains(string(c), `"`) {
		t.Errorf("canonical JSON not sorted: %s", c)
	}
	j, err := p.JSON()
	if err != nil || !strings.Contains(string(j), `"tmp_size": 1048577`) {
		t.Errorf("JSON: %v\n%s", err, j)
	}
}

func TestResolveHostIDs(t *testing.T) {
	f := newFixture(t)
	p, perr := f.parse(t, v1("filesystem: {read_write: [workspace]}\n"))
	if perr != nil {
		t.Fatal(perr)
	}
	// Unprivileged: the caller, whatever the policy says.
	p.Process.HostUID = 7
	if uid, gid, err := p.ResolveHostIDs(4321); err != nil || uid != 4321 || gid != os.Getegid() {
		t.Errorf("euid 4321: got %d %d %v, want 4321 %d", uid, gid, err, os.Getegid())
	}
	// As root with host ids set: those.
	p.Process.HostUID, p.Process.HostGID = 7, 8
	if uid, gid, err := p.ResolveHostIDs(0); err != nil || uid != 7 || gid != 8 {
		t.Errorf("root, host ids 7/8: got %d %d %v, want 7 8", uid, gid, err)
	}
	// As root, decided from the workspace owner, or nobody when it is root's.
	p.Process.HostUID, p.Process.HostGID = 0, 0
	ou, og, err := owner(f.ws)
	if err != nil {
		t.Fatal(err)
	}
	wantU, wantG := ou, og
	if ou == 0 {
		wantU = NobodyID
	}
	if og == 0 {
		wantG = NobodyID
	}
	if uid, gid, err := p.ResolveHostIDs(0); err != nil || uid != wantU || gid != wantG {
		t.Errorf("root, workspace %d:%d: got %d %d %v, want %d %d", ou, og, uid, gid, err, wantU, wantG)
	}
	// No workspace: nobody.
	p.Filesystem.ReadWrite = nil
	if uid, gid, err := p.ResolveHostIDs(0); err != nil || uid != NobodyID || gid != NobodyID {
		t.Errorf("root, no workspace: got %d %d %v, want %d %d", uid, gid, err, NobodyID, NobodyID)
	}
}

// TestRootResolveHostIDsWorkspaceOwner needs root to chown the workspace.
func TestRootResolveHostIDsWorkspaceOwner(t *testing.T) {
	testenv.NeedRoot(t)
	f := newFixture(t)
	if err := os.Chown(f.ws, 4242, 4343); err != nil {
		t.Fatal(err)
	}
	p, perr := f.parse(t, v1("filesystem: {read_write: [workspace]}\n"))
	if perr != nil {
		t.Fatal(perr)
	}
	if uid, gid, err := p.ResolveHostIDs(0); err != nil || uid != 4242 || gid != 4343 {
		t.Errorf("got %d %d %v, want 4242 4343", uid, gid, err)
	}
	if err := os.Chown(f.ws, 0, 0); err != nil {
		t.Fatal(err)
	}
	if uid, gid, err := p.ResolveHostIDs(0); err != nil || uid != NobodyID || gid != NobodyID {
		t.Errorf("root-owned workspace: got %d %d %v, want %d %d", uid, gid, err, NobodyID, NobodyID)
	}
}

func TestSize(t *testing.T) {
	tests := []struct {
		in   string
		want Size
		ok   bool
		str  string
	}{
		{"0", 0, true, "0"},
		{"1000", 1000, true, "1000"},
		{"1024", 1024, true, "1Ki"},
		{"64Mi", 64 << 20, true, "64Mi"},
		{"512Mi", 512 << 20, true, "512Mi"},
		{"1Gi", 1 << 30, true, "1Gi"},
		{"2048Mi", 2 << 30, true, "2Gi"},
		{"1Ti", 1 << 40, true, "1Ti"},
		{"1025Gi", 0, false, ""},
		{"64M", 0, false, ""},
		{"64MB", 0, false, ""},
		{"64mi", 0, false, ""},
		{"-1", 0, false, ""},
		{"+1", 0, false, ""},
		{" 1", 0, false, ""},
		{"1.5Gi", 0, false, ""},
		{"Mi", 0, false, ""},
		{"", 0, false, ""},
		{"0x10", 0, false, ""},
		{"18446744073709551616", 0, false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseSize(tt.in)
			if (err == nil) != tt.ok || got != tt.want {
				t.Fatalf("ParseSize(%q) got %d, %v; want %d, ok=%v", tt.in, got, err, tt.want, tt.ok)
			}
			if tt.ok && got.String() != tt.str {
				t.Errorf("String got %q, want %q", got.String(), tt.str)
			}
		})
	}
}

// TestHostIDsPrinted: the effective policy says which host ids the
// workload gets as root and how they were derived (YAML comments, a
// "derived" member in JSON) without changing the policy: YAML reads back
// to the same policy, and the hash does not cover the derived values.
// Control: host ids set in the policy are printed as keys, "set in the
// policy".
func TestHostIDsPrinted(t *testing.T) {
	f := newFixture(t)
	ou, og, err := owner(f.ws)
	if err != nil {
		t.Fatal(err)
	}
	wantU, wantG, fromU := ou, og, "the owner of the workspace "+f.ws
	if ou == 0 {
		wantU, fromU = NobodyID, "the workspace "+f.ws+" is root's, so nobody"
	}
	if og == 0 {
		wantG = NobodyID
	}
	p, perr := f.parse(t, v1("filesystem: {read_write: [workspace]}\n"))
	if perr != nil {
		t.Fatal(perr)
	}
	y, err := p.YAML()
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{fmt.Sprintf("  # host_uid: %d   (derived: %s)\n", wantU, fromU), fmt.Sprintf("  # host_gid: %d   (derived: ", wantG),
		"  # host_uid and host_gid apply when moat runs as root; rootless, the workload runs as the caller's own uid and gid\n  env:"} {
		if !strings.Contains(string(y), w) {
			t.Errorf("YAML lacks %q:\n%s", w, y)
		}
	}
	if q, err := Parse(y, ""); err != nil || !reflect.DeepEqual(p, q) {
		t.Errorf("YAML with the derived comments does not read back to the same policy: %v", err)
	}
	j, err := p.JSON()
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Process struct {
			HostUID int `json:"host_uid"`
		} `json:"process"`
		Derived Derived `json:"derived"`
	}
	if err := json.Unmarshal(j, &got); err != nil {
		t.Fatal(err)
	}
	if h := got.Derived.Process.HostIDs; h.UID != wantU || h.GID != wantG || h.UIDFrom != fromU || h.Err != "" {
		t.Errorf("JSON derived host ids %+v, want %d/%d from %q\n%s", h, wantU, wantG, fromU, j)
	}
	if got.Process.HostUID != 0 {
		t.Errorf("JSON process.host_uid %d, want 0 (not set: decided at run time)", got.Process.HostUID)
	}
	c, err := p.CanonicalJSON()
	if err != nil || strings.Contains(string(c), "derived") {
		t.Errorf("canonical JSON carries the derived values: %v %s", err, c)
	}

	// Control: set in the policy, printed as keys and said so.
	p, perr = f.parse(t, v1("filesystem: {read_write: [workspace]}\nprocess: {host_uid: 7, host_gid: 8}\n"))
	if perr != nil {
		t.Fatal(perr)
	}
	y, _ = p.YAML()
	if !strings.Contains(string(y), "  host_uid: 7\n  host_gid: 8\n  # host_uid and host_gid apply when moat runs as root") || strings.Contains(string(y), "# host_uid: ") {
		t.Errorf("YAML with host ids set:\n%s", y)
	}
	if h := p.HostIDsAsRoot(); h.UID != 7 || h.GID != 8 || h.UIDFrom != "set in the policy" || h.GIDFrom != "set in the policy" {
		t.Errorf("HostIDsAsRoot with host ids set: %+v", h)
	}
	// No workspace: nobody, said why.
	p, perr = f.parse(t, v1("filesystem: {read_only: [data]}\n"))
	if perr != nil {
		t.Fatal(perr)
	}
	if h := p.HostIDsAsRoot(); h.UID != NobodyID || h.UIDFrom != "no read_write grant, so nobody" {
		t.Errorf("HostIDsAsRoot without a workspace: %+v", h)
	}
}
