package policy

import (
	"fmt"
	neturl "net/url"
	"os"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/moat-sandbox/moat/internal/netguard"
)

// Egress configures what the workload may reach beyond inference and
// tools, always through the broker on the sandbox's loopback (no new route
// out of its network namespace):
//
//	egress:
//	  hosts:                              # TLS tunnels (CONNECT on the egress port)
//	    - {host: pypi.org, port: 443}
//	    - {host: "*.pythonhosted.org"}    # port 443 by default; one more label only
//	  services:                           # brokered HTTPS APIs, credential added by moat
//	    - name: github                    # http://127.0.0.1:<port>/svc/github/...
//	      base_url: https://github.com
//	      credential_env: GH_TOKEN        # moat's variable; never in the workload
//	      auth: basic                     # bearer | basic | header:NAME
//	      methods: [GET, POST]
//	      paths: ["/owner/repo.git/*"]    # exact, or a prefix ending in /*
//	      query: {service: [git-upload-pack, git-receive-pack]}
//	      max_requests: 256
//	  max_tunnels: 256                    # tunnels of the whole run
//	  idle_timeout: 2m                    # a tunnel that carries nothing is closed
//	  max_duration: 30m                   # no tunnel lives longer
//
// Hosts are DNS names in their IDNA ASCII form (matched case-insensitively,
// stored lower case), "*." and a name of at least two labels (exactly one
// label more), or IP literals, which match only themselves (see
// internal/netguard). Whatever the grant, the broker resolves a name once
// and dials only global unicast addresses.
//
// Absent, the section is the zero value and grants nothing; present, its
// limits take the defaults below.
type Egress struct {
	Hosts    []EgressHost    `yaml:"hosts,omitempty" json:"hosts,omitempty"`
	Services []EgressService `yaml:"services,omitempty" json:"services,omitempty"`
	// Packages are lockfile-bound package registries (packages.go).
	Packages []PackageGrant `yaml:"packages,omitempty" json:"packages,omitempty"`
	// MaxTunnels caps the tunnels opened in the whole run, all grants
	// together; refused past it.
	MaxTunnels int `yaml:"max_tunnels" json:"max_tunnels"`
	// IdleTimeout closes a tunnel that carried no byte either way for
	// that long; MaxDuration closes any tunnel that old.
	IdleTimeout Duration `yaml:"idle_timeout" json:"idle_timeout"`
	MaxDuration Duration `yaml:"max_duration" json:"max_duration"`
}

// EgressHost is one egress.hosts grant.
type EgressHost struct {
	Host string `yaml:"host" json:"host"` // canonical (netguard.Host.String)
	Port int    `yaml:"port" json:"port"`
	// MaxConnections caps the tunnels of this grant in the run.
	MaxConnections int `yaml:"max_connections" json:"max_connections"`
	// MaxBytes caps the bytes of this grant's tunnels, both directions
	// and all tunnels together; the tunnel that reaches it is closed.
	MaxBytes Size `yaml:"max_bytes" json:"max_bytes"`
}

// Grant returns the parsed host. Hosts of a loaded policy always parse.
func (h *EgressHost) Grant() netguard.Host {
	g, err := netguard.ParseGrant(h.Host)
	if err != nil {
		panic("BUG: policy: egress host " + h.Host + " does not parse: " + err.Error())
	}
	return g
}

// EgressService is one egress.services entry.
type EgressService struct {
	Name    string `yaml:"name" json:"name"`
	BaseURL string `yaml:"base_url" json:"base_url"` // https only
	// CredentialEnv names moat's variable that holds the credential;
	// empty: none is added. Auth says how it is sent: "bearer"
	// (Authorization: Bearer), "basic" (the variable holds user:password)
	// or "header:NAME" (the value as header NAME).
	CredentialEnv string   `yaml:"credential_env,omitempty" json:"credential_env,omitempty"`
	Auth          string   `yaml:"auth,omitempty" json:"auth,omitempty"`
	Methods       []string `yaml:"methods" json:"methods"`
	// Paths are relative to base_url's path: "/a/b" exactly, or "/a/*":
	// any path beneath /a/ (at least one more character).
	Paths []string `yaml:"paths" json:"paths"`
	// Query lists the query parameters a request may carry, each with its
	// allowed values (["*"]: any value). Absent: no query.
	Query       map[string][]string `yaml:"query,omitempty" json:"query,omitempty"`
	MaxRequests int                 `yaml:"max_requests" json:"max_requests"`
	CAFile      string              `yaml:"ca_file,omitempty" json:"ca_file,omitempty"`
}

// Egress defaults and limits.
const (
	DefaultEgressPort              = 443
	DefaultMaxConnections          = 64
	DefaultEgressMaxBytes     Size = 1 << 30
	DefaultMaxTunnels              = 256
	DefaultTunnelIdleTimeout       = Duration(2 * time.Minute)
	DefaultTunnelMaxDuration       = Duration(30 * time.Minute)
	DefaultServiceMaxRequests      = 64
	MinTunnelTimeout               = Duration(time.Second)
	MaxTunnelTimeout               = Duration(24 * time.Hour)
	MaxEgressHosts                 = 128
	MaxServices                    = 32
	MaxServicePaths                = 128
	MaxServiceQuery                = 32
	MaxTunnelsLimit                = 1 << 20
	MaxEgressBytesLimit       Size = 1 << 40
	AuthBearer                     = "bearer"
	AuthBasic                      = "basic"
	AuthHeaderPrefix               = "header:"
	AnyQueryValue                  = "*"
	maxServicePathLen              = 1024
)

// ServiceMethods are the methods a service may allow.
var ServiceMethods = []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"}

var (
	egressKeys     = []string{"hosts", "services", "packages", "max_tunnels", "idle_timeout", "max_duration"}
	egressHostKeys = []string{"host", "port", "max_connections", "max_bytes"}
	serviceKeys    = []string{"name", "base_url", "credential_env", "auth", "methods", "paths", "query", "max_requests", "ca_file"}
)

// AuthHeader returns the header a "header:NAME" service sends its
// credential in ("" for bearer and basic).
func (s *EgressService) AuthHeader() string {
	h, _ := strings.CutPrefix(s.Auth, AuthHeaderPrefix)
	if h == s.Auth {
		return ""
	}
	return h
}

// AllowsMethod reports whether the service lists m.
func (s *EgressService) AllowsMethod(m string) bool { return slices.Contains(s.Methods, m) }

// AllowsPath reports whether p (a path relative to base_url's path,
// already checked to be clean by the caller) is covered by the service's
// paths: equal to one, or beneath one ending in "/*".
func (s *EgressService) AllowsPath(p string) bool {
	for _, g := range s.Paths {
		if prefix, ok := strings.CutSuffix(g, "*"); ok {
			if len(p) > len(prefix) && strings.HasPrefix(p, prefix) {
				return true
			}
		} else if p == g {
			return true
		}
	}
	return false
}

// AllowsQuery reports whether parameter name with value v is allowed.
func (s *EgressService) AllowsQuery(name, v string) bool {
	vs, ok := s.Query[name]
	return ok && (slices.Contains(vs, AnyQueryValue) || slices.Contains(vs, v))
}

// egressDefaults are the limits a present egress section starts from.
func egressDefaults() Egress {
	return Egress{MaxTunnels: DefaultMaxTunnels, IdleTimeout: DefaultTunnelIdleTimeout, MaxDuration: DefaultTunnelMaxDuration}
}

func (d *decoder) egress(n *yaml.Node, e *Egress) {
	*e = egressDefaults()
	f := d.mapping(n, "egress", egressKeys...)
	if v := f["hosts"]; v != nil {
		seen := map[string]string{}
		for i, item := range d.seq(v, "egress.hosts", MaxEgressHosts) {
			ip := fmt.Sprintf("egress.hosts[%d]", i)
			h, ok := d.egressHost(item, ip)
			if !ok {
				continue
			}
			k := fmt.Sprintf("%s:%d", h.Host, h.Port)
			if prev, dup := seen[k]; dup {
				d.add(item, CodeDuplicate, ip, "%s is already granted by %s", k, prev)
				continue
			}
			seen[k] = ip
			e.Hosts = append(e.Hosts, h)
		}
	}
	if v := f["services"]; v != nil {
		names := map[string]string{}
		for i, item := range d.seq(v, "egress.services", MaxServices) {
			ip := fmt.Sprintf("egress.services[%d]", i)
			s, ok := d.service(item, ip)
			if !ok {
				continue
			}
			if prev, dup := names[s.Name]; dup {
				d.add(item, CodeDuplicate, ip+".name", "service name %q is already used by %s", s.Name, prev)
				continue
			}
			names[s.Name] = ip
			e.Services = append(e.Services, s)
		}
	}
	if v := f["packages"]; v != nil {
		e.Packages = d.packages(v, "egress.packages")
	}
	if v := f["max_tunnels"]; v != nil {
		if x, ok := d.limit(v, "egress.max_tunnels", 0, MaxTunnelsLimit); ok {
			e.MaxTunnels = x
		}
	}
	if v := f["idle_timeout"]; v != nil {
		if x, ok := d.tunnelDuration(v, "egress.idle_timeout"); ok {
			e.IdleTimeout = x
		}
	}
	if v := f["max_duration"]; v != nil {
		if x, ok := d.tunnelDuration(v, "egress.max_duration"); ok {
			e.MaxDuration = x
		}
	}
}

func (d *decoder) tunnelDuration(n *yaml.Node, path string) (Duration, bool) {
	s, ok := d.str(n, path)
	if !ok {
		return 0, false
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		d.add(n, CodeBadValue, path, "%q is not a duration: write one such as 2m or 30m", s)
		return 0, false
	}
	if x := Duration(v); x < MinTunnelTimeout || x > MaxTunnelTimeout {
		d.add(n, CodeBadValue, path, "%s is out of range [%s, %s]", x, MinTunnelTimeout, MaxTunnelTimeout)
		return 0, false
	}
	return Duration(v), true
}

func (d *decoder) egressHost(n *yaml.Node, ip string) (EgressHost, bool) {
	h := EgressHost{Port: DefaultEgressPort, MaxConnections: DefaultMaxConnections, MaxBytes: DefaultEgressMaxBytes}
	nprobs := len(d.probs)
	f := d.mapping(n, ip, egressHostKeys...)
	if n.Kind != yaml.MappingNode {
		return h, false
	}
	if v := f["host"]; v != nil {
		if s, ok := d.str(v, ip+".host"); ok {
			g, err := netguard.ParseGrant(s)
			if err != nil {
				d.add(v, CodeBadValue, ip+".host", "%v", err)
			}
			h.Host = g.String()
		}
	} else {
		d.add(n, CodeMissing, ip+".host", "missing; name the host the workload may open TLS tunnels to, e.g. pypi.org or \"*.pythonhosted.org\"")
	}
	if v := f["port"]; v != nil {
		if x, ok := d.limit(v, ip+".port", 1, 65535); ok {
			h.Port = x
		}
	}
	if v := f["max_connections"]; v != nil {
		if x, ok := d.limit(v, ip+".max_connections", 0, MaxTunnelsLimit); ok {
			h.MaxConnections = x
		}
	}
	if v := f["max_bytes"]; v != nil {
		if x, ok := d.size(v, ip+".max_bytes", 0); ok {
			if x > MaxEgressBytesLimit {
				d.add(v, CodeBadValue, ip+".max_bytes", "%d bytes is above the limit of %d", int64(x), int64(MaxEgressBytesLimit))
			}
			h.MaxBytes = x
		}
	}
	return h, len(d.probs) == nprobs
}

func (d *decoder) service(n *yaml.Node, ip string) (EgressService, bool) {
	s := EgressService{MaxRequests: DefaultServiceMaxRequests}
	nprobs := len(d.probs)
	f := d.mapping(n, ip, serviceKeys...)
	if n.Kind != yaml.MappingNode {
		return s, false
	}
	if v := f["name"]; v != nil {
		if name, ok := d.str(v, ip+".name"); ok {
			if !validServerName(name) {
				d.add(v, CodeBadValue, ip+".name", "name %q must be 1-%d characters of a-z, 0-9 and '-', starting with a letter, not ending with '-' and without \"--\" (it becomes /svc/<name>/)", name, maxServerNameLen)
			}
			s.Name = name
		}
	} else {
		d.add(n, CodeMissing, ip+".name", "missing; every service needs a name (the workload reaches it at /svc/<name>/)")
	}
	if v := f["base_url"]; v != nil {
		if u, ok := d.str(v, ip+".base_url"); ok {
			if msg := checkServiceURL(u); msg != "" {
				d.add(v, CodeURL, ip+".base_url", "%s", msg)
			}
			s.BaseURL = strings.TrimSuffix(u, "/")
		}
	} else {
		d.add(n, CodeMissing, ip+".base_url", "missing; e.g. https://github.com")
	}
	if v := f["credential_env"]; v != nil {
		if c, ok := d.str(v, ip+".credential_env"); ok {
			if !validEnvName(c) {
				d.add(v, CodeBadValue, ip+".credential_env", "%q is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)", c)
			}
			s.CredentialEnv = c
		}
	}
	if v := f["auth"]; v != nil {
		if a, ok := d.str(v, ip+".auth"); ok {
			if msg := checkAuth(a); msg != "" {
				d.add(v, CodeBadValue, ip+".auth", "%s", msg)
			} else if f["credential_env"] == nil {
				d.add(v, CodeMissing, ip+".credential_env", "auth %q needs credential_env, the variable of moat's environment that holds the credential", a)
			}
			s.Auth = a
		}
	} else if s.CredentialEnv != "" {
		s.Auth = AuthBearer
	}
	if v := f["methods"]; v != nil {
		s.Methods = d.methods(v, ip+".methods")
	} else {
		d.add(n, CodeMissing, ip+".methods", "missing; list the HTTP methods the workload may use, e.g. [GET]")
	}
	if v := f["paths"]; v != nil {
		s.Paths = d.servicePaths(v, ip+".paths")
	} else {
		d.add(n, CodeMissing, ip+".paths", "missing; list the paths the workload may request, e.g. [\"/owner/repo.git/*\"]")
	}
	if v := f["query"]; v != nil {
		if q := d.query(v, ip+".query"); len(q) > 0 {
			s.Query = q // {} is no query, as absent (and prints as absent)
		}
	}
	if v := f["max_requests"]; v != nil {
		if x, ok := d.limit(v, ip+".max_requests", 0, MaxRequestsLimit); ok {
			s.MaxRequests = x
		}
	}
	if v := f["ca_file"]; v != nil {
		if p, ok := d.path(v, ip+".ca_file"); ok {
			s.CAFile = p
			if st, err := os.Stat(p); err != nil {
				d.add(v, CodeNotFound, ip+".ca_file", "%s: %s", p, errText(err))
			} else if !st.Mode().IsRegular() {
				d.add(v, CodeBadValue, ip+".ca_file", "%s is not a regular file", p)
			}
		}
	}
	return s, len(d.probs) == nprobs
}

// checkServiceURL: https, a host the guard can name, no credentials,
// query or fragment, a clean path.
func checkServiceURL(s string) string {
	u, err := neturl.Parse(s)
	switch {
	case err != nil:
		return fmt.Sprintf("base_url %q is not a URL", s)
	case u.Scheme != "https":
		return fmt.Sprintf("base_url %q must start with https:// (services are reached over TLS only)", s)
	case u.User != nil:
		return fmt.Sprintf("base_url %q carries credentials; put them in the variable named by credential_env", s)
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || u.Opaque != "":
		return fmt.Sprintf("base_url %q must not have a query or fragment", s)
	case u.RawPath != "" || strings.Contains(u.Path, "//") || strings.Contains(u.Path+"/", "/./") || strings.Contains(u.Path+"/", "/../"):
		return fmt.Sprintf("base_url %q must have a clean path without escapes", s)
	}
	if _, err := netguard.ParseTarget(u.Hostname()); err != nil {
		return fmt.Sprintf("base_url %q: %v", s, err)
	}
	if p := u.Port(); p != "" {
		var n int
		if _, err := fmt.Sscanf(p, "%d", &n); err != nil || n < 1 || n > 65535 || fmt.Sprint(n) != p {
			return fmt.Sprintf("base_url %q has a bad port", s)
		}
	}
	return ""
}

func checkAuth(a string) string {
	switch a {
	case AuthBearer, AuthBasic:
		return ""
	}
	h, ok := strings.CutPrefix(a, AuthHeaderPrefix)
	if !ok {
		return fmt.Sprintf("auth %q is not bearer, basic or header:NAME", a)
	}
	if h == "" || !validHeaderName(h) {
		return fmt.Sprintf("auth %q: %q is not a header name (letters, digits and '-')", a, h)
	}
	switch strings.ToLower(h) {
	case "host", "content-length", "transfer-encoding", "connection", "te", "upgrade", "trailer", "keep-alive", "proxy-connection", "content-encoding", "expect", "cookie":
		return fmt.Sprintf("auth %q: moat frames %s itself; choose the header the service reads its credential from", a, h)
	}
	if strings.HasPrefix(strings.ToLower(h), "moat-") {
		return fmt.Sprintf("auth %q: Moat-* headers are moat's own", a)
	}
	return ""
}

func validHeaderName(h string) bool {
	if len(h) > 64 {
		return false
	}
	for _, c := range []byte(h) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

func (d *decoder) methods(n *yaml.Node, path string) []string {
	items := d.seq(n, path, len(ServiceMethods))
	if n.Kind == yaml.SequenceNode && len(items) == 0 {
		d.add(n, CodeMissing, path, "empty; a service with no methods can do nothing")
	}
	out := []string{}
	for i, item := range items {
		ip := fmt.Sprintf("%s[%d]", path, i)
		m, ok := d.str(item, ip)
		if !ok {
			continue
		}
		switch {
		case !slices.Contains(ServiceMethods, m):
			d.add(item, CodeBadValue, ip, "method %q is not one of %s", m, strings.Join(ServiceMethods, ", "))
		case slices.Contains(out, m):
			d.add(item, CodeDuplicate, ip, "method %s is already listed", m)
		default:
			out = append(out, m)
		}
	}
	return out
}

// servicePaths decodes path globs: "/" then clean segments of unreserved
// characters and a few sub-delims, optionally ending in "/*".
func (d *decoder) servicePaths(n *yaml.Node, path string) []string {
	items := d.seq(n, path, MaxServicePaths)
	if n.Kind == yaml.SequenceNode && len(items) == 0 {
		d.add(n, CodeMissing, path, "empty; a service with no paths can do nothing (write [\"/*\"] for every path)")
	}
	out := []string{}
	for i, item := range items {
		ip := fmt.Sprintf("%s[%d]", path, i)
		p, ok := d.str(item, ip)
		if !ok {
			continue
		}
		if msg := checkPathGlob(p); msg != "" {
			d.add(item, CodeBadValue, ip, "%s", msg)
			continue
		}
		if slices.Contains(out, p) {
			d.add(item, CodeDuplicate, ip, "path %q is already listed", p)
			continue
		}
		out = append(out, p)
	}
	return out
}

// checkPathGlob returns "" for a valid path glob, else why not.
func checkPathGlob(p string) string {
	base, wild := strings.CutSuffix(p, "/*")
	if wild {
		base += "/"
	}
	switch {
	case len(p) > maxServicePathLen:
		return fmt.Sprintf("path is longer than %d bytes", maxServicePathLen)
	case !strings.HasPrefix(p, "/"):
		return fmt.Sprintf("path %q must start with /", p)
	case strings.Contains(base, "*"):
		return fmt.Sprintf("path %q: '*' is allowed only as the last segment, after '/' (\"/a/*\")", p)
	case strings.Contains(base, "//"):
		return fmt.Sprintf("path %q has an empty segment", p)
	}
	for _, seg := range strings.Split(strings.Trim(base, "/"), "/") {
		if seg == "." || seg == ".." {
			return fmt.Sprintf("path %q has a dot segment", p)
		}
	}
	for _, c := range []byte(base) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("/-._~@:+,=!$&'()", c) >= 0) {
			return fmt.Sprintf("path %q has %q; write paths without percent-encoding, queries or other special characters", p, string(rune(c)))
		}
	}
	return ""
}

func (d *decoder) query(n *yaml.Node, path string) map[string][]string {
	out := map[string][]string{}
	if !d.kind(n, path, yaml.MappingNode, "a mapping of parameter: [allowed values]") {
		return out
	}
	if len(n.Content)/2 > MaxServiceQuery {
		d.add(n, CodeTooLarge, path, "more than %d parameters", MaxServiceQuery)
		return out
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		name, ok := d.str(k, path)
		if !ok {
			continue
		}
		ip := path + "." + name
		if name == "" || len(name) > 64 || strings.ContainsFunc(name, notQueryChar) {
			d.add(k, CodeBadValue, ip, "parameter name %q must be 1-64 characters of letters, digits, '-', '_' and '.'", name)
			continue
		}
		if _, dup := out[name]; dup {
			d.add(k, CodeDuplicate, ip, "duplicate parameter %q", name)
			continue
		}
		vals := []string{}
		items := d.seq(v, ip, 64)
		if v.Kind == yaml.SequenceNode && len(items) == 0 {
			d.add(v, CodeMissing, ip, "empty; list the allowed values, or [\"*\"] for any")
		}
		for j, it := range items {
			jp := fmt.Sprintf("%s[%d]", ip, j)
			s, ok := d.str(it, jp)
			if !ok {
				continue
			}
			switch {
			case s == AnyQueryValue && len(items) > 1:
				d.add(it, CodeBadValue, jp, "\"*\" allows any value and must be the only item")
			case s != AnyQueryValue && (s == "" || len(s) > 256 || strings.ContainsFunc(s, notQueryChar)):
				d.add(it, CodeBadValue, jp, "value %q must be 1-256 characters of letters, digits, '-', '_' and '.'", s)
			case slices.Contains(vals, s):
				d.add(it, CodeDuplicate, jp, "value %q is already listed", s)
			default:
				vals = append(vals, s)
			}
		}
		out[name] = vals
	}
	return out
}

func notQueryChar(r rune) bool {
	return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.')
}

// ExplainEgress says what each egress grant lets through, one line each
// (moat policy check, moat run --explain). None without an egress section.
func (p *Policy) ExplainEgress() []string {
	e := &p.Egress
	var out []string
	for _, h := range e.Hosts {
		what := "the host " + h.Host
		switch g := h.Grant(); {
		case g.IP.IsValid():
			what = "the address " + h.Host + " (only if it is global unicast)"
		case g.Wildcard:
			what = "any name one label under " + g.Name + " (not " + g.Name + " itself)"
		}
		out = append(out, fmt.Sprintf("egress.hosts %s:%d: TLS tunnels (CONNECT on the egress port, SNI equal to the CONNECT host) to %s on port %d, resolved once to a global unicast address; at most %d tunnels and %s in all, each closed after %s idle or %s",
			h.Host, h.Port, what, h.Port, h.MaxConnections, sizeText(h.MaxBytes), e.IdleTimeout, e.MaxDuration))
	}
	for _, s := range e.Services {
		q := "no query"
		if len(s.Query) > 0 {
			var parts []string
			for _, k := range sortedQueryKeys(s.Query) {
				parts = append(parts, k+"="+strings.Join(s.Query[k], "|"))
			}
			q = "query " + strings.Join(parts, "&")
		}
		cred := "no credential"
		if s.CredentialEnv != "" {
			cred = s.Auth + " credential from $" + s.CredentialEnv + " (added by moat, never in the sandbox)"
		}
		out = append(out, fmt.Sprintf("egress.services %s: %s to %s{%s} at /svc/%s/, %s, %s; redirects not followed; at most %d requests",
			s.Name, strings.Join(s.Methods, ","), s.BaseURL, strings.Join(s.Paths, ","), s.Name, q, cred, s.MaxRequests))
	}
	out = append(out, e.explainPackages()...)
	if len(e.Hosts) > 0 {
		out = append(out, fmt.Sprintf("egress: at most %d tunnels in the run", e.MaxTunnels))
	}
	return out
}

func sortedQueryKeys(m map[string][]string) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

func sizeText(s Size) string {
	for _, u := range []struct {
		n      Size
		suffix string
	}{{1 << 40, "Ti"}, {1 << 30, "Gi"}, {1 << 20, "Mi"}, {1 << 10, "Ki"}} {
		if s >= u.n && s%u.n == 0 {
			return fmt.Sprintf("%d%s bytes", s/u.n, u.suffix)
		}
	}
	return fmt.Sprintf("%d bytes", int64(s))
}
