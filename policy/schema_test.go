package policy

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
)

type schemaNode struct {
	Properties map[string]*schemaNode `json:"properties"`
	Ref        string                 `json:"$ref"`
	Items      *schemaNode            `json:"items"`
	Enum       []string               `json:"enum"`
	Minimum    *int64                 `json:"minimum"`
	Maximum    *int64                 `json:"maximum"`
	MaxItems   *int                   `json:"maxItems"`
	Required   []string               `json:"required"`
	Defs       map[string]*schemaNode `json:"$defs"`
	Default    any                    `json:"default"`
}

func loadSchema(t *testing.T) *schemaNode {
	t.Helper()
	var s schemaNode
	if err := json.Unmarshal(Schema(), &s); err != nil {
		t.Fatalf("schema.json: %v", err)
	}
	return &s
}

// yamlKeys lists the yaml tags of a struct type's fields.
func yamlKeys(typ reflect.Type) []string {
	var out []string
	for f := range typ.Fields() {
		tag, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if tag != "-" {
			out = append(out, tag)
		}
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func sorted(s []string) []string { s = slices.Clone(s); slices.Sort(s); return s }

// TestSchemaMatchesDecoder keeps the decoder's key lists, the struct tags
// and schema.json in step.
func TestSchemaMatchesDecoder(t *testing.T) {
	s := loadSchema(t)
	prov := s.Defs["provider"]
	levels := []struct {
		name   string
		keys   []string
		typ    reflect.Type
		schema *schemaNode
	}{
		{"top", topKeys, reflect.TypeFor[Policy](), s},
		{"landlock", landlockKeys, reflect.TypeFor[Landlock](), s.Properties["landlock"]},
		{"filesystem", filesystemKeys, reflect.TypeFor[Filesystem](), s.Properties["filesystem"]},
		{"process", processKeys, reflect.TypeFor[Process](), s.Properties["process"]},
		{"limits", limitsKeys, reflect.TypeFor[Limits](), s.Properties["process"].Properties["limits"]},
		{"inference", inferenceKeys, reflect.TypeFor[Inference](), s.Properties["inference"]},
		{"provider", providerKeys, reflect.TypeFor[Provider](), prov},
		{"audit", auditKeys, reflect.TypeFor[Audit](), s.Properties["audit"]},
		{"tools", toolsKeys, reflect.TypeFor[Tools](), s.Properties["tools"]},
		{"mcp_server", mcpKeys, reflect.TypeFor[MCPServer](), s.Defs["mcp_server"]},
		{"server_filesystem", serverFSKeys, reflect.TypeFor[ServerFilesystem](), s.Defs["mcp_server"].Properties["filesystem"]},
		{"kubernetes", kubernetesKeys, reflect.TypeFor[Kubernetes](), s.Properties["kubernetes"]},
		{"kubernetes_resources", resourcesKeys, reflect.TypeFor[KubernetesResources](), s.Properties["kubernetes"].Properties["resources"]},
	}
	for _, l := range levels {
		if got, want := sorted(yamlKeys(l.typ)), sorted(l.keys); !slices.Equal(got, want) {
			t.Errorf("%s: struct yaml tags %v, decoder keys %v", l.name, got, want)
		}
		if got, want := sortedKeys(l.schema.Properties), sorted(l.keys); !slices.Equal(got, want) {
			t.Errorf("%s: schema properties %v, decoder keys %v", l.name, got, want)
		}
	}
	if !slices.Equal(s.Properties["backend"].Enum, Backends) || !slices.Equal(prov.Properties["api"].Enum, APIs) {
		t.Errorf("schema enums %v %v, want %v %v", s.Properties["backend"].Enum, prov.Properties["api"].Enum, Backends, APIs)
	}
	if want := []string{"version"}; !slices.Equal(s.Required, want) {
		t.Errorf("top-level required %v, want %v (the decoder refuses a policy without version)", s.Required, want)
	}
	if want := []string{"name", "api", "base_url", "credential_env", "models"}; !slices.Equal(prov.Required, want) {
		t.Errorf("provider required %v, want %v", prov.Required, want)
	}
	lim := s.Properties["process"].Properties["limits"].Properties
	inf := s.Properties["inference"].Properties
	for _, r := range []struct {
		name     string
		n        *schemaNode
		min, max int64
	}{
		{"abi_floor", s.Properties["landlock"].Properties["abi_floor"], MinABIFloor, MaxABIFloor},
		{"pids", lim["pids"], MinPids, MaxPids},
		{"open_files", lim["open_files"], MinOpenFiles, MaxOpenFiles},
		{"max_requests", inf["max_requests"], 0, MaxRequestsLimit},
		{"max_output_tokens", inf["max_output_tokens"], 0, MaxOutputTokensLimit},
		{"id", s.Defs["id"], 1, MaxID},
	} {
		if r.n.Minimum == nil || r.n.Maximum == nil || *r.n.Minimum != r.min || *r.n.Maximum != r.max {
			t.Errorf("%s: schema range %v..%v, want %d..%d", r.name, r.n.Minimum, r.n.Maximum, r.min, r.max)
		}
	}
	if got := s.Properties["landlock"].Properties["abi_floor"].Default; got != float64(DefaultABIFloor) {
		t.Errorf("abi_floor default %v, want %d", got, DefaultABIFloor)
	}
	if got := lim["pids"].Default; got != float64(DefaultPids) {
		t.Errorf("pids default %v, want %d", got, DefaultPids)
	}
}
