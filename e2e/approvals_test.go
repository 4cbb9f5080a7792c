//go:build linux

package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/fakeprovider"
	"github.com/moat-sandbox/moat/internal/testenv"
)

// heldJSON is what moat approvals list/show -o json print for a request.
type heldJSON struct {
	ID            string `json:"id"`
	RequestID     string `json:"request_id"`
	RequestSHA256 string `json:"request_sha256"`
	PrincipalLine string `json:"principal_line"`
	Request       string `json:"request"`
}

// TestApprovalsRun: moat run with an approval rule holds the workload's
// model request; a second process, the moat CLI, lists and shows it
// through the run's control socket. Approving the first request with a
// digest that is not its own refuses it (a substitution, journaled) and
// it never reaches the provider; the second request, approved with the
// digest show printed, reaches the provider exactly once with those
// bytes, and a second approval of it is refused as a replay; the third
// is denied. The journal verifies complete.
func TestApprovalsRun(t *testing.T) {
	e := newEnv(t)
	p := newProvider(t, false)
	pol := e.policy(fmt.Sprintf(`inference:
  max_requests: 8
  providers:
    - name: anthropic
      api: anthropic-messages
      base_url: http://127.0.0.1:%d
      credential_env: E2E_ANTHROPIC_KEY
      models: [claude-e2e, claude-free]
approvals:
  timeout: 60s
  rules:
    - {road: inference, model: claude-e2e}
`, p.Port()))
	ri := filepath.Join(e.dir, "run-info.json")
	cmd := e.command("run", "--policy", pol, "--run-info", ri, "--", e.probe, helperArg,
		"wait-file="+e.workspace+"/pinned", "infer=claude-free", "infer=claude-e2e", "infer=claude-e2e", "infer=claude-e2e")
	cmd.Env = append(cmd.Env, "E2E_ANTHROPIC_KEY="+anthropicCred)
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
	})
	waitFor(t, "run info", 60*e2eSecond, func() bool { _, err := os.Stat(ri); return err == nil })
	var info struct {
		Journal      string `json:"journal"`
		PublicKeyPEM string `json:"public_key_pem"`
	}
	b, _ := os.ReadFile(ri)
	if err := json.Unmarshal(b, &info); err != nil {
		t.Fatalf("run info: %v", err)
	}
	if err := p.PinPEM(info.PublicKeyPEM); err != nil {
		t.Fatal(err)
	}
	runDir := filepath.Dir(info.Journal)
	if fi, err := os.Stat(filepath.Join(runDir, "control.sock")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("control socket: %v %v, want mode 0600", fi, err)
	}
	os.WriteFile(e.workspace+"/pinned", nil, 0o644)
	os.Chmod(e.workspace+"/pinned", 0o644)

	approvals := func(args ...string) result {
		return e.moat(append([]string{"approvals"}, append(args, "--run", runDir)...)...)
	}
	// next waits for a held request other than seen and shows it.
	next := func(seen string) heldJSON {
		t.Helper()
		var l []heldJSON
		waitFor(t, "a held request", 30*e2eSecond, func() bool {
			r := approvals("list", "-o", "json")
			if r.code != 0 {
				t.Fatalf("approvals list: %s", r)
			}
			l = nil
			json.Unmarshal([]byte(r.stdout), &l)
			return len(l) == 1 && l[0].ID != seen
		})
		r := approvals("show", l[0].ID, "-o", "json")
		var h heldJSON
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &h) != nil || h.RequestSHA256 != l[0].RequestSHA256 {
			t.Fatalf("approvals show: %s", r)
		}
		if sha256hex([]byte(h.Request)) != h.RequestSHA256 || !strings.Contains(h.Request, `"claude-e2e"`) {
			t.Fatalf("show's bytes do not hash to its digest: %+v", h)
		}
		return h
	}

	// The unheld model went out (control); the first held one did not.
	a := next("")
	if got := p.Count(); got != 1 {
		t.Fatalf("provider saw %d requests while one was held, want 1 (the unheld model)", got)
	}
	wrong := strings.Repeat("0", 64)
	if r := approvals("approve", a.ID, "--digest", wrong); r.code != 125 || !strings.Contains(r.stderr, "substitution") {
		t.Errorf("approve with a wrong digest: %s", r)
	}
	bh := next(a.ID)
	if r := approvals("approve", bh.ID, "--digest", bh.RequestSHA256, "--principal", bh.PrincipalLine); r.code != 0 || !strings.Contains(r.stdout, "approved") {
		t.Fatalf("approve: %s", r)
	}
	// A replay of the approval is refused.
	if r := approvals("approve", bh.ID, "--digest", bh.RequestSHA256); r.code != 125 || !strings.Contains(r.stderr, "single use") {
		t.Errorf("replayed approval: %s", r)
	}
	c := next(bh.ID)
	if r := approvals("deny", c.ID); r.code != 0 || !strings.Contains(r.stdout, "denied") {
		t.Fatalf("deny: %s", r)
	}
	select {
	case <-done:
	case <-time.After(60 * e2eSecond):
		t.Fatalf("moat run did not end\n%s\n%s", so.String(), se.String())
	}
	out := so.String()
	for _, w := range []string{
		"infer=claude-free ok status 200",
		"infer=claude-e2e err status 403",
		"did not match it; it was not sent",
		"infer=claude-e2e ok status 200",
		"the operator denied this request",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("workload output lacks %q\n%s\n%s", w, out, se.String())
		}
	}
	reqs := p.Requests()
	if len(reqs) != 2 || sha256hex(reqs[1].Body) != bh.RequestSHA256 || reqs[1].PreEffectErr != nil {
		t.Fatalf("provider saw %d requests; want the unheld one and the approved one with its digest %s", len(reqs), bh.RequestSHA256)
	}
	if _, err := os.Stat(filepath.Join(runDir, "control.sock")); !os.IsNotExist(err) {
		t.Errorf("control socket left after the run: %v", err)
	}
	v := e.moat("audit", "verify", runDir, "-o", "json")
	if v.code != 0 {
		t.Fatalf("audit verify: %s", v)
	}
	show := e.moat("audit", "show", info.Journal)
	if show.code != 0 {
		t.Fatalf("audit show: %s", show)
	}
	for _, w := range []string{"approval.requested", "SUBSTITUTION approval.substitution", "reason=digest_mismatch", "decision=approved", "decision=denied", "reason=replay"} {
		if !strings.Contains(show.stdout, w) {
			t.Errorf("audit show lacks %q\n%s", w, show.stdout)
		}
	}
}

// TestApprovalsSandbox: the same commands reach a sandbox's supervisor
// with --sandbox N: a request of `moat sandbox exec` is held, its
// principal names the sandbox, and it reaches the provider only once
// approved; a denied one never does; a substitution during a pending
// approval is refused and never reaches the provider, while the
// approved request does, once.
func TestApprovalsSandbox(t *testing.T) {
	e := newEnv(t)
	p, err := fakeprovider.Start(fakeprovider.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	pol := e.policy(fmt.Sprintf(`inference:
  max_requests: 8
  providers:
    - name: anthropic
      api: anthropic-messages
      base_url: http://127.0.0.1:%d
      credential_env: E2E_ANTHROPIC_KEY
      models: [claude-e2e, claude-e2f]
approvals:
  timeout: 60s
  rules:
    - {road: inference, provider: anthropic}
`, p.Port()))
	create := e.command("sandbox", "create", "appr", "--policy", pol)
	create.Env = append(create.Env, "E2E_ANTHROPIC_KEY="+anthropicCred)
	if out, err := create.CombinedOutput(); err != nil {
		t.Fatalf("sandbox create: %v\n%s", err, out)
	}
	t.Cleanup(func() { e.moat("sandbox", "delete", "appr") })
	// The approvals commands find no held request yet.
	if r := e.moat("approvals", "list", "--sandbox", "appr"); r.code != 0 || !strings.Contains(r.stdout, "no request is held") {
		t.Fatalf("approvals list: %s", r)
	}
	execModel := func(model string) <-chan result {
		ch := make(chan result, 1)
		go func() { ch <- e.moat("sandbox", "exec", "appr", "--", e.probe, helperArg, "infer="+model) }()
		return ch
	}
	exec := func() <-chan result { return execModel("claude-e2e") }
	heldN := func(n int) []heldJSON {
		var l []heldJSON
		waitFor(t, "held requests", 30*e2eSecond, func() bool {
			r := e.moat("approvals", "list", "--sandbox", "appr", "-o", "json")
			l = nil
			json.Unmarshal([]byte(r.stdout), &l)
			return len(l) == n
		})
		return l
	}
	held := func() heldJSON { return heldN(1)[0] }
	res := exec()
	h := held()
	if !strings.Contains(h.PrincipalLine, "sandbox=appr") || p.Count() != 0 {
		t.Fatalf("held %+v, provider saw %d", h, p.Count())
	}
	if r := e.moat("approvals", "approve", h.ID, "--digest", h.RequestSHA256, "--sandbox", "appr"); r.code != 0 {
		t.Fatalf("approve: %s", r)
	}
	if r := <-res; !strings.Contains(r.stdout, "infer=claude-e2e ok status 200") {
		t.Fatalf("approved exec: %s", r)
	}
	res = exec()
	h = held()
	if r := e.moat("approvals", "deny", h.ID, "--sandbox", "appr"); r.code != 0 {
		t.Fatalf("deny: %s", r)
	}
	if r := <-res; !strings.Contains(r.stdout, "the operator denied this request") {
		t.Fatalf("denied exec: %s", r)
	}
	if n := p.Count(); n != 1 {
		t.Errorf("provider saw %d requests, want the approved one", n)
	}

	// Substitution during a pending approval: while A waits, another
	// request B (other bytes) is held too; approving B with the digest
	// the operator saw for A refuses B, which never reaches the provider;
	// A, approved with its own digest, does, once.
	resA := execModel("claude-e2e")
	a := held()
	resB := execModel("claude-e2f")
	l := heldN(2)
	bh := l[0]
	if bh.ID == a.ID {
		bh = l[1]
	}
	if r := e.moat("approvals", "approve", bh.ID, "--digest", a.RequestSHA256, "--sandbox", "appr"); r.code != 125 || !strings.Contains(r.stderr, "substitution") {
		t.Errorf("approving B with A's digest: %s", r)
	}
	if r := <-resB; !strings.Contains(r.stdout, "infer=claude-e2f err status 403") {
		t.Errorf("substituted request: %s", r)
	}
	if r := e.moat("approvals", "approve", a.ID, "--digest", a.RequestSHA256, "--sandbox", "appr"); r.code != 0 {
		t.Fatalf("approve A: %s", r)
	}
	if r := <-resA; !strings.Contains(r.stdout, "infer=claude-e2e ok status 200") {
		t.Errorf("approved A: %s", r)
	}
	reqs := p.Requests()
	if len(reqs) != 2 || sha256hex(reqs[1].Body) != a.RequestSHA256 {
		t.Errorf("provider saw %d requests; want 2, the last A's bytes", len(reqs))
	}
	for _, r := range reqs {
		if strings.Contains(string(r.Body), "claude-e2f") {
			t.Errorf("the substituted request reached the provider: %s", r.Body)
		}
	}
}

// TestRootApprovalsPeerRefused: the run's control socket answers only its
// owner (or root). With the run directory and the socket opened to all
// (so that only the peer credential check stands), moat approvals run as
// uid 65534 gets no answer and decides nothing; the same command as root
// (control) denies the held request.
func TestRootApprovalsPeerRefused(t *testing.T) {
	testenv.NeedRoot(t)
	e := newEnv(t)
	p := newProvider(t, false)
	pol := e.policy(fmt.Sprintf(`inference:
  max_requests: 8
  providers:
    - name: anthropic
      api: anthropic-messages
      base_url: http://127.0.0.1:%d
      credential_env: E2E_ANTHROPIC_KEY
      models: [claude-e2e]
approvals:
  timeout: 60s
  rules:
    - {road: inference}
`, p.Port()))
	ri := filepath.Join(e.dir, "run-info.json")
	cmd := e.command("run", "--policy", pol, "--run-info", ri, "--", e.probe, helperArg, "infer=claude-e2e")
	cmd.Env = append(cmd.Env, "E2E_ANTHROPIC_KEY="+anthropicCred)
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-done })
	waitFor(t, "run info", 60*e2eSecond, func() bool { _, err := os.Stat(ri); return err == nil })
	var info struct {
		Journal string `json:"journal"`
	}
	b, _ := os.ReadFile(ri)
	json.Unmarshal(b, &info)
	runDir := filepath.Dir(info.Journal)
	sock := filepath.Join(runDir, "control.sock")
	var l []heldJSON
	waitFor(t, "a held request", 30*e2eSecond, func() bool {
		r := e.moat("approvals", "list", "--run", runDir, "-o", "json")
		l = nil
		json.Unmarshal([]byte(r.stdout), &l)
		return len(l) == 1
	})
	for _, d := range []string{e.auditDir, runDir} {
		os.Chmod(d, 0o755)
	}
	os.Chmod(sock, 0o666)
	other := e.command("approvals", "deny", l[0].ID, "--run", runDir)
	other.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := other.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "without an answer") {
		t.Fatalf("deny as uid 65534: %v\n%s", err, out)
	}
	if r := e.moat("approvals", "list", "--run", runDir, "-o", "json"); !strings.Contains(r.stdout, l[0].ID) {
		t.Fatalf("the request is no longer held after another user's deny: %s", r)
	}
	if r := e.moat("approvals", "deny", l[0].ID, "--run", runDir); r.code != 0 {
		t.Fatalf("deny as root: %s", r)
	}
	select {
	case <-done:
	case <-time.After(60 * e2eSecond):
		t.Fatal("moat run did not end")
	}
	if !strings.Contains(so.String(), "the operator denied this request") || p.Count() != 0 {
		t.Errorf("workload: %s; provider saw %d", so.String(), p.Count())
	}
}
