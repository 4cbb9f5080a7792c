package evidence

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/moat-sandbox/moat/internal/runinfo"
)

// runInfo is moat's --run-info file, the type moat writes it with.
type runInfo = runinfo.Info

// caseRun is one case's live resources.
type caseRun struct {
	s          *suite
	c          Case
	dir        string // cases/<name> in the bundle
	sdir       string // scratch
	workspace  string
	auditDir   string
	host       HostRecord
	recv       *Receivers
	redirect   *Receivers
	prov       *Provider
	fault      *faultStorage
	startTimes map[int]string
	// Set by setupHostCase for the cases with host checks.
	extraRO   []string   // read-only grants beyond the system ones
	target    string     // the probe's --target
	laterRuns []byte     // later-runs.out
	podPids   []int      // kubernetes: the Pod's processes on this host
	tool      *toolRun   // the tool cases' (tools.go)
	egress    *egressRun // the egress case's (egress.go)
}

func (s *suite) runCase(ctx context.Context, c Case) (CaseReport, error) {
	r := &caseRun{s: s, c: c, dir: filepath.Join(s.Out, CasesDir, c.Name), sdir: filepath.Join(s.scratch, c.Name),
		host: HostRecord{ExitCode: -1, Missing: []string{}, Notes: []string{}}}
	for _, d := range []string{r.dir, r.sdir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return CaseReport{}, err
		}
	}
	os.Chmod(r.sdir, 0o755)
	if err := r.execute(ctx); err != nil {
		r.host.Missing = append(r.host.Missing, "harness: "+err.Error())
	}
	r.close()
	hb, err := json.MarshalIndent(r.host, "", "  ")
	if err != nil {
		return CaseReport{}, err
	}
	if err := os.WriteFile(filepath.Join(r.dir, FileHost), append(hb, '\n'), 0o644); err != nil {
		return CaseReport{}, err
	}
	obs, err := ObserveCase(r.dir, c)
	if err != nil {
		return CaseReport{}, fmt.Errorf("BUG: observing own files: %w", err)
	}
	outcome, reasons := Score(c, obs)
	out, _ := os.ReadFile(filepath.Join(r.dir, FileProbeOut))
	cr := CaseReport{Name: c.Name, Outcome: outcome, Reasons: reasons, Observations: obs, ProbeClaims: ParseClaims(out)}
	if pb, err := os.ReadFile(filepath.Join(r.dir, FilePublicKey)); err == nil {
		if pub, err := parsePublicKeyPEM(pb); err == nil {
			cr.AuditKeyID = keyIDOf(pub)
		}
	}
	return cr, nil
}

func (r *caseRun) close() {
	if r.prov != nil {
		r.prov.Close()
	}
	if r.recv != nil {
		r.recv.Close()
	}
	if r.redirect != nil {
		r.redirect.Close()
	}
	if r.tool != nil && r.tool.url != nil {
		r.tool.url.Close()
	}
	if r.egress != nil {
		r.egress.close()
	}
	if r.fault != nil {
		if err := r.fault.unmount(); err != nil {
			r.host.Notes = append(r.host.Notes, "unmount fault tmpfs: "+err.Error())
		}
	}
}

// execute runs the case; an error is recorded as missing evidence.
func (r *caseRun) execute(ctx context.Context) error {
	r.workspace = filepath.Join(r.sdir, "workspace")
	r.auditDir = filepath.Join(r.sdir, "audit")
	if err := os.Mkdir(r.workspace, 0o755); err != nil {
		return err
	}
	if os.Geteuid() == 0 {
		// As root the workload runs as host uid workloadUID (native:
		// process.host_uid; gVisor: process.uid); the workspace is theirs.
		if err := os.Chown(r.workspace, workloadUID, workloadUID); err != nil {
			return err
		}
	}
	if r.c.StorageFault {
		fs, err := mountFaultStorage(r.auditDir)
		if err != nil {
			r.host.Missing = append(r.host.Missing, err.Error())
			return nil // invalid, never pass; moat is not run
		}
		r.fault = fs
	} else if err := os.Mkdir(r.auditDir, 0o700); err != nil {
		return err
	}

	if err := r.setupHostCase(); err != nil {
		return err
	}
	if err := r.setupTool(); err != nil {
		return err
	}
	if ok, err := r.setupEgress(); !ok || err != nil {
		return err // a missing precondition is recorded: invalid, moat is not run
	}
	var err error
	recvHost := "127.0.0.1"
	if r.s.kube != nil {
		// A Pod's loopback is its own: the receivers listen where the
		// Pod reaches this host.
		a, err := kubeHostAddress(ctx, r.s.kube)
		if err != nil {
			return err
		}
		recvHost = a.String()
	}
	if r.recv, err = StartReceiversAt(filepath.Join(r.dir, FileReceiverEvents), recvHost); err != nil {
		return err
	}
	if err := r.recv.Control(RecvTCP, RecvUDP, RecvAbstract); err != nil {
		return err
	}
	r.prov = &Provider{Credentials: r.s.creds, Mode: r.c.Provider, OpenSSL: r.s.openssl}
	if r.c.Provider == ProviderRedirect {
		if r.redirect, err = StartRedirectTarget(filepath.Join(r.dir, FileRedirectEvents)); err != nil {
			return err
		}
		if err := r.redirect.Control(RecvRedirect); err != nil {
			return err
		}
		r.prov.RedirectURL = "http://" + r.redirect.TCPAddr + "/v1/messages"
	}
	if err := r.prov.Start(filepath.Join(r.dir, FileProviderEvents), r.sdir); err != nil {
		return err
	}
	if r.s.openssl == "" {
		r.host.Missing = append(r.host.Missing, "openssl not found: pre-effect records cannot be verified with openssl")
	}
	pol := r.policy()
	polPath := filepath.Join(r.sdir, FilePolicy)
	if err := os.WriteFile(polPath, pol, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(r.dir, FilePolicy), pol, 0o644); err != nil {
		return err
	}
	if err := r.runMoat(ctx, polPath); err != nil {
		return err
	}
	return r.finishHostCase(ctx, polPath)
}

// workloadUID is the workload's uid inside and, when the suite runs as
// root, on the host: the same for every backend.
const workloadUID = 65534

// policy is the case's policy: system directories and the probe read-only,
// the workspace read-write, the synthetic provider for both API families.
func (r *caseRun) policy() []byte {
	var ro []string
	for _, d := range systemReadOnly {
		if _, err := os.Stat(d); err == nil && r.s.kube == nil {
			// (A Pod's system directories are its image's read-only
			// root; as hostPath grants the host's /usr would hide the
			// image's moat.)
			ro = append(ro, d)
		}
	}
	ro = append(ro, r.s.binDir)
	ro = append(ro, r.extraRO...)
	max := r.c.MaxRequests
	if max == 0 {
		max = DefaultMaxRequests
	}
	// The backend is chosen with --backend on the command line, which
	// overrides the policy's and never falls back.
	tools := r.toolPolicy(ro[:len(ro)-1-len(r.extraRO)]) + r.egressPolicy()
	return []byte(fmt.Sprintf(`version: 1
filesystem:
  read_only: [%s]
  read_write: [%s]
process:
  uid: %d
  host_uid: %d
  env: {PATH: /usr/bin:/bin}
inference:
  max_requests: %d
  max_output_tokens: 1024
  providers:
    - name: anthropic
      api: anthropic-messages
      base_url: %s
      credential_env: %s
      models: [%s]
    - name: openai
      api: openai-chat
      base_url: %s
      credential_env: %s
      models: [%s]
audit:
  dir: %s
%s%s`, strings.Join(ro, ", "), r.workspace, workloadUID, workloadUID, max, r.prov.URL(), CredEnvAnthropic, ModelAnthropic,
		r.prov.URL(), CredEnvOpenAI, ModelOpenAI, r.auditDir, tools, r.kubernetesPolicy()))
}

// Marker files the controller writes in the workspace for the probe.
const (
	goMarker        = ".moat-evidence-go"
	faultMarkerName = ".moat-evidence-fault"
)

// moatArgs is the `moat run` command line of the case's run number run.
func (r *caseRun) moatArgs(polPath, riPath string, run int) []string {
	args := []string{"run", "--policy", polPath, "--run-info", riPath}
	if r.s.Backend != "" {
		args = append(args, "--backend", r.s.Backend)
	}
	args = append(append(args, "--"), r.s.workloadArgv()...)
	args = append(args,
		"--model", ModelAnthropic, "--openai-model", ModelOpenAI,
		"--marker", filepath.Join(r.workspace, goMarker), "--fault-marker", filepath.Join(r.workspace, faultMarkerName),
		"--tcp", r.recv.TCPAddr, "--udp", r.recv.UDPAddr, "--abstract", r.recv.AbstractName,
		"--unix", filepath.Join(r.workspace, "recv.sock"), "--unixgram", filepath.Join(r.workspace, "recv.dgram"),
		"--workspace", r.workspace)
	if r.target != "" {
		args = append(args, "--target", r.target)
	}
	if r.tool != nil {
		args = append(args, "--tool-args", r.tool.args)
	}
	if r.egress != nil {
		args = append(args, "--egress-port", r.egress.port)
	}
	if run > 1 {
		args = append(args, "--run", strconv.Itoa(run))
	}
	return append(args, r.c.Name)
}

func (r *caseRun) runMoat(ctx context.Context, polPath string) error {
	riPath := filepath.Join(r.sdir, FileRunInfo)
	marker := filepath.Join(r.workspace, goMarker)
	faultMarker := filepath.Join(r.workspace, faultMarkerName)
	args := r.moatArgs(polPath, riPath, 1)
	cctx, cancel := context.WithTimeout(ctx, CaseTimeout)
	defer cancel()
	bin := r.s.Binary
	if r.egress != nil {
		bin = r.s.HooksBinary
	}
	cmd := exec.CommandContext(cctx, bin, args...)
	cmd.Dir = r.sdir
	cmd.Env = append(cleanEnv(), CredEnvAnthropic+"="+r.s.creds["anthropic"], CredEnvOpenAI+"="+r.s.creds["openai"])
	if r.tool != nil {
		cmd.Env = append(cmd.Env, r.tool.env...)
	}
	if r.egress != nil {
		cmd.Env = append(cmd.Env, r.egress.env()...)
	}
	var stdout, stderr capBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	defer func() {
		os.WriteFile(filepath.Join(r.dir, FileProbeOut), r.s.redact(stdout.Bytes()), 0o644)
		os.WriteFile(filepath.Join(r.dir, FileMoatErr), r.s.redact(stderr.Bytes()), 0o644)
	}()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", bin, err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	if r.tool != nil {
		r.tool.moatPID = cmd.Process.Pid
	}

	ri, riRaw, err := waitRunInfo(riPath, exited)
	var faultWG sync.WaitGroup
	if err == nil {
		r.host.RunInfo = true
		r.host.RunID, r.host.HostPID, r.host.WorkloadPID = ri.RunID, ri.HostPID, ri.WorkloadPID
		os.WriteFile(filepath.Join(r.dir, FileRunInfo), riRaw, 0o644)
		err = r.ready(ri)
		if err == nil {
			err = r.toolReady(ri)
		}
		if err == nil && r.tool != nil {
			faultWG.Add(1)
			go func() { defer faultWG.Done(); r.toolDuring(exited, cmd.Process) }()
		}
		if err == nil && r.fault != nil {
			faultWG.Add(1)
			go func() { defer faultWG.Done(); r.injectFault(exited, faultMarker) }()
		}
		if err == nil && r.host.Inotify != nil {
			faultWG.Add(1)
			go func() { defer faultWG.Done(); r.measureInotify(exited, ri) }()
		}
		if err == nil {
			err = os.WriteFile(marker, []byte("go\n"), 0o644)
		}
		if err != nil {
			cancel()
		}
	} else if !errors.Is(err, errNoRunInfo) {
		cancel()
	}
	<-exited
	faultWG.Wait()
	if cctx.Err() == context.DeadlineExceeded {
		r.host.TimedOut = true
		r.host.Missing = append(r.host.Missing, fmt.Sprintf("the run did not finish within %v", CaseTimeout))
	}
	var ee *exec.ExitError
	switch {
	case waitErr == nil:
		r.host.ExitCode = 0
	case errors.As(waitErr, &ee):
		r.host.ExitCode = ee.ExitCode()
	default:
		return fmt.Errorf("wait for moat: %w", waitErr)
	}
	if r.host.RunInfo {
		pids := append([]int{ri.HostPID, ri.WorkloadPID}, r.podPids...)
		observeCleanup(&r.host, pids, r.startTimes)
		if r.s.kube != nil {
			r.observePodGone(ctx, &r.host, ri.RunID)
		}
		if ri.Journal != "" {
			if err := copyFile(ri.Journal, filepath.Join(r.dir, FileJournal), 0o644); err != nil {
				r.host.Missing = append(r.host.Missing, "journal: "+err.Error())
			}
		}
	}
	r.finishTool()
	return err
}

// ready runs once moat is Ready: pin the key, observe the worker from the
// host, place the pathname receivers and pass every positive control.
func (r *caseRun) ready(ri runInfo) error {
	pub, err := parsePublicKeyPEM([]byte(ri.PublicKeyPEM))
	if err != nil {
		return fmt.Errorf("run info public key: %w", err)
	}
	if ri.KeyID != "" && ri.KeyID != keyIDOf(pub) {
		return fmt.Errorf("run info keyid %s is not its key's %s", ri.KeyID, keyIDOf(pub))
	}
	if err := r.prov.Pin(ri.RunID, pub); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(r.dir, FilePublicKey), publicKeyPEM(pub), 0o644); err != nil {
		return err
	}
	r.startTimes = map[int]string{ri.HostPID: procStart(ri.HostPID), ri.WorkloadPID: procStart(ri.WorkloadPID)}
	// Every process the run info names is observed: the workload, and the
	// sandbox's host process (under gVisor, the runsc sandbox).
	var pids []int
	for _, p := range []int{ri.WorkloadPID, ri.HostPID} {
		if p > 0 && !slices.Contains(pids, p) {
			pids = append(pids, p)
		}
	}
	if r.s.kube != nil {
		// No process in the Pod is a host process that the run info
		// names: the host's view is the Pod's processes on the node.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		r.podPids = r.observePod(ctx, ri.RunID)
		cancel()
		for _, p := range r.podPids {
			r.startTimes[p] = procStart(p)
		}
	} else {
		observeNamespaces(&r.host, pids)
	}
	if err := r.recv.PlaceUnix(r.workspace); err != nil {
		return err
	}
	return r.recv.Control(RecvUnix, RecvUnixgram)
}

// injectFault fills the audit tmpfs once the "before" control has been
// answered, then tells the probe to go on.
func (r *caseRun) injectFault(exited <-chan struct{}, faultMarker string) {
	for r.prov.Count() < 1 {
		select {
		case <-exited:
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
	time.Sleep(100 * time.Millisecond) // let the completion record land
	if err := r.fault.fill(); err != nil {
		r.host.Notes = append(r.host.Notes, "fill: "+err.Error())
		return
	}
	r.host.FaultInjected = true
	os.WriteFile(faultMarker, []byte("fault\n"), 0o644)
}

func waitRunInfo(path string, exited <-chan struct{}) (runInfo, []byte, error) {
	deadline := time.Now().Add(runInfoWait)
	for {
		if ri, b, err := runinfo.Read(path); err == nil {
			return ri, b, nil
		}
		select {
		case <-exited:
			return runInfo{}, nil, errNoRunInfo
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return runInfo{}, nil, fmt.Errorf("no run info after %v", runInfoWait)
		}
	}
}

// cleanEnv is the controller's environment without provider credentials
// and base URLs.
func cleanEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasSuffix(k, "_API_KEY"), strings.HasSuffix(k, "_BASE_URL"), strings.HasPrefix(k, "MOAT_EVIDENCE_"),
			strings.HasPrefix(k, "MOAT_TEST_"), strings.HasSuffix(k, "_PROXY"), strings.HasSuffix(k, "_proxy"):
			continue
		}
		out = append(out, kv)
	}
	return out
}

// workloadArgv is the command run in the sandbox before the probe's flags:
// the probe copy, or for the demo the moat copy and its hidden agent helper.
func (s *suite) workloadArgv() []string {
	if s.agentHelper != "" {
		return []string{s.probe, s.agentHelper}
	}
	return []string{s.probe}
}
