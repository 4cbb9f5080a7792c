package cli

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// YAML output is the JSON output re-encoded: the same members in the same
// order, and every string that would read back as another type quoted.
func TestOutputYAMLSameAsJSON(t *testing.T) {
	v := struct {
		Z     string         `json:"z"`
		A     []string       `json:"a"`
		Empty string         `json:"empty"`
		Num   int            `json:"num"`
		Map   map[string]any `json:"map"`
		None  []int          `json:"none"`
	}{
		Z:   "first",
		A:   []string{"true", "0123", "null", "~", "1e3", "- x", "a: b", "#c", "yes", "multi\nline"},
		Num: 7,
		Map: map[string]any{"k": false, "n": nil},
	}
	var js, ys bytes.Buffer
	if err := (&outputFlag{value: formatJSON}).write(&js, v); err != nil {
		t.Fatal(err)
	}
	if err := (&outputFlag{value: formatYAML}).write(&ys, v); err != nil {
		t.Fatal(err)
	}
	var fromJSON, fromYAML any
	if err := json.Unmarshal(js.Bytes(), &fromJSON); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(ys.Bytes(), &fromYAML); err != nil {
		t.Fatalf("%v\n%s", err, ys.String())
	}
	// JSON numbers decode as float64, YAML ints as int.
	normal, _ := json.Marshal(fromYAML)
	var again any
	json.Unmarshal(normal, &again)
	if !reflect.DeepEqual(fromJSON, again) {
		t.Fatalf("YAML reads back as %v, JSON as %v\n%s", again, fromJSON, ys.String())
	}
	if !strings.HasPrefix(ys.String(), "z: first\na:\n") {
		t.Errorf("member order or block style lost:\n%s", ys.String())
	}
	if strings.Contains(ys.String(), "{") || strings.Contains(ys.String(), `"z"`) {
		t.Errorf("flow style or quoted keys left from the JSON:\n%s", ys.String())
	}
}

func TestOutputFlagRefusesUnknown(t *testing.T) {
	o := &outputFlag{allowed: []string{formatJSON, formatYAML}}
	for _, ok := range []string{"json", "yaml"} {
		if err := o.Set(ok); err != nil || o.value != ok {
			t.Errorf("Set(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"", "JSON", "xml", "table", "json,yaml"} {
		if err := o.Set(bad); err == nil || !strings.Contains(err.Error(), "allowed: json, yaml") {
			t.Errorf("Set(%q): got %v, want a refusal naming json, yaml", bad, err)
		}
	}
}
