package cli

import (
	"bytes"
	"encoding/json"
	"testing"
)

// TestVersionJSON: moat version -o json names the module and the Go
// version from the binary's build information.
func TestVersionJSON(t *testing.T) {
	root := NewRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetArgs([]string{"version", "-o", "json"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	var v versionInfo
	if err := json.Unmarshal(out.Bytes(), &v); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	if v.GoVersion == "" || v.Settings["-compiler"] != "gc" {
		t.Errorf("got %+v", v)
	}
}
