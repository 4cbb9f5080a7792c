package policy

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func TestEgressDecode(t *testing.T) {
	f := newFixture(t)
	p, pe := f.parse(t, string(readTestdata(t, "good")["egress.yaml"]))
	if pe != nil {
		t.Fatal(pe)
	}
	e := p.Egress
	wantHosts := []EgressHost{
		{Host: "pypi.org", Port: 443, MaxConnections: DefaultMaxConnections, MaxBytes: DefaultEgressMaxBytes},
		{Host: "*.pythonhosted.org", Port: 443, MaxConnections: DefaultMaxConnections, MaxBytes: DefaultEgressMaxBytes},
		{Host: "registry.npmjs.org", Port: 443, MaxConnections: 8, MaxBytes: 256 << 20},
		{Host: "93.184.215.14", Port: 8443, MaxConnections: DefaultMaxConnections, MaxBytes: DefaultEgressMaxBytes},
		{Host: "[2606:4700::1111]", Port: 443, MaxConnections: DefaultMaxConnections, MaxBytes: DefaultEgressMaxBytes},
	}
	if !reflect.DeepEqual(e.Hosts, wantHosts) {
		t.Errorf("hosts %+v\nwant %+v", e.Hosts, wantHosts)
	}
	if e.MaxTunnels != 32 || e.IdleTimeout.String() != "30s" || e.MaxDuration.String() != "1h0m0s" {
		t.Errorf("limits %d %s %s", e.MaxTunnels, e.IdleTimeout, e.MaxDuration)
	}
	gh := e.Services[0]
	if gh.BaseURL != "https://github.com" || gh.Auth != AuthBasic || gh.MaxRequests != 256 {
		t.Errorf("service %+v", gh)
	}
	if e.Services[1].AuthHeader() != "X-Api-Key" || gh.AuthHeader() != "" {
		t.Errorf("auth headers %q %q", e.Services[1].AuthHeader(), gh.AuthHeader())
	}
	for _, c := range []struct {
		path string
		want bool
	}{
		{"/owner/repo.git/info/refs", true},
		{"/owner/repo.git/git-upload-pack", true},
		{"/owner/repo.git/", false}, // "/*" needs at least one more character
		{"/owner/repo.git", false},
		{"/owner/repo.gitx/info/refs", false},
		{"/owner/other.git/info/refs", true},
		{"/owner/other.git/info/refs/x", false},
		{"/owner/", false},
	} {
		if got := gh.AllowsPath(c.path); got != c.want {
			t.Errorf("AllowsPath(%q) = %v, want %v", c.path, got, c.want)
		}
	}
	if !gh.AllowsQuery("service", "git-upload-pack") || gh.AllowsQuery("service", "x") || gh.AllowsQuery("other", "git-upload-pack") {
		t.Errorf("query allowlist wrong")
	}
	if !e.Services[1].AllowsQuery("page", "7") || !gh.AllowsMethod("POST") || gh.AllowsMethod("DELETE") {
		t.Errorf("any-value query or methods wrong")
	}
	// Without egress, the section is zero: the policy's identity and its
	// printed forms are what they were.
	q, pe := f.parse(t, "version: 1\n")
	if pe != nil {
		t.Fatal(pe)
	}
	j, _ := q.JSON()
	y, _ := q.YAML()
	if !reflect.ValueOf(q.Egress).IsZero() || strings.Contains(string(j), "egress") || strings.Contains(string(y), "egress") || len(q.ExplainEgress()) != 0 {
		t.Errorf("a policy without egress shows it:\n%s\n%s", j, y)
	}
	// An empty section takes the limits' defaults and grants nothing.
	q, pe = f.parse(t, "version: 1\negress: {}\n")
	if pe != nil || q.Egress.MaxTunnels != DefaultMaxTunnels || len(q.Egress.Hosts) != 0 {
		t.Errorf("egress: {} gave %+v, %v", q.Egress, pe)
	}
	// Round trips: YAML and JSON.
	y, err := p.YAML()
	if err != nil {
		t.Fatal(err)
	}
	r, err := Parse(y, "")
	if err != nil {
		t.Fatalf("printed policy does not load: %v\n%s", err, y)
	}
	if !reflect.DeepEqual(r.Egress, p.Egress) {
		t.Errorf("round trip changed egress:\n%+v\n%+v", r.Egress, p.Egress)
	}
	j, _ = p.JSON()
	var m map[string]any
	if err := json.Unmarshal(j, &m); err != nil || m["egress"] == nil {
		t.Errorf("JSON has no egress: %v", err)
	}
}

func TestExplainEgress(t *testing.T) {
	f := newFixture(t)
	p, pe := f.parse(t, string(readTestdata(t, "good")["egress.yaml"]))
	if pe != nil {
		t.Fatal(pe)
	}
	lines := p.ExplainEgress()
	if len(lines) != len(p.Egress.Hosts)+len(p.Egress.Services)+1 {
		t.Fatalf("%d lines for %d grants:\n%s", len(lines), len(p.Egress.Hosts)+len(p.Egress.Services), strings.Join(lines, "\n"))
	}
	for i, want := range []string{
		"egress.hosts pypi.org:443: TLS tunnels",
		"egress.hosts *.pythonhosted.org:443: TLS tunnels (CONNECT on the egress port, SNI equal to the CONNECT host) to any name one label under pythonhosted.org (not pythonhosted.org itself)",
		"at most 8 tunnels and 256Mi bytes in all, each closed after 30s idle or 1h0m0s",
		"the address 93.184.215.14 (only if it is global unicast) on port 8443",
		"[2606:4700::1111]:443",
		"egress.services github: GET,POST to https://github.com{/owner/repo.git/*,/owner/other.git/info/refs} at /svc/github/, query service=git-upload-pack|git-receive-pack, basic credential from $GH_TOKEN",
		"egress.services api: GET to https://api.example.com/v2{/*} at /svc/api/, query page=*, header:X-Api-Key credential",
		"egress: at most 32 tunnels in the run",
	} {
		if !strings.Contains(lines[i], want) {
			t.Errorf("line %d %q\nlacks %q", i, lines[i], want)
		}
		if strings.Contains(lines[i], "\n") {
			t.Errorf("line %d has a newline", i)
		}
	}
}

func TestSchemaEgress(t *testing.T) {
	s := loadSchema(t)
	for _, l := range []struct {
		name   string
		keys   []string
		typ    reflect.Type
		schema *schemaNode
	}{
		{"egress", egressKeys, reflect.TypeFor[Egress](), s.Properties["egress"]},
		{"egress_host", egressHostKeys, reflect.TypeFor[EgressHost](), s.Defs["egress_host"]},
		{"egress_service", serviceKeys, reflect.TypeFor[EgressService](), s.Defs["egress_service"]},
	} {
		if got, want := sorted(yamlKeys(l.typ)), sorted(l.keys); !slices.Equal(got, want) {
			t.Errorf("%s: struct yaml tags %v, decoder keys %v", l.name, got, want)
		}
		if got, want := sortedKeys(l.schema.Properties), sorted(l.keys); !slices.Equal(got, want) {
			t.Errorf("%s: schema properties %v, decoder keys %v", l.name, got, want)
		}
	}
	if got := s.Defs["egress_service"].Properties["methods"].Items.Enum; !slices.Equal(got, ServiceMethods) {
		t.Errorf("methods enum %v, want %v", got, ServiceMethods)
	}
	if n := s.Properties["egress"].Properties["max_tunnels"]; *n.Maximum != MaxTunnelsLimit || n.Default != float64(DefaultMaxTunnels) {
		t.Errorf("max_tunnels schema %v %v", *n.Maximum, n.Default)
	}
}
