//go:build linux

package evidence

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/moat-sandbox/moat/broker"
	"github.com/moat-sandbox/moat/internal/fakeprovider"
	"github.com/moat-sandbox/moat/internal/ledger"
)

// faultsProviderKeyEnv carries the fake provider's credential to the
// supervisors (they inherit moat sandbox create's environment).
const faultsProviderKeyEnv = "MOAT_FAULTS_PROVIDER_KEY"

// brokerRun is one broker case's scratch state.
type brokerRun struct {
	ctx      context.Context
	bin      string // the moat binary under test
	work     string
	state    string
	worker   string // the copy of bin the workloads run
	dir      string // the case's bundle directory
	h        *BrokerFaultHost
	t0       time.Time
	provider *fakeprovider.Server
	cmdOut   strings.Builder
	mu       sync.Mutex
}

// moat runs a moat command (binary bin) with the case's state directory
// and env added; it returns the output and exit code (-1: not started).
func (r *brokerRun) moat(bin string, env []string, args ...string) (string, int) {
	ctx, cancel := context.WithTimeout(r.ctx, 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = r.work
	cmd.Env = append(append(os.Environ(), "MOAT_STATE_DIR="+r.state, faultsProviderKeyEnv+"=faults-fake-key"), env...)
	var b capBuffer
	cmd.Stdout, cmd.Stderr = &b, &b
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return b.String(), ee.ExitCode()
	case err != nil:
		return err.Error(), -1
	}
	return b.String(), 0
}

// note keeps a command's outcome as supporting output.
func (r *brokerRun) note(what, out string, code int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmdOut.Len() < 16<<10 {
		fmt.Fprintf(&r.cmdOut, "%s: exit %d: %.600s\n", what, code, strings.TrimSpace(out))
	}
}

// policy writes sandbox name's policy: the workload binary's directory
// read-only, its own workspace, the fake provider with maxReq requests,
// and an approval rule for every inference request when approvals.
func (r *brokerRun) policy(name string, maxReq int, approvals bool) (string, error) {
	ws := filepath.Join(r.work, "ws-"+name)
	if err := os.MkdirAll(ws, 0o755); err != nil {
		return "", err
	}
	if os.Geteuid() == 0 {
		os.Chown(ws, 65534, 65534)
	}
	y := fmt.Sprintf(`version: 1
backend: native
filesystem:
  read_only: [/usr, /bin, /lib, /lib64, %s]
  read_write: [%s]
process:
  env: {PATH: /usr/bin:/bin}
inference:
  max_requests: %d
  max_output_tokens: 1024
  providers:
    - name: anthropic
      api: anthropic-messages
      base_url: http://127.0.0.1:%d
      credential_env: %s
      models: [%s]
audit:
  dir: %s
`, filepath.Dir(r.worker), ws, maxReq, r.provider.Port(), faultsProviderKeyEnv, faultModel, filepath.Join(r.work, "audit"))
	if approvals {
		y += "approvals:\n  timeout: 60s\n  rules:\n    - {road: inference, provider: anthropic}\n"
	}
	p := filepath.Join(r.work, name+".yaml")
	return p, os.WriteFile(p, []byte(y), 0o644)
}

type faultSandbox struct {
	Journal       string `json:"journal"`
	PublicKey     string `json:"public_key"`
	KeyID         string `json:"keyid"`
	SupervisorPID int    `json:"supervisor_pid"`
}

func (r *brokerRun) get(bin, name string) (faultSandbox, error) {
	var sv faultSandbox
	out, code := r.moat(bin, nil, "sandbox", "get", name, "-o", "json")
	if code != 0 {
		return sv, fmt.Errorf("moat sandbox get %s exited %d: %.400s", name, code, out)
	}
	return sv, json.Unmarshal([]byte(out), &sv)
}

// startWorker starts the workload in sandbox name: the faults worker with conc
// goroutines, at most max requests, text in each.
func (r *brokerRun) startWorker(bin, name string, conc, max int, text string) (*exec.Cmd, *capBuffer, error) {
	cmd := exec.CommandContext(r.ctx, bin, "sandbox", "exec", name, "--", r.worker, FaultsWorkerHelper, strconv.Itoa(conc), strconv.Itoa(max), faultModel, text)
	cmd.Dir, cmd.Env = r.work, append(os.Environ(), "MOAT_STATE_DIR="+r.state)
	var b capBuffer
	cmd.Stdout, cmd.Stderr = &b, &b
	return cmd, &b, cmd.Start()
}

// collect copies sandbox name's journal and key into the case directory,
// as moat left them, and runs moat audit verify (bin) on the copy, pinned
// to the key moat's state names.
func (r *brokerRun) collect(name string, sv faultSandbox) {
	r.h.Sandboxes = append(r.h.Sandboxes, name)
	r.h.AuditVerify[name] = -1
	jb, jerr := os.ReadFile(sv.Journal)
	pb, perr := os.ReadFile(sv.PublicKey)
	if jerr != nil || perr != nil {
		return
	}
	jp, pp := filepath.Join(r.dir, brokerJournalFile(name)), filepath.Join(r.dir, brokerPubkeyFile(name))
	os.WriteFile(jp, jb, 0o644)
	os.WriteFile(pp, pb, 0o644)
	args := []string{"audit", "verify", jp, "--pubkey", pp}
	if sv.KeyID != "" {
		args = append(args, "--key-fingerprint", sv.KeyID)
	}
	out, code := r.moat(r.bin, nil, args...)
	r.h.AuditVerify[name] = code
	out = strings.TrimSpace(out)
	if len(out) > 2048 {
		out = out[:2048]
	}
	r.h.AuditVerifyOutput[name] = out
}

// copyLedger copies the root sandbox's ledger.json into the case
// directory.
func (r *brokerRun) copyLedger(root string) {
	r.h.Root = root
	if b, err := os.ReadFile(filepath.Join(r.state, "sandboxes", root, ledger.File)); err == nil {
		os.WriteFile(filepath.Join(r.dir, FileFaultLedger), b, 0o644)
	}
}

func (r *brokerRun) ms() int64 { return time.Since(r.t0).Milliseconds() }

// runBrokerCase runs one workers, interrupt or approval case; everything
// is recorded in the returned host record and the files beside it.
func runBrokerCase(ctx context.Context, o Options, work, dir string, c FaultCase) (h BrokerFaultHost) {
	h = BrokerFaultHost{Sandboxes: []string{}, AuditVerify: map[string]int{}, AuditVerifyOutput: map[string]string{}, Provider: []ProviderHit{}, Stage: c.Stage}
	if c.Hooks && o.HooksBinary == "" {
		h.Precondition = faultHooksNotApplicable
		return h
	}
	r := &brokerRun{ctx: ctx, bin: o.Binary, work: work, state: filepath.Join(work, "state"), dir: dir, h: &h, t0: time.Now()}
	binDir := filepath.Join(work, "bin")
	for _, d := range []string{r.state, binDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			h.Precondition = err.Error()
			return h
		}
	}
	os.Chmod(work, 0o755)
	r.worker = filepath.Join(binDir, "moat")
	if err := copyFile(o.Binary, r.worker, 0o755); err != nil {
		h.Precondition = "copying the workload binary: " + err.Error()
		return h
	}
	p, err := fakeprovider.Start(fakeprovider.Options{})
	if err != nil {
		h.Precondition = err.Error()
		return h
	}
	r.provider = p
	switch c.Kind {
	case FaultKindWorkers:
		r.workers()
	case FaultKindInterrupt:
		r.interrupt(o.HooksBinary, c.Stage)
	case FaultKindApproval:
		r.approval()
	default:
		h.Precondition = "unknown case kind " + c.Kind
	}
	p.Close()
	for _, q := range p.Requests() {
		sum := sha256.Sum256(q.Body)
		h.Provider = append(h.Provider, ProviderHit{Path: q.Path, BodySHA256: hex.EncodeToString(sum[:]), PreEffect: string(q.PreEffect)})
	}
	h.CommandsOutput = r.cmdOut.String()
	if ctx.Err() != nil && h.Precondition == "" {
		h.Precondition = "interrupted"
	}
	return h
}

// cleanup deletes the sandboxes (even after an interrupt).
func (r *brokerRun) cleanup(bin string, names ...string) {
	for _, n := range names {
		dctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		cmd := exec.CommandContext(dctx, bin, "sandbox", "delete", n, "--ignore-not-found")
		cmd.Dir, cmd.Env = r.work, append(os.Environ(), "MOAT_STATE_DIR="+r.state)
		cmd.Run()
		cancel()
	}
}

// workers: a parent budget of faultWorkersBudget requests, eight children
// each running faultWorkersConc workers at once until refused.
func (r *brokerRun) workers() {
	h := r.h
	h.Budget = faultWorkersBudget
	names := []string{"p"}
	defer func() {
		// Children first: a parent is not deleted under its children.
		for i := len(names) - 1; i >= 0; i-- {
			r.cleanup(r.bin, names[i])
		}
	}()
	pol, err := r.policy("p", faultWorkersBudget, false)
	if err != nil {
		h.Precondition = err.Error()
		return
	}
	if out, code := r.moat(r.bin, nil, "sandbox", "create", "p", "--policy", pol); code != 0 {
		h.Precondition = fmt.Sprintf("moat sandbox create p exited %d: %.400s", code, out)
		return
	}
	for i := range faultWorkersChildren {
		n := fmt.Sprintf("w%d", i)
		pol, err := r.policy(n, 4*faultWorkersBudget, false)
		if err != nil {
			h.Precondition = err.Error()
			return
		}
		out, code := r.moat(r.bin, nil, "sandbox", "create", n, "--policy", pol, "--parent", "p")
		if code != 0 {
			h.Precondition = fmt.Sprintf("moat sandbox create %s --parent p exited %d: %.400s", n, code, out)
			return
		}
		names = append(names, n)
	}
	type run struct {
		cmd *exec.Cmd
		out *capBuffer
	}
	runs := make([]run, 0, faultWorkersChildren)
	for _, n := range names[1:] {
		cmd, out, err := r.startWorker(r.bin, n, faultWorkersConc, 4*faultWorkersBudget, n)
		if err != nil {
			h.Precondition = "moat sandbox exec: " + err.Error()
			return
		}
		runs = append(runs, run{cmd, out})
	}
	var wo strings.Builder
	for i, x := range runs {
		x.cmd.Wait()
		fmt.Fprintf(&wo, "== %s (exit %d)\n%.2000s\n", names[i+1], x.cmd.ProcessState.ExitCode(), x.out.String())
	}
	h.WorkloadOutput = wo.String()
	if r.ctx.Err() != nil {
		return
	}
	r.copyLedger("p")
	for _, n := range names[1:] {
		sv, err := r.get(r.bin, n)
		if err != nil {
			h.Precondition = err.Error()
			return
		}
		out, code := r.moat(r.bin, nil, "sandbox", "delete", n)
		r.note("moat sandbox delete "+n, out, code)
		r.collect(n, sv)
	}
}

// interrupt: one sandbox of the hooks binary whose broker stops at stage
// on the second request (the first is the control); moat (its
// supervisor) is then killed.
func (r *brokerRun) interrupt(hooks, stage string) {
	h := r.h
	defer r.cleanup(hooks, "x")
	pol, err := r.policy("x", 8, false)
	if err != nil {
		h.Precondition = err.Error()
		return
	}
	marker := filepath.Join(r.work, "fault.marker")
	env := []string{broker.FaultStageEnv + "=" + stage, broker.FaultMarkerEnv + "=" + marker, broker.FaultSkipEnv + "=1"}
	if out, code := r.moat(hooks, env, "sandbox", "create", "x", "--policy", pol); code != 0 {
		h.Precondition = fmt.Sprintf("moat sandbox create (hooks binary, %s) exited %d: %.400s", strings.Join(env, " "), code, out)
		return
	}
	sv, err := r.get(hooks, "x")
	if err != nil || sv.SupervisorPID <= 0 {
		h.Precondition = fmt.Sprintf("the sandbox's supervisor was not found: %v", err)
		return
	}
	h.SupervisorPID = sv.SupervisorPID
	svStart := procStartTime(sv.SupervisorPID)
	cmd, wout, err := r.startWorker(hooks, "x", 1, 2, "x")
	if err != nil {
		h.Precondition = "moat sandbox exec: " + err.Error()
		return
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
		h.WorkloadOutput = wout.String()
	}()
	for deadline := time.Now().Add(90 * time.Second); time.Now().Before(deadline) && r.ctx.Err() == nil; time.Sleep(20 * time.Millisecond) {
		if b, err := os.ReadFile(marker); err == nil {
			h.Marker, h.MarkerMS = strings.TrimSpace(string(b)), r.ms()
			break
		}
	}
	if h.MarkerMS == 0 {
		h.Precondition = fmt.Sprintf("the fault hook never reported stopping at %s within 90 s", stage)
		if procStartTime(sv.SupervisorPID) == svStart {
			syscall.Kill(sv.SupervisorPID, syscall.SIGKILL)
		}
		return
	}
	// The hook raises SIGSTOP on itself after writing the marker.
	for deadline := time.Now().Add(10 * time.Second); procStateLetter(sv.SupervisorPID) != "T" && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
	}
	h.SupervisorState = procStateLetter(sv.SupervisorPID)
	if procStartTime(sv.SupervisorPID) != svStart {
		h.SignalError = "the supervisor is gone (its pid has another start time)"
		return
	}
	h.SignalMS = r.ms()
	if err := syscall.Kill(sv.SupervisorPID, syscall.SIGKILL); err != nil {
		h.SignalError = err.Error()
	}
	for deadline := time.Now().Add(15 * time.Second); procStartTime(sv.SupervisorPID) == svStart && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	r.copyLedger("x")
	r.collect("x", sv)
}

// approval: two requests held for approval in one sandbox; A's digest is
// presented for B (a substitution), A is approved, then approved again (a
// replay).
func (r *brokerRun) approval() {
	h := r.h
	defer r.cleanup(r.bin, "a")
	pol, err := r.policy("a", 8, true)
	if err != nil {
		h.Precondition = err.Error()
		return
	}
	if out, code := r.moat(r.bin, nil, "sandbox", "create", "a", "--policy", pol); code != 0 {
		h.Precondition = fmt.Sprintf("moat sandbox create a exited %d: %.400s", code, out)
		return
	}
	type held struct {
		ID            string `json:"id"`
		RequestSHA256 string `json:"request_sha256"`
	}
	heldN := func(n int) []held {
		for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline) && r.ctx.Err() == nil; time.Sleep(100 * time.Millisecond) {
			out, code := r.moat(r.bin, nil, "approvals", "list", "--sandbox", "a", "-o", "json")
			var l []held
			if code == 0 && json.Unmarshal([]byte(out), &l) == nil && len(l) == n {
				return l
			}
		}
		return nil
	}
	var wo strings.Builder
	wait := func(name string, cmd *exec.Cmd, out *capBuffer) {
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(90 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		fmt.Fprintf(&wo, "== %s (exit %d)\n%.2000s\n", name, cmd.ProcessState.ExitCode(), out.String())
	}
	cmdA, outA, err := r.startWorker(r.bin, "a", 1, 1, "request A")
	if err != nil {
		h.Precondition = "moat sandbox exec: " + err.Error()
		return
	}
	defer func() { cmdA.Process.Kill() }()
	l := heldN(1)
	if len(l) != 1 {
		h.Precondition = "request A was not held for approval within 60 s"
		wait("A", cmdA, outA)
		h.WorkloadOutput = wo.String()
		return
	}
	h.ApprovalA, h.DigestA = l[0].ID, l[0].RequestSHA256
	cmdB, outB, err := r.startWorker(r.bin, "a", 1, 1, "request B, changed")
	if err != nil {
		h.Precondition = "moat sandbox exec: " + err.Error()
		return
	}
	defer func() { cmdB.Process.Kill() }()
	l = heldN(2)
	for _, x := range l {
		if x.ID != h.ApprovalA {
			h.ApprovalB, h.DigestB = x.ID, x.RequestSHA256
		}
	}
	if h.ApprovalB == "" {
		h.Precondition = "request B was not held for approval within 60 s"
		return
	}
	// The operator's approval of A (its digest) presented for B.
	out, code := r.moat(r.bin, nil, "approvals", "approve", h.ApprovalB, "--digest", h.DigestA, "--sandbox", "a")
	h.SubstituteExit = code
	r.note("approve B with A's digest", out, code)
	wait("B", cmdB, outB)
	out, code = r.moat(r.bin, nil, "approvals", "approve", h.ApprovalA, "--digest", h.DigestA, "--sandbox", "a")
	h.ApproveExit = code
	r.note("approve A", out, code)
	wait("A", cmdA, outA)
	out, code = r.moat(r.bin, nil, "approvals", "approve", h.ApprovalA, "--digest", h.DigestA, "--sandbox", "a")
	h.ReplayExit = code
	r.note("approve A again", out, code)
	h.WorkloadOutput = wo.String()
	sv, err := r.get(r.bin, "a")
	if err != nil {
		h.Precondition = err.Error()
		return
	}
	out, code = r.moat(r.bin, nil, "sandbox", "delete", "a")
	r.note("moat sandbox delete a", out, code)
	r.collect("a", sv)
}
