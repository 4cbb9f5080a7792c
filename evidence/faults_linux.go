//go:build linux

package evidence

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// faultSupervisorTimeout is process.supervisor_timeout in the faults
// cases' policy.
const faultSupervisorTimeout = 2 * time.Second

// FaultsResult is what RunFaults wrote.
type FaultsResult struct {
	Report         *FaultsReport
	ManifestSHA256 string
	SuitePublicKey []byte
}

// RunFaults runs the faults suite with o.Binary and writes its bundle to
// o.Out. o.Cases selects a subset of FaultCaseNames. A non-nil error is a
// harness error.
func RunFaults(ctx context.Context, o Options) (*FaultsResult, error) {
	if o.Progress == nil {
		o.Progress = discard{}
	}
	planned := FaultCaseNames()
	if len(o.Cases) > 0 {
		for _, n := range o.Cases {
			if _, ok := faultCaseByName(n); !ok {
				return nil, harnessf("unknown faults case %q (cases: %s)", n, strings.Join(FaultCaseNames(), ", "))
			}
		}
		planned = slices.DeleteFunc(planned, func(n string) bool { return !slices.Contains(o.Cases, n) })
	}
	var hooks *FileInfo
	if o.HooksBinary != "" {
		hsha, err := FileSHA256(o.HooksBinary)
		if err != nil {
			return nil, harnessf("hooks binary: %w", err)
		}
		hooks = &FileInfo{Path: o.HooksBinary, SHA256: hsha}
	}
	binSHA, err := FileSHA256(o.Binary)
	if err != nil {
		return nil, harnessf("moat binary: %w", err)
	}
	if o.ExpectedBinarySHA256 != "" && !strings.EqualFold(o.ExpectedBinarySHA256, binSHA) {
		return nil, harnessf("refused: moat binary %s has sha256 %s, not the expected %s", o.Binary, binSHA, o.ExpectedBinarySHA256)
	}
	out, err := filepath.Abs(o.Out)
	if err != nil {
		return nil, &HarnessError{Err: err}
	}
	if ents, err := os.ReadDir(out); err == nil && len(ents) > 0 {
		return nil, harnessf("refused: output directory %s is not empty; give a new directory", out)
	}
	if err := os.MkdirAll(filepath.Join(out, CasesDir), 0o755); err != nil {
		return nil, &HarnessError{Err: err}
	}
	// Short names: the sandbox's control socket lies under the state
	// directory, and a unix socket path is at most 107 bytes.
	scratch, err := os.MkdirTemp("", "mf-")
	if err != nil {
		return nil, &HarnessError{Err: err}
	}
	defer os.RemoveAll(scratch)
	os.Chmod(scratch, 0o755)
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, harnessf("suite key: %w", err)
	}
	rep := &FaultsReport{Suite: FaultsSuiteName, Version: FaultsReportVersion, Planned: planned,
		Complete: slices.Equal(planned, FaultCaseNames()), Cases: []FaultCaseReport{},
		Binary:  BinaryInfo{Path: o.Binary, SHA256: binSHA, ExpectedSHA: strings.ToLower(o.ExpectedBinarySHA256)},
		Fixture: FileInfo{SHA256: FaultsFixtureSHA256()}, HooksBinary: hooks,
		Kernel: kernelRelease(), Arch: runtime.GOARCH, ControllerUID: os.Geteuid(),
		Started: time.Now().UTC().Format(time.RFC3339Nano)}
	for i, name := range planned {
		c, _ := faultCaseByName(name)
		t0 := time.Now()
		dir := filepath.Join(out, CasesDir, name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			return nil, &HarnessError{Err: err}
		}
		var h any
		if c.Kind == FaultKindSupervisor {
			h = runFaultCase(ctx, o.Binary, filepath.Join(scratch, strconv.Itoa(i)), dir, c)
		} else {
			h = runBrokerCase(ctx, o, filepath.Join(scratch, strconv.Itoa(i)), dir, c)
		}
		hb, err := json.MarshalIndent(h, "", "  ")
		if err != nil {
			return nil, &HarnessError{Err: err}
		}
		if err := os.WriteFile(filepath.Join(dir, FileFaultHost), append(hb, '\n'), 0o644); err != nil {
			return nil, &HarnessError{Err: err}
		}
		obs, outcome, reasons, err := observeFaultCase(dir, c)
		if err != nil {
			return nil, harnessf("case %s: %w", name, err)
		}
		rep.Cases = append(rep.Cases, FaultCaseReport{Name: name, Outcome: outcome, Reasons: reasons, Observations: obs, DurationMS: time.Since(t0).Milliseconds()})
		fmt.Fprintf(o.Progress, "[%d/%d] %s … %s (%.1f s)\n", i+1, len(planned), name, outcome, time.Since(t0).Seconds())
		for _, r := range reasons {
			fmt.Fprintf(o.Progress, "        %s\n", r)
		}
		if ctx.Err() != nil {
			return nil, harnessf("interrupted")
		}
	}
	rep.Binary.SHA256End, _ = FileSHA256(o.Binary)
	rep.Binary.Unchanged = rep.Binary.SHA256End == binSHA
	rep.Finished = time.Now().UTC().Format(time.RFC3339Nano)
	msha, err := finishFaultsBundle(out, rep, priv)
	if err != nil {
		return nil, &HarnessError{Err: err}
	}
	return &FaultsResult{Report: rep, ManifestSHA256: msha, SuitePublicKey: []byte(rep.SuitePublicKey)}, nil
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// runFaultCase runs one supervisor-loss case: a moat sandbox with a 2s
// process.supervisor_timeout, a marked workload, a healthy-supervisor
// control past twice the timeout, the signal, samples until the
// workload's death, then the journal as moat left it. Everything is
// recorded in the returned FaultHost; the journal and key go to dir.
func runFaultCase(ctx context.Context, bin, work, dir string, c FaultCase) (h FaultHost) {
	h = FaultHost{SupervisorTimeoutMS: faultSupervisorTimeout.Milliseconds(), Signal: c.Signal, AuditVerifyExit: -1, Samples: []ProcSample{}}
	t0 := time.Now()
	ms := func() int64 { return time.Since(t0).Milliseconds() }
	ws, state := filepath.Join(work, "workspace"), filepath.Join(work, "state")
	for _, d := range []string{ws, state} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			h.Precondition = err.Error()
			return h
		}
	}
	os.Chmod(work, 0o755)
	if os.Geteuid() == 0 {
		// As root the workload runs as uid 65534 (DESIGN.md).
		os.Chown(ws, 65534, 65534)
	}
	pol := filepath.Join(work, "policy.yaml")
	y := fmt.Sprintf("version: 1\nbackend: native\nfilesystem:\n  read_only: [/usr, /bin, /lib, /lib64]\n  read_write: [%s]\nprocess:\n  supervisor_timeout: %s\n  env: {PATH: /usr/bin:/bin}\naudit:\n  dir: %s\n",
		ws, faultSupervisorTimeout, filepath.Join(work, "audit"))
	if err := os.WriteFile(pol, []byte(y), 0o644); err != nil {
		h.Precondition = err.Error()
		return h
	}
	moatCtx := func(ctx context.Context, args ...string) (string, int) {
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Dir, cmd.Env = work, append(os.Environ(), "MOAT_STATE_DIR="+state)
		var b capBuffer
		cmd.Stdout, cmd.Stderr = &b, &b
		err := cmd.Run()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return b.String(), ee.ExitCode()
		} else if err != nil {
			return err.Error(), -1
		}
		return b.String(), 0
	}
	moat := func(args ...string) (string, int) { return moatCtx(ctx, args...) }
	name := "f" + filepath.Base(work)
	if out, code := moat("sandbox", "create", "--name", name, "--policy", pol); code != 0 {
		h.Precondition = fmt.Sprintf("moat sandbox create exited %d: %.400s", code, out)
		return h
	}
	var sv struct {
		Journal       string `json:"journal"`
		PublicKey     string `json:"public_key"`
		KeyID         string `json:"keyid"`
		SupervisorPID int    `json:"supervisor_pid"`
	}
	svStart := ""
	defer func() {
		if sv.SupervisorPID > 0 && procStartTime(sv.SupervisorPID) == svStart {
			syscall.Kill(sv.SupervisorPID, syscall.SIGKILL)
		}
		// Even when the run was interrupted.
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		moatCtx(dctx, "sandbox", "delete", name)
	}()
	marker := "moat-faults-" + randHex(8)
	ex := exec.Command(bin, "sandbox", "exec", name, "--", "sh", "-c", "sleep 300 # "+marker)
	ex.Dir, ex.Env = work, append(os.Environ(), "MOAT_STATE_DIR="+state)
	if err := ex.Start(); err != nil {
		h.Precondition = "moat sandbox exec: " + err.Error()
		return h
	}
	defer func() { ex.Process.Kill(); ex.Wait() }()
	for deadline := time.Now().Add(20 * time.Second); h.WorkloadPID == 0 && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		for _, p := range pidsWithMarker(marker) {
			if p != ex.Process.Pid {
				h.WorkloadPID = p
			}
		}
	}
	out, code := moat("sandbox", "get", name, "-o", "json")
	if code != 0 || json.Unmarshal([]byte(out), &sv) != nil {
		h.Precondition = fmt.Sprintf("moat sandbox get exited %d: %.400s", code, out)
		return h
	}
	h.SupervisorPID, svStart = sv.SupervisorPID, procStartTime(sv.SupervisorPID)
	if h.WorkloadPID == 0 || sv.SupervisorPID == 0 {
		h.Precondition = fmt.Sprintf("workload pid %d or supervisor pid %d not found", h.WorkloadPID, sv.SupervisorPID)
		return h
	}
	h.WorkloadStart, h.ReadyMS = procStartTime(h.WorkloadPID), ms()
	sample := func() ProcSample {
		return ProcSample{TMS: ms(), WorkloadStart: procStartTime(h.WorkloadPID), SupervisorState: procStateLetter(sv.SupervisorPID)}
	}
	// Positive control: a healthy supervisor keeps the workload alive
	// past twice the timeout.
	for ms()-h.ReadyMS < 2*h.SupervisorTimeoutMS+500 && ctx.Err() == nil {
		h.Samples = append(h.Samples, sample())
		time.Sleep(250 * time.Millisecond)
	}
	if ctx.Err() != nil {
		h.Precondition = "interrupted"
		return h
	}
	sig := map[string]syscall.Signal{"SIGSTOP": syscall.SIGSTOP, "SIGKILL": syscall.SIGKILL}[c.Signal]
	h.SignalMS = ms()
	if err := syscall.Kill(sv.SupervisorPID, sig); err != nil {
		h.SignalError = err.Error()
	}
	for end := h.SignalMS + h.SupervisorTimeoutMS + faultDeathWait; ms() <= end+200 && ctx.Err() == nil; time.Sleep(100 * time.Millisecond) {
		s := sample()
		h.Samples = append(h.Samples, s)
		if s.WorkloadStart != h.WorkloadStart {
			break
		}
	}
	// Then the supervisor dies as a lost one would.
	syscall.Kill(sv.SupervisorPID, syscall.SIGKILL)
	for deadline := time.Now().Add(10 * time.Second); procStateLetter(sv.SupervisorPID) != "" && procStateLetter(sv.SupervisorPID) != "Z" && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
	}
	jb, jerr := os.ReadFile(sv.Journal)
	pb := []byte(sv.PublicKey)
	if st, err := os.Stat(sv.PublicKey); err == nil && st.Mode().IsRegular() {
		pb, _ = os.ReadFile(sv.PublicKey)
	}
	if jerr == nil && len(pb) > 0 {
		os.WriteFile(filepath.Join(dir, FileJournal), jb, 0o644)
		os.WriteFile(filepath.Join(dir, FilePublicKey), pb, 0o644)
		args := []string{"audit", "verify", filepath.Join(dir, FileJournal), "--pubkey", filepath.Join(dir, FilePublicKey)}
		if sv.KeyID != "" {
			// The run key as moat's own state names it.
			args = append(args, "--key-fingerprint", sv.KeyID)
		}
		vo, vc := moat(args...)
		h.AuditVerifyExit, h.AuditVerifyOutput = vc, string(bytes.TrimSpace([]byte(vo)))
		if len(h.AuditVerifyOutput) > 4096 {
			h.AuditVerifyOutput = h.AuditVerifyOutput[:4096]
		}
	}
	return h
}

// procStartTime is field 22 of /proc/pid/stat for a live process, "" for
// a missing or zombie one.
func procStartTime(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return ""
	}
	f := strings.Fields(s[i+2:])
	if len(f) < 20 || f[0] == "Z" {
		return ""
	}
	return f[19]
}

// procStateLetter is pid's state letter, "" when gone.
func procStateLetter(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return ""
	}
	return s[i+2 : i+3]
}

// pidsWithMarker are the host pids whose command line holds marker.
func pidsWithMarker(marker string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline"); err == nil && bytes.Contains(b, []byte(marker)) {
			pids = append(pids, pid)
		}
	}
	return pids
}
