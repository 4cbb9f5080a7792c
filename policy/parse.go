package policy

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/moat-sandbox/moat/internal/fsutil"
)

// MaxFileBytes caps the size of a policy file.
const MaxFileBytes = 1 << 20

// Load reads, decodes and validates the policy file at path. Relative paths
// in it resolve against the file's directory. On any problem it returns an
// *Error listing all of them.
func Load(path string) (*Policy, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	f, err := os.Open(abs)
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("policy: read %s: %w", abs, err)
	}
	p, err := Parse(data, filepath.Dir(abs))
	var pe *Error
	if errors.As(err, &pe) {
		pe.File = abs
	}
	if err != nil {
		return nil, err
	}
	p.Source = abs
	return p, nil
}

// Parse decodes and validates a policy. Relative paths resolve against
// baseDir, which must be absolute; with baseDir "" every relative path is an
// error. The audit directory defaults to .moat/runs under the current
// directory. Parse checks the file system (grants exist and hold no Unix
// socket). On any problem it returns an *Error listing all of them.
func Parse(data []byte, baseDir string) (*Policy, error) {
	d := &decoder{baseDir: baseDir}
	if baseDir != "" && !filepath.IsAbs(baseDir) {
		return nil, fmt.Errorf("policy: BUG: base directory %q is not absolute", baseDir)
	}
	p := d.decode(data)
	d.validate(p) // also after decode problems, so that one load reports everything
	d.validateTools(p)
	if len(d.probs) > 0 {
		slices.SortStableFunc(d.probs, func(a, b Problem) int { return cmp.Compare(a.Line, b.Line) })
		return nil, &Error{Problems: d.probs}
	}
	return p, nil
}

// The keys of each mapping, in the order the documentation lists them.
// TestSchemaMatchesDecoder keeps them, the struct tags and schema.json in
// step.
var (
	topKeys        = []string{"version", "backend", "landlock", "filesystem", "process", "inference", "audit", "tools", "egress", "approvals", "kubernetes"}
	landlockKeys   = []string{"abi_floor"}
	filesystemKeys = []string{"read_only", "read_write", "tmp_size", "volumes"}
	volumeKeys     = []string{"image", "path", "size"}
	processKeys    = []string{"uid", "gid", "host_uid", "host_gid", "env", "workdir", "limits", "supervisor_timeout"}
	limitsKeys     = []string{"memory", "pids", "open_files", "required"}
	inferenceKeys  = []string{"max_requests", "require_attribution", "max_output_tokens", "max_refusals", "providers"}
	providerKeys   = []string{"name", "api", "base_url", "credential_env", "models", "ca_file"}
	auditKeys      = []string{"dir", "max_bytes"}
)

// decoder walks the YAML node tree against the schema, filling a Policy
// that starts from the defaults and collecting problems.
type decoder struct {
	baseDir string
	probs   []Problem
	// set records which optional keys were present, by key path.
	set map[string]bool
	// nodes records where values were written, by key path, so that
	// validate can point at them.
	nodes map[string]*yaml.Node
	// grants are the decoded grants with the key paths they were written at.
	grants []grant
}

func (d *decoder) add(n *yaml.Node, code, path, format string, a ...any) {
	if len(d.probs) >= MaxProblems {
		return
	}
	p := Problem{Code: code, Path: path, Message: fmt.Sprintf(format, a...)}
	if n != nil {
		p.Line, p.Column = n.Line, n.Column
	}
	if len(d.probs) == MaxProblems-1 {
		p = Problem{Code: CodeTooLarge, Message: fmt.Sprintf("more than %d problems; fix these first", MaxProblems-1)}
	}
	d.probs = append(d.probs, p)
}

func (d *decoder) decode(data []byte) *Policy {
	p := defaults()
	d.set = map[string]bool{}
	if len(data) > MaxFileBytes {
		d.add(nil, CodeTooLarge, "", "policy is larger than %d bytes", MaxFileBytes)
		return p
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			d.empty()
			return p
		}
		d.add(nil, CodeSyntax, "", "not valid YAML: %s", yamlMsg(err))
		return p
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		d.add(&extra, CodeSyntax, "", "more than one YAML document; a policy is one document")
		return p
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 {
		d.empty()
		return p
	}
	root := doc.Content[0]
	if root.Kind == yaml.ScalarNode && root.ShortTag() == "!!null" {
		d.empty() // a document holding only comments
		return p
	}
	fields := d.mapping(root, "", topKeys...)
	if n := fields["version"]; n != nil {
		if v, ok := d.int(n, "version"); ok && v != DefaultVersion {
			d.add(n, CodeBadValue, "version", "version %d is not supported; this moat reads version %d: write \"version: %d\" and the keys that version documents (moat policy schema)", v, DefaultVersion, DefaultVersion)
		}
	} else if root.Kind == yaml.MappingNode {
		d.add(root, CodeMissing, "version", "missing; write \"version: %d\" as the first line: it names the policy format this file is written for, and moat refuses a policy that does not say", DefaultVersion)
	}
	if n := fields["backend"]; n != nil {
		if s, ok := d.str(n, "backend"); ok {
			if !isBackend(s) {
				d.add(n, CodeBadValue, "backend", "unknown backend %q (known: %s)", s, strings.Join(Backends, ", "))
			}
			p.Backend = s
		}
	}
	if n := fields["landlock"]; n != nil {
		f := d.mapping(n, "landlock", landlockKeys...)
		if n := f["abi_floor"]; n != nil {
			if v, ok := d.int(n, "landlock.abi_floor"); ok {
				if v < MinABIFloor || v > MaxABIFloor {
					d.add(n, CodeBadValue, "landlock.abi_floor", "abi_floor %d is out of range [%d, %d]", v, MinABIFloor, MaxABIFloor)
				}
				p.Landlock.ABIFloor = v
			}
		}
	}
	if n := fields["filesystem"]; n != nil {
		d.filesystem(n, &p.Filesystem)
	}
	if n := fields["process"]; n != nil {
		d.process(n, &p.Process)
	}
	if n := fields["inference"]; n != nil {
		d.inference(n, &p.Inference)
	}
	if n := fields["tools"]; n != nil {
		d.tools(n, &p.Tools)
	}
	if n := fields["egress"]; n != nil {
		d.egress(n, &p.Egress)
	}
	if n := fields["approvals"]; n != nil {
		d.approvals(n, &p.Approvals)
	}
	if n := fields["kubernetes"]; n != nil {
		d.kubernetes(n, &p.Kubernetes)
	}
	if n := fields["audit"]; n != nil {
		f := d.mapping(n, "audit", auditKeys...)
		if n := f["dir"]; n != nil {
			if s, ok := d.path(n, "audit.dir"); ok {
				p.Audit.Dir = s
			}
		}
		if n := f["max_bytes"]; n != nil {
			if v, ok := d.size(n, "audit.max_bytes", MinAuditMaxBytes); ok {
				p.Audit.MaxBytes = v
			}
		}
	}
	return p
}

// empty refuses a policy with no keys (line 1, the document). Such a
// file is far more likely a mistake (a wrong path, a truncated write) than
// a wish for the defaults, and the built-in default (no --policy) grants
// the system directories, which an empty file would not: neither meaning
// is guessed.
func (d *decoder) empty() {
	d.add(&yaml.Node{Line: 1, Column: 1}, CodeMissing, "", "the policy is empty (no keys, at most comments); write at least \"version: %d\" and the grants the workload needs (e.g. examples/minimal.yaml), or run moat without --policy for the built-in default", DefaultVersion)
}

// yamlMsg trims the library's prefix from a YAML error.
func yamlMsg(err error) string { return strings.TrimPrefix(err.Error(), "yaml: ") }

func (d *decoder) filesystem(n *yaml.Node, fs *Filesystem) {
	f := d.mapping(n, "filesystem", filesystemKeys...)
	if n := f["read_only"]; n != nil {
		fs.ReadOnly = d.paths(n, "filesystem.read_only")
	}
	if n := f["read_write"]; n != nil {
		fs.ReadWrite = d.paths(n, "filesystem.read_write")
	}
	if n := f["tmp_size"]; n != nil {
		if v, ok := d.size(n, "filesystem.tmp_size", MinTmpSize); ok {
			fs.TmpSize = v
		}
	}
	if n := f["volumes"]; n != nil {
		fs.Volumes = d.volumes(n, "filesystem.volumes")
	}
}

func (d *decoder) volumes(n *yaml.Node, path string) []Volume {
	var out []Volume
	for i, item := range d.seq(n, path, MaxVolumes) {
		ip := fmt.Sprintf("%s[%d]", path, i)
		f := d.mapping(item, ip, volumeKeys...)
		ok := true
		for _, k := range volumeKeys {
			if f[k] == nil {
				d.add(item, CodeMissing, ip+"."+k, "a volume needs %s (image: the host file, path: where it is mounted inside, size: its capacity)", k)
				ok = false
			}
		}
		if !ok {
			continue
		}
		img, ok1 := d.path(f["image"], ip+".image")
		in, ok2 := d.str(f["path"], ip+".path")
		size, ok3 := d.size(f["size"], ip+".size", MinVolumeSize)
		if !ok1 || !ok2 || !ok3 {
			continue
		}
		if !filepath.IsAbs(in) || filepath.Clean(in) != in || in == "/" {
			d.add(f["path"], CodeBadPath, ip+".path", "volume path %q must be a clean absolute path inside the sandbox, other than /", in)
			continue
		}
		for _, r := range []string{"/proc", "/sys", "/dev"} {
			if fsutil.Within(in, r) {
				d.add(f["path"], CodeForbidden, ip+".path", "volume path %s is inside %s, which the sandbox provides itself; choose another path", in, r)
				ok = false
			}
		}
		if ok {
			d.pos(ip+".path", f["path"])
			out = append(out, Volume{Image: img, Path: in, Size: size})
		}
	}
	return out
}

func (d *decoder) process(n *yaml.Node, pr *Process) {
	f := d.mapping(n, "process", processKeys...)
	for _, k := range []struct {
		key string
		dst *int
	}{{"uid", &pr.UID}, {"gid", &pr.GID}, {"host_uid", &pr.HostUID}, {"host_gid", &pr.HostGID}} {
		n := f[k.key]
		if n == nil {
			continue
		}
		path := "process." + k.key
		v, ok := d.int(n, path)
		if !ok {
			continue
		}
		switch {
		case v == 0 && strings.HasPrefix(k.key, "host_"):
			d.add(n, CodeRootID, path, "%s 0 is root on the host; remove the key to let moat decide (the workspace owner if not root, else %d)", k.key, NobodyID)
		case v == 0:
			d.add(n, CodeRootID, path, "%s 0 is root inside the sandbox; use a non-zero id (default %d)", k.key, DefaultID)
		case v < 0 || v > MaxID:
			d.add(n, CodeBadValue, path, "%s %d is out of range [1, %d]", k.key, v, MaxID)
		default:
			*k.dst = v
		}
	}
	if n := f["env"]; n != nil {
		pr.Env = d.env(n, "process.env")
	}
	if n := f["workdir"]; n != nil {
		if s, ok := d.path(n, "process.workdir"); ok {
			pr.Workdir = s
			d.set["process.workdir"] = true
		}
	}
	if n := f["supervisor_timeout"]; n != nil {
		if s, ok := d.str(n, "process.supervisor_timeout"); ok {
			v, err := time.ParseDuration(s)
			switch x := Duration(v); {
			case err != nil:
				d.add(n, CodeBadValue, "process.supervisor_timeout", "%q is not a duration: write one such as 10s or 1m", s)
			case x < MinSupervisorTimeout || x > MaxSupervisorTimeout:
				d.add(n, CodeBadValue, "process.supervisor_timeout", "%s is out of range [%s, %s]", x, MinSupervisorTimeout, MaxSupervisorTimeout)
			default:
				pr.SupervisorTimeout = x
			}
		}
	}
	if n := f["limits"]; n != nil {
		lf := d.mapping(n, "process.limits", limitsKeys...)
		if n := lf["memory"]; n != nil {
			if v, ok := d.size(n, "process.limits.memory", MinMemory); ok {
				pr.Limits.Memory = v
			}
		}
		if n := lf["pids"]; n != nil {
			if v, ok := d.limit(n, "process.limits.pids", MinPids, MaxPids); ok {
				pr.Limits.Pids = v
			}
		}
		if n := lf["required"]; n != nil {
			if v, ok := d.bool(n, "process.limits.required"); ok {
				pr.Limits.Required = v
			}
		}
		if n := lf["open_files"]; n != nil {
			if v, ok := d.limit(n, "process.limits.open_files", MinOpenFiles, MaxOpenFiles); ok {
				pr.Limits.OpenFiles = v
			}
		}
	}
}

func (d *decoder) inference(n *yaml.Node, inf *Inference) {
	f := d.mapping(n, "inference", inferenceKeys...)
	if n := f["max_requests"]; n != nil {
		if v, ok := d.limit(n, "inference.max_requests", 0, MaxRequestsLimit); ok {
			inf.MaxRequests = v
		}
	}
	if n := f["require_attribution"]; n != nil {
		if v, ok := d.bool(n, "inference.require_attribution"); ok {
			inf.RequireAttribution = v
		}
	}
	if n := f["max_output_tokens"]; n != nil {
		if v, ok := d.limit(n, "inference.max_output_tokens", 0, MaxOutputTokensLimit); ok {
			inf.MaxOutputTokens = v
		}
	}
	if n := f["max_refusals"]; n != nil {
		if v, ok := d.limit(n, "inference.max_refusals", 0, MaxRefusalsLimit); ok {
			inf.MaxRefusals = v
		}
	}
	if n := f["providers"]; n != nil {
		inf.Providers = d.providers(n, "inference.providers")
	}
}

func (d *decoder) providers(n *yaml.Node, path string) []Provider {
	items := d.seq(n, path, MaxProviders)
	out := []Provider{}
	names := map[string]int{}
	// served maps api + "\x00" + model to the provider index that serves it:
	// the broker routes a model to the first provider of its API that lists
	// it, so a second one listing it would never be used.
	served := map[string]int{}
	for i, item := range items {
		ip := fmt.Sprintf("%s[%d]", path, i)
		f := d.mapping(item, ip, providerKeys...)
		var pv Provider
		if n := f["name"]; n != nil {
			if s, ok := d.str(n, ip+".name"); ok {
				if !validName(s) {
					d.add(n, CodeBadValue, ip+".name", "name %q must be 1-%d characters of a-z, 0-9, '-' and '_', starting with a letter", s, maxNameLen)
				} else if j, dup := names[s]; dup {
					d.add(n, CodeDuplicate, ip+".name", "provider name %q is already used by %s[%d]", s, path, j)
				} else {
					names[s] = i
				}
				pv.Name = s
			}
		} else if item.Kind == yaml.MappingNode {
			d.add(item, CodeMissing, ip+".name", "missing; every provider needs a name")
		}
		if n := f["api"]; n != nil {
			if s, ok := d.str(n, ip+".api"); ok {
				if !isAPI(s) {
					d.add(n, CodeBadValue, ip+".api", "unknown api %q (known: %s)", s, strings.Join(APIs, ", "))
				}
				pv.API = s
			}
		} else if item.Kind == yaml.MappingNode {
			d.add(item, CodeMissing, ip+".api", "missing; one of %s", strings.Join(APIs, ", "))
		}
		if n := f["base_url"]; n != nil {
			if s, ok := d.str(n, ip+".base_url"); ok {
				if msg := checkBaseURL(s); msg != "" {
					d.add(n, CodeURL, ip+".base_url", "%s", msg)
				}
				pv.BaseURL = s
			}
		} else if item.Kind == yaml.MappingNode {
			d.add(item, CodeMissing, ip+".base_url", "missing; e.g. https://api.anthropic.com")
		}
		if n := f["credential_env"]; n != nil {
			if s, ok := d.str(n, ip+".credential_env"); ok {
				if !validEnvName(s) {
					d.add(n, CodeBadValue, ip+".credential_env", "%q is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)", s)
				}
				pv.CredentialEnv = s
			}
		} else if item.Kind == yaml.MappingNode {
			d.add(item, CodeMissing, ip+".credential_env", "missing; name the host environment variable that holds the key, e.g. ANTHROPIC_API_KEY")
		}
		if n := f["models"]; n != nil {
			pv.Models = d.models(n, ip+".models")
			for j, m := range pv.Models {
				k := pv.API + "\x00" + m
				if first, dup := served[k]; dup && pv.API != "" {
					d.add(n.Content[d.modelIndex(n, m, j)], CodeDuplicate, fmt.Sprintf("%s.models[%d]", ip, d.modelIndex(n, m, j)),
						"model %q is already served by %s[%d] (same api %s); requests for it would never reach this provider", m, path, first, pv.API)
				} else {
					served[k] = i
				}
			}
		} else if item.Kind == yaml.MappingNode {
			d.add(item, CodeMissing, ip+".models", "missing; list the models this provider may serve")
		}
		if n := f["ca_file"]; n != nil {
			if s, ok := d.path(n, ip+".ca_file"); ok {
				pv.CAFile = s
				if st, err := os.Stat(s); err != nil {
					d.add(n, CodeNotFound, ip+".ca_file", "%s: %s", s, errText(err))
				} else if !st.Mode().IsRegular() {
					d.add(n, CodeBadValue, ip+".ca_file", "%s is not a regular file", s)
				}
			}
		}
		out = append(out, pv)
	}
	return out
}

// modelIndex returns the index in the list node n of the item whose value
// is m (models drops bad items, so indices may shift); guess if not found.
func (d *decoder) modelIndex(n *yaml.Node, m string, guess int) int {
	for i, c := range n.Content {
		if c.Value == m {
			return i
		}
	}
	return guess
}

func (d *decoder) models(n *yaml.Node, path string) []string {
	items := d.seq(n, path, MaxModels)
	if n.Kind == yaml.SequenceNode && len(items) == 0 {
		d.add(n, CodeMissing, path, "empty; a provider with no models can serve nothing")
	}
	out := []string{}
	seen := map[string]int{}
	for i, item := range items {
		ip := fmt.Sprintf("%s[%d]", path, i)
		s, ok := d.str(item, ip)
		if !ok {
			continue
		}
		if s == "" || len(s) > maxModelLen || strings.ContainsFunc(s, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
			d.add(item, CodeBadValue, ip, "model %q must be 1-%d printable characters without spaces", s, maxModelLen)
			continue
		}
		if j, dup := seen[s]; dup {
			d.add(item, CodeDuplicate, ip, "model %q is already listed at %s[%d]", s, path, j)
			continue
		}
		seen[s] = i
		out = append(out, s)
	}
	return out
}

func (d *decoder) env(n *yaml.Node, path string) map[string]string {
	out := map[string]string{}
	if !d.kind(n, path, yaml.MappingNode, "a mapping of NAME: value") {
		return out
	}
	if len(n.Content)/2 > MaxEnv {
		d.add(n, CodeTooLarge, path, "more than %d variables", MaxEnv)
		return out
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		name, ok := d.str(k, path)
		if !ok {
			continue
		}
		ip := path + "." + name
		if !validEnvName(name) {
			d.add(k, CodeBadValue, ip, "%q is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)", name)
			continue
		}
		if _, dup := out[name]; dup {
			d.add(k, CodeDuplicate, ip, "duplicate key %q", name)
			continue
		}
		val, ok := d.str(v, ip)
		if !ok {
			continue
		}
		if strings.IndexByte(val, 0) >= 0 || len(val) > MaxEnvValueBytes {
			d.add(v, CodeBadValue, ip, "value must be at most %d bytes with no NUL", MaxEnvValueBytes)
			continue
		}
		out[name] = val
	}
	return out
}
