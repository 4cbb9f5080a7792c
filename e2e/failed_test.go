//go:build linux

package e2e

import (
	"encoding/base64"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
)

// payloadsOf returns the decoded payloads of a journal's lines.
func payloadsOf(t *testing.T, journal string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(readFile(t, journal)), "\n") {
		var env struct {
			Payload string `json:"payload"`
		}
		if err := json.Unmarshal([]byte(line), &env); err != nil {
			t.Fatal(err)
		}
		b, _ := base64.StdEncoding.DecodeString(env.Payload)
		var p map[string]any
		json.Unmarshal(b, &p)
		out = append(out, p)
	}
	return out
}

func failedRecords(t *testing.T, journal string) []map[string]any {
	var out []map[string]any
	for _, p := range payloadsOf(t, journal) {
		if p["type"] == "process.failed" {
			out = append(out, p)
		}
	}
	return out
}

// TestStartFailuresJournaled: a command that cannot be started is in the
// journal as process.failed with its code, for moat run and for moat
// sandbox exec alike; the control, a command that starts, has none.
func TestStartFailuresJournaled(t *testing.T) {
	e := newEnv(t)
	pol := e.policy("")
	audit := filepath.Join(e.dir, "audit-run")
	if r := e.moat("run", "--policy", pol, "--audit-dir", audit, "--", "/usr/bin/no-such-command-moat"); r.code != 127 {
		t.Fatalf("run: %s", r)
	}
	js, _ := filepath.Glob(filepath.Join(audit, "*", "journal.jsonl"))
	if len(js) != 1 {
		t.Fatalf("journals %v", js)
	}
	if f := failedRecords(t, js[0]); len(f) != 1 || f[0]["exit_code"] != float64(127) {
		t.Errorf("run: process.failed records %v, want one with exit_code 127", f)
	}

	if r := e.moat("sandbox", "create", "fails", "--policy", pol); r.code != 0 {
		t.Fatalf("create: %s", r)
	}
	r := e.moat("sandbox", "get", "fails", "-o", "json")
	var st struct {
		Journal string `json:"journal"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || st.Journal == "" {
		t.Fatalf("get: %v %s", err, r)
	}
	if r := e.moat("sandbox", "exec", "fails", "--", "true"); r.code != 0 {
		t.Fatalf("control exec: %s", r)
	}
	if f := failedRecords(t, st.Journal); len(f) != 0 {
		t.Fatalf("control: process.failed %v after a command that started", f)
	}
	if r := e.moat("sandbox", "exec", "fails", "--", "/usr/bin/no-such-command-moat"); r.code != 127 {
		t.Fatalf("exec: %s", r)
	}
	e.moat("sandbox", "delete", "fails")
	if f := failedRecords(t, st.Journal); len(f) != 1 || f[0]["exit_code"] != float64(127) {
		t.Errorf("sandbox exec: process.failed records %v, want one with exit_code 127", f)
	}
}
