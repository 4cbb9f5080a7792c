//go:build linux

package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

type runSummaryJSON struct {
	RunID    string `json:"run_id"`
	Sandbox  string `json:"sandbox"`
	RunDir   string `json:"run_dir"`
	Journal  string `json:"journal"`
	KeyID    string `json:"keyid"`
	ExitCode int    `json:"exit_code"`
	Reason   string `json:"reason"`
	Error    string `json:"error"`
}

// summaryAfter splits stdout into the workload's output and moat's -o json
// summary, which comes last.
func summaryAfter(t *testing.T, r result, workload string) runSummaryJSON {
	t.Helper()
	if !strings.HasPrefix(r.stdout, workload) {
		t.Fatalf("stdout does not start with the workload's own output %q\n%s", workload, r)
	}
	var s runSummaryJSON
	if err := json.Unmarshal([]byte(strings.TrimPrefix(r.stdout, workload)), &s); err != nil {
		t.Fatalf("summary: %v\n%s", err, r)
	}
	return s
}

// moat run -o json: the workload's stdout unchanged, then a summary whose
// run id, key and terminal reason are the journal's; runs list and show
// find the same run, and show verifies it with the pin.
func TestRunOutputJSONAndRuns(t *testing.T) {
	e := newEnv(t)
	pol := e.policy("")
	r := e.moat("run", "--policy", pol, "-o", "json", "sh", "-c", "echo workload-out; exit 3")
	if r.code != 3 {
		t.Fatalf("exit %d, want the workload's 3\n%s", r.code, r)
	}
	s := summaryAfter(t, r, "workload-out\n")
	if s.ExitCode != 3 || s.Reason != "completed" || s.RunID == "" || len(s.KeyID) != 64 ||
		s.Journal != filepath.Join(e.auditDir, s.RunID, "journal.jsonl") || s.Error != "" {
		t.Fatalf("summary %+v", s)
	}
	if !strings.Contains(r.stderr, s.KeyID) {
		t.Errorf("the summary's key %s is not the one moat printed at start\n%s", s.KeyID, r.stderr)
	}
	nf := e.moat("run", "--policy", pol, "-o", "json", "/no/such/command")
	if nf.code != 127 {
		t.Fatalf("not found: exit %d\n%s", nf.code, nf)
	}
	if s2 := summaryAfter(t, nf, ""); s2.ExitCode != 127 || s2.Reason != "exec_failed" || s2.Error == "" {
		t.Errorf("not-found summary %+v", s2)
	}

	l := e.moat("runs", "list", "--audit-dir", e.auditDir, "-o", "json")
	var runs []struct {
		ID       string `json:"id"`
		Backend  string `json:"backend"`
		Reason   string `json:"reason"`
		ExitCode *int   `json:"exit_code"`
	}
	if err := json.Unmarshal([]byte(l.stdout), &runs); err != nil || l.code != 0 || len(runs) != 2 {
		t.Fatalf("runs list: %v\n%s", err, l)
	}
	if runs[0].ID != s.RunID || runs[0].Reason != "completed" || runs[0].ExitCode == nil || *runs[0].ExitCode != 3 || runs[0].Backend != "native" {
		t.Errorf("runs list: first run %+v, want %s completed exit 3 on native", runs[0], s.RunID)
	}
	if v := e.moat("runs", "show", s.RunID, "--audit-dir", e.auditDir, "--key-fingerprint", s.KeyID); v.code != 0 ||
		!strings.Contains(v.stdout, "complete") || !strings.Contains(v.stdout, "pinned") || strings.Contains(v.stderr, "UNPINNED") {
		t.Errorf("runs show pinned: %s", v)
	}
	// The positive control above, the pin mismatch here.
	if v := e.moat("runs", "show", s.RunID, "--audit-dir", e.auditDir, "--key-fingerprint", strings.Repeat("0", 64)); v.code != 1 {
		t.Errorf("runs show with another key's pin: %s", v)
	}
}

// sandbox exec -o json: the command's output, then the sandbox's run id,
// journal and key with the command's exit code.
func TestSandboxExecOutputJSON(t *testing.T) {
	e := newEnv(t)
	pol := e.policy("")
	if r := e.moat("sandbox", "create", "sj", "--policy", pol); r.code != 0 {
		t.Fatalf("create: %s", r)
	}
	defer e.moat("sandbox", "delete", "sj")
	r := e.moat("sandbox", "exec", "sj", "-o", "json", "sh", "-c", "echo exec-out; exit 5")
	if r.code != 5 {
		t.Fatalf("exit %d, want 5\n%s", r.code, r)
	}
	s := summaryAfter(t, r, "exec-out\n")
	st, _ := e.get("sj")
	if s.Sandbox != "sj" || s.RunID != st.RunID || s.Journal != st.Journal || s.KeyID != st.KeyID || s.ExitCode != 5 || s.Reason != "completed" {
		t.Fatalf("summary %+v, state %+v", s, st)
	}
}

// Without a policy, moat puts the journal under the current directory;
// where that cannot be created, it refuses before anything starts and
// says what to do, and --audit-dir is the way out.
func TestRunAuditDirHint(t *testing.T) {
	e := newEnv(t)
	ro := filepath.Join(e.dir, "ro")
	if err := os.Mkdir(ro, 0o555); err != nil {
		t.Fatal(err)
	}
	aud := filepath.Join(e.dir, "aud")
	if err := os.Mkdir(aud, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(aud, 0o777)
	unprivileged := func(cmd *exec.Cmd) *exec.Cmd {
		cmd.Dir = ro
		if os.Geteuid() == 0 {
			// Root writes anywhere: run moat as uid 65534, as a user would.
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
			cmd.Env = append(cmd.Env, "HOME="+aud)
		}
		return cmd
	}
	cmd := unprivileged(e.command("run", "/bin/true"))
	out, _ := cmd.CombinedOutput()
	if code := cmd.ProcessState.ExitCode(); code != 125 || !strings.Contains(string(out), "pass --audit-dir DIR") {
		t.Fatalf("exit %d, want 125 with the --audit-dir hint\n%s", code, out)
	}
	cmd = unprivileged(e.command("run", "--audit-dir", aud, "/bin/true"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("with --audit-dir: %v\n%s", err, out)
	}
	if ents, _ := os.ReadDir(aud); len(ents) != 1 {
		t.Errorf("want one run directory in --audit-dir, got %d", len(ents))
	}
}
