package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/boundary/seccomp"
	"github.com/moat-sandbox/moat/policy"
)

func writePolicyFile(t *testing.T, body string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "ws"), 0o755); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "p.yaml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPolicyCheck(t *testing.T) {
	good := writePolicyFile(t, "version: 1\nfilesystem: {read_write: [ws]}\naudit: {dir: runs}\n")
	bad := writePolicyFile(t, "version: 2\nprocess: {uid: 0}\nfilesystem: {read_write: [../x, ws]}\nextra: 1\n")

	t.Run("valid yaml", func(t *testing.T) {
		var so, se bytes.Buffer
		if err := policyCheck(&so, &se, good, "", false); err != nil {
			t.Fatalf("got %v, want success; stderr %s", err, se.String())
		}
		// The output is itself a policy, the same one.
		p, err := policy.Parse(so.Bytes(), "")
		if err != nil {
			t.Fatalf("output does not load: %v\n%s", err, so.String())
		}
		want, _ := policy.Load(good)
		if p.SHA256() != want.SHA256() || !strings.Contains(so.String(), "# sha256 "+want.SHA256()) {
			t.Errorf("output is not the effective policy:\n%s", so.String())
		}
	})
	t.Run("explain", func(t *testing.T) {
		registerBackends()
		be, err := boundary.Lookup("native")
		if err != nil {
			t.Fatal(err)
		}
		rules := seccomp.Policy(be.(seccomp.Filtered).SeccompOptions())
		var so, se bytes.Buffer
		if err := policyCheck(&so, &se, good, "", true); err != nil {
			t.Fatal(err)
		}
		// Still the effective policy (the filter is in comments), and
		// every rule of the native filter is there, in order.
		p, err := policy.Parse(so.Bytes(), "")
		if want, _ := policy.Load(good); err != nil || p.SHA256() != want.SHA256() {
			t.Fatalf("output with --explain is not the effective policy (%v):\n%s", err, so.String())
		}
		var lines []string
		for _, l := range strings.Split(so.String(), "\n") {
			if r, ok := strings.CutPrefix(l, "#    "); ok {
				lines = append(lines, r)
			}
		}
		if len(rules) == 0 || len(lines) != len(rules) {
			t.Fatalf("got %d rule lines, want the %d of seccomp.Policy:\n%s", len(lines), len(rules), so.String())
		}
		for i, r := range rules {
			if lines[i] != r.String() {
				t.Errorf("rule %d: got %q, want %q", i, lines[i], r.String())
			}
		}
		so.Reset()
		if err := policyCheck(&so, &se, good, "json", true); err != nil {
			t.Fatal(err)
		}
		var res policyCheckResult
		if err := json.Unmarshal(so.Bytes(), &res); err != nil || len(res.Seccomp) != len(rules) || res.Seccomp[0] != rules[0].String() {
			t.Errorf("json --explain: got %d rules (%v), want %d", len(res.Seccomp), err, len(rules))
		}
		// Control: without --explain, no filter.
		so.Reset()
		if err := policyCheck(&so, &se, good, "json", false); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(so.String(), "seccomp") {
			t.Errorf("json without --explain mentions seccomp:\n%s", so.String())
		}
	})
	t.Run("valid json", func(t *testing.T) {
		var so, se bytes.Buffer
		if err := policyCheck(&so, &se, good, "json", false); err != nil {
			t.Fatal(err)
		}
		var r struct {
			Valid  bool
			SHA256 string
			Policy map[string]any
		}
		if err := json.Unmarshal(so.Bytes(), &r); err != nil || !r.Valid || len(r.SHA256) != 64 || r.Policy["backend"] != "native" {
			t.Errorf("got %+v %v from\n%s", r, err, so.String())
		}
	})
	t.Run("invalid", func(t *testing.T) {
		var so, se bytes.Buffer
		err := policyCheck(&so, &se, bad, "", false)
		var ee *ExitError
		if !errors.As(err, &ee) || ee.Code != ExitRefused {
			t.Fatalf("got %v, want exit %d", err, ExitRefused)
		}
		if so.Len() != 0 {
			t.Errorf("stdout got %q, want nothing", so.String())
		}
		for _, s := range []string{bad + ":1: version", bad + ":2: process.uid", bad + ":3: filesystem.read_write[0]", bad + ":4: extra"} {
			if !strings.Contains(se.String(), s) {
				t.Errorf("stderr does not name %q:\n%s", s, se.String())
			}
		}
	})
	t.Run("invalid json", func(t *testing.T) {
		var so, se bytes.Buffer
		err := policyCheck(&so, &se, bad, "json", false)
		var ee *ExitError
		if !errors.As(err, &ee) || ee.Code != ExitRefused {
			t.Fatalf("got %v, want exit %d", err, ExitRefused)
		}
		var r policyCheckResult
		if err := json.Unmarshal(so.Bytes(), &r); err != nil || r.Valid || len(r.Problems) != 4 {
			t.Errorf("got %+v %v, want 4 problems", r, err)
		}
	})
	t.Run("missing file", func(t *testing.T) {
		var so, se bytes.Buffer
		err := policyCheck(&so, &se, filepath.Join(t.TempDir(), "none.yaml"), "", false)
		var ee *ExitError
		if !errors.As(err, &ee) || ee.Code != ExitRefused || !strings.Contains(err.Error(), "no such file") {
			t.Errorf("got %v, want exit %d naming the missing file", err, ExitRefused)
		}
	})
}

func TestPolicySchemaCmd(t *testing.T) {
	root := NewRoot()
	var so bytes.Buffer
	root.SetOut(&so)
	root.SetArgs([]string{"policy", "schema"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	var v map[string]any
	if err := json.Unmarshal(so.Bytes(), &v); err != nil || v["title"] == nil {
		t.Errorf("got %v, %v; want the schema", v, err)
	}
}
