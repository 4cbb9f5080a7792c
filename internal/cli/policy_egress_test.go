package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// moat policy check explains each egress grant in one line, as a comment
// after the effective policy and as "egress" in JSON; a policy without
// egress gets neither (the control).
func TestPolicyCheckExplainsEgress(t *testing.T) {
	dir := t.TempDir()
	with := filepath.Join(dir, "egress.yaml")
	without := filepath.Join(dir, "plain.yaml")
	os.WriteFile(with, []byte("version: 1\negress:\n  hosts:\n    - {host: pypi.org}\n    - {host: \"*.pythonhosted.org\"}\n"), 0o644)
	os.WriteFile(without, []byte("version: 1\n"), 0o644)
	var so, se bytes.Buffer
	if err := policyCheck(&so, &se, with, "", false); err != nil {
		t.Fatalf("%v: %s", err, se.String())
	}
	out := so.String()
	for _, want := range []string{
		"\n# egress.hosts pypi.org:443: TLS tunnels",
		"\n# egress.hosts *.pythonhosted.org:443: TLS tunnels (CONNECT on the egress port, SNI equal to the CONNECT host) to any name one label under pythonhosted.org",
		"\n# egress: at most 256 tunnels in the run\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	so.Reset()
	if err := policyCheck(&so, &se, with, "json", false); err != nil {
		t.Fatal(err)
	}
	var res struct {
		Egress []string `json:"egress"`
	}
	if err := json.Unmarshal(so.Bytes(), &res); err != nil || len(res.Egress) != 3 {
		t.Errorf("JSON egress %v, %v", res.Egress, err)
	}
	so.Reset()
	if err := policyCheck(&so, &se, without, "", false); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(so.String(), "egress") {
		t.Errorf("a policy without egress explains some:\n%s", so.String())
	}
}
