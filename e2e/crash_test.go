//go:build linux

package e2e

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/internal/fakeprovider"
)

// TestCrashTrials kills `moat run` with SIGKILL at randomized points while
// its workload sends a stream of inference requests (three concurrent
// workers, 40 SDK requests each) through the broker to the e2e fake
// provider, which records every request with its Moat-Pre-Effect header.
// An unkilled control run comes first: it must pass every stage, verify
// complete, deliver all 120 requests, and show the leftover check the
// run's staging directory (and, as root, its two cgroups) while it runs;
// its stage times scale the kill delays. The kill points then cycle
// through four kinds, each with seeded random parameters (crashKillPoints):
// start-up, measurement, the moment moat makes something on the host, and
// mid-traffic. After each kill:
//
//   - `moat audit verify` (the binary, pinned with the key fingerprint from
//     the run info, or else the one moat printed on stderr, or else the
//     journal's keyid) exits 0 or 2, never 1;
//   - every request the provider received carries a Moat-Pre-Effect line
//     that is byte-identical to a complete line of that journal, verifies
//     under the run key, is an inference.requested record, and hashes the
//     body that arrived;
//   - the run's staging directory, its cgroups (as root, with limits) and
//     anything moat made in the workspace disappear (the reaper removes
//     them; polled, 30s bound);
//   - the next trial reuses the same workspace, so a leftover that makes
//     later runs refuse fails the trials that follow it.
//
// The number of trials is MOAT_CRASH_TRIALS; unset, it is 100 when CI=true
// and 10 otherwise. The seed is logged; MOAT_CRASH_SEED replays it. The
// first failing trial stops the test with the command that replays it.
// Measured on a loaded 2-core machine with go test -race: 10 trials take
// about 5 seconds, 100 trials well under 1 minute (about 20 seconds).
//
// Without root the cgroup checks have nothing to look at (moat makes no
// cgroups then); everything else is the same.
func TestCrashTrials(t *testing.T) {
	n := crashTrialCount(t)
	e := newEnv(t)
	ws := e.newWorkspace("crash-workspace")
	const workers, perWorker = 3, 40
	runCrashTrials(t, e, crashConfig{
		Trials: n,
		Seed:   crashSeed(t),
		Args: func(tr *crashTrial) []string {
			pol := crashPolicy(tr, ws, workers*perWorker+16)
			return append([]string{"run", "--policy", pol, "--run-info", tr.RunInfo, "--"}, crashWorkload(e, workers, perWorker)...)
		},
		Env:  []string{"E2E_ANTHROPIC_KEY=" + anthropicCred, "E2E_OPENAI_KEY=" + openaiCred},
		Kill: crashKillPoints(workers*perWorker, ws),
		Workspace: func(*crashTrial) string {
			return ws
		},
		Check: func(t *testing.T, tr *crashTrial) {
			// The control: unkilled, every request arrives and the
			// journal verifies complete.
			if tr.Kill.Never && len(tr.Seen) != workers*perWorker {
				t.Errorf("control: the provider received %d requests, want %d", len(tr.Seen), workers*perWorker)
			}
		},
	})
}

// crashTrialCount is MOAT_CRASH_TRIALS, else 100 in CI, else 10.
func crashTrialCount(t *testing.T) int {
	t.Helper()
	if s := os.Getenv("MOAT_CRASH_TRIALS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("MOAT_CRASH_TRIALS=%q: want a positive integer", s)
		}
		return n
	}
	if os.Getenv("CI") == "true" {
		return 100
	}
	return 10
}

// crashSeed is MOAT_CRASH_SEED, else the clock; it is logged either way.
func crashSeed(t *testing.T) int64 {
	t.Helper()
	if s := os.Getenv("MOAT_CRASH_SEED"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("MOAT_CRASH_SEED=%q: want an integer", s)
		}
		return n
	}
	return time.Now().UnixNano()
}

// crashPolicy writes trial tr's policy: the usual grants, ws read-write,
// memory and pids limits (so that, as root, moat makes cgroups), the
// trial's own audit directory, and the trial's provider.
func crashPolicy(tr *crashTrial, ws string, maxRequests int) string {
	y := fmt.Sprintf(`version: 1
filesystem:
  read_only: [/usr, /bin, /lib, /lib64, %s]
  read_write: [%s]
process:
  env: {PATH: /usr/bin:/bin}
  limits: {memory: 512Mi, pids: 256}
audit:
  dir: %s
inference:
  max_requests: %d
  max_output_tokens: 1024
  providers:
    - name: anthropic
      api: anthropic-messages
      base_url: http://127.0.0.1:%d
      credential_env: E2E_ANTHROPIC_KEY
      models: [claude-e2e]
    - name: openai
      api: openai-chat
      base_url: http://127.0.0.1:%d
      credential_env: E2E_OPENAI_KEY
      models: [gpt-e2e]
`, filepath.Dir(tr.env.probe), ws, tr.AuditDir, maxRequests, tr.Provider.Port(), tr.Provider.Port())
	p := filepath.Join(tr.Dir, "policy.yaml")
	if err := os.WriteFile(p, []byte(y), 0o644); err != nil {
		tr.t.Fatal(err)
	}
	return p
}

// crashWorkload is a shell starting workers concurrent probes, each making
// perWorker SDK requests (plain, streamed and OpenAI chat, in turn).
func crashWorkload(e *env, workers, perWorker int) []string {
	kinds := []string{"sdk-anthropic=claude-e2e", "sdk-anthropic-stream=claude-e2e", "sdk-openai-chat=gpt-e2e"}
	var script strings.Builder
	for w := range workers {
		script.WriteString(e.probe + " " + helperArg)
		for i := range perWorker {
			script.WriteString(" " + kinds[(w+i)%len(kinds)])
		}
		script.WriteString(" &\n")
	}
	script.WriteString("wait\n")
	return []string{"/bin/sh", "-c", script.String()}
}

// crashKill says when one trial kills moat: once After(tr) holds (polled
// from the moment moat was started; nil holds at once), Delay later. The
// zero crashKill never kills: the run ends on its own.
type crashKill struct {
	Phase string // a label for the log
	Note  string // what was drawn, for the log
	After func(tr *crashTrial) bool
	Delay time.Duration
	Never bool // do not kill (the control run)
	Spin  bool // poll After without pausing (for a window of a millisecond)
}

func (k crashKill) String() string {
	if k.Never {
		return "none"
	}
	return fmt.Sprintf("%s%s+%v", k.Phase, k.Note, k.Delay.Round(time.Microsecond))
}

// crashMilestones are when a run reached its stages, measured from moat's
// start; zero when it did not reach one.
type crashMilestones struct {
	Journal      time.Duration // the journal's first line (run.started) is durable
	RunInfo      time.Duration // the run info is written: confirmed, workload starting
	FirstRequest time.Duration // the provider received the first request
	End          time.Duration // moat exited (or was killed)
}

func (m crashMilestones) String() string {
	r := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
	return fmt.Sprintf("run.started %v, run info %v, first request %v, end %v", r(m.Journal), r(m.RunInfo), r(m.FirstRequest), r(m.End))
}

// crashChooser picks trial i's kill point, drawing only from rng so that a
// seed replays the same choices. ctl are the control run's milestones: the
// chooser scales its delays by them, so that the kills spread over the
// stages however fast this machine is.
type crashChooser func(rng *rand.Rand, i int, ctl crashMilestones) crashKill

// crashKillPoints cycles through four kinds of kill point, so that each
// gets its share of the trials however few there are: start-up (a delay
// from exec), measurement (a delay after run.started is durable), the
// moment moat makes something on the host (a staging directory, a cgroup,
// a measurement socket in the workspace ws: the kill follows within half
// a millisecond of its appearance, polled without pause, to hit the
// window between making a thing and handing it to the reaper) and traffic
// (a delay after the provider received a drawn number of requests).
// total is how many requests the workload makes.
func crashKillPoints(total int, ws string) crashChooser {
	return func(rng *rand.Rand, i int, ctl crashMilestones) crashKill {
		switch i % 4 {
		case 0:
			// From exec to run.started: policy, key, journal creation.
			return crashKill{Phase: "start-up", Delay: time.Duration(rng.Float64() * float64(ctl.Journal))}
		case 1:
			// From run.started to the run info: staging, reaper, backend,
			// the boundary measurement; a little further lands in the
			// workload's start.
			span := float64(ctl.RunInfo-ctl.Journal) * 1.2
			return crashKill{Phase: "measurement", After: func(tr *crashTrial) bool { return tr.JournalLines() >= 1 },
				Delay: time.Duration(rng.Float64() * span)}
		case 2:
			objs := []string{"staging", "socket"}
			if os.Geteuid() == 0 {
				objs = append(objs, "memory", "pids") // cgroups, as root only
			}
			obj := objs[rng.Intn(len(objs))]
			return crashKill{Phase: "host-object", Note: "(" + obj + ")", Spin: true,
				After: func(tr *crashTrial) bool { return tr.HostObject(obj, ws) },
				Delay: time.Duration(rng.Int63n(int64(500 * time.Microsecond)))}
		default:
			k := 1 + rng.Intn(total/2)
			return crashKill{Phase: "traffic", Note: fmt.Sprintf("(after %d requests)", k),
				After: func(tr *crashTrial) bool { return len(tr.Provider.Requests()) >= k },
				Delay: time.Duration(rng.Int63n(int64(30 * time.Millisecond)))}
		}
	}
}

// crashConfig configures runCrashTrials. The approvals issue's three-stage
// kills reuse the harness with their own policy, workload, chooser and
// extra checks.
type crashConfig struct {
	Trials int
	Seed   int64
	// Args returns moat's arguments for trial tr ("run", …), having
	// written whatever the trial needs into tr.Dir. They must include
	// --run-info tr.RunInfo and a policy whose audit dir is tr.AuditDir
	// and whose providers point at tr.Provider.
	Args func(tr *crashTrial) []string
	Env  []string // added to moat's environment
	// TrialEnv, when set, adds to one trial's environment (tr.I is -1 for
	// the control run), after Env.
	TrialEnv func(tr *crashTrial) []string
	// Binary, when set, is the moat binary the trials run (else moatBin).
	Binary string
	Kill   crashChooser
	// Workspace is the trial's read-write grant, checked for leftovers
	// after the kill (nil: none checked). Sharing one between trials also
	// checks that a kill never leaves it unusable.
	Workspace func(tr *crashTrial) string
	// Check, when set, adds checks after the common ones; it runs for the
	// control run too (tr.Kill.Never).
	Check func(t *testing.T, tr *crashTrial)
}

// crashTrial is one trial's state.
type crashTrial struct {
	t        *testing.T
	env      *env
	I        int    // -1 for the control run
	Dir      string // the trial's own directory
	AuditDir string // the policy's audit dir (made by moat)
	RunInfo  string
	Provider *provider
	Kill     crashKill
	Cmd      *exec.Cmd

	// Filled in as the trial goes.
	At      crashMilestones
	Killed  bool   // moat was still running when it was killed
	RunDir  string // the run directory, "" if moat died before making one
	RunID   string
	Journal []byte                 // its complete lines
	Seen    []fakeprovider.Request // what the provider received
	Stderr  string
	Verify  result // moat audit verify
	// Running is what crashLeftovers found (workspace aside) when the run
	// info appeared.
	Running []string
}

// JournalLines counts the complete lines of the trial's journal so far.
func (tr *crashTrial) JournalLines() int {
	m, _ := filepath.Glob(filepath.Join(tr.AuditDir, "*", audit.JournalFile))
	if len(m) != 1 {
		return 0
	}
	b, _ := os.ReadFile(m[0])
	return bytes.Count(b, []byte{'\n'})
}

// HostObject reports whether the run has made obj on the host: its
// "staging" directory, its "memory" or "pids" cgroup, or a measurement
// "socket" in the workspace ws.
func (tr *crashTrial) HostObject(obj, ws string) bool {
	runs, _ := os.ReadDir(tr.AuditDir)
	if len(runs) != 1 {
		return false
	}
	id := runs[0].Name()
	var m []string
	switch obj {
	case "staging":
		m, _ = filepath.Glob(filepath.Join(os.TempDir(), "moat-"+id+"-*"))
	case "memory", "pids":
		if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", obj, ownCgroupV1(obj), "moat-"+id)); err == nil {
			return true
		}
	case "socket":
		m, _ = filepath.Glob(filepath.Join(ws, ".moat-measure-*"))
	}
	return len(m) > 0
}

// HasRunInfo reports whether moat wrote the run info (the sandbox is Ready).
func (tr *crashTrial) HasRunInfo() bool {
	_, err := os.Stat(tr.RunInfo)
	return err == nil
}

// Landed says where the kill landed, from what the run left.
func (tr *crashTrial) Landed() string {
	switch {
	case !tr.Killed:
		return "not killed (ended on its own)"
	case tr.RunDir == "":
		return "before the run directory"
	case len(tr.Seen) > 0:
		return "mid-traffic"
	}
	switch n := bytes.Count(tr.Journal, []byte{'\n'}); {
	case n == 0:
		return "before run.started"
	case n == 1:
		return "measuring (run.started only)"
	case !tr.HasRunInfo():
		return "confirmed, before the run info"
	}
	return "ready, before the first request"
}

// runCrashTrials runs one control run (no kill) and then cfg.Trials
// trials in e: each starts moat, kills it with SIGKILL at the point
// cfg.Kill chooses, and checks what is left.
func runCrashTrials(t *testing.T, e *env, cfg crashConfig) {
	t.Helper()
	t.Logf("crash trials: %d, seed %d (replay with MOAT_CRASH_SEED=%d MOAT_CRASH_TRIALS=%d)", cfg.Trials, cfg.Seed, cfg.Seed, cfg.Trials)
	start := time.Now()
	ctl := &crashTrial{t: t, env: e, I: -1, Kill: crashKill{Never: true}}
	if !t.Run("control", func(t *testing.T) {
		runCrashTrial(t, e, cfg, ctl)
		if ctl.Verify.code != 0 {
			t.Errorf("control: the run was not killed, but its journal does not verify complete:\n%s", ctl.Verify)
		}
		if ctl.At.Journal == 0 || ctl.At.RunInfo == 0 || ctl.At.FirstRequest == 0 {
			t.Errorf("control: the run did not pass every stage: %v", ctl.At)
		}
		// The leftover check sees the run's staging directory and (as
		// root, with limits) its memory and pids cgroups while it runs.
		want := 1
		if os.Geteuid() == 0 {
			want = 3
		}
		if len(ctl.Running) != want {
			t.Errorf("control: while the run ran, the leftover check found %q, want %d entries", ctl.Running, want)
		}
	}) {
		t.FailNow()
	}
	t.Logf("control run: %v", ctl.At)
	rng := rand.New(rand.NewSource(cfg.Seed))
	outcomes := map[string]int{}
	var killedInTraffic int
	for i := range cfg.Trials {
		tr := &crashTrial{t: t, env: e, I: i, Kill: cfg.Kill(rng, i, ctl.At)}
		ok := t.Run(fmt.Sprintf("trial%03d", i), func(t *testing.T) {
			runCrashTrial(t, e, cfg, tr)
			v := fmt.Sprintf("verify exit %d", tr.Verify.code)
			if tr.RunDir == "" {
				v = "nothing to verify"
			}
			outcomes[fmt.Sprintf("%-12s landed %-32s %s", tr.Kill.Phase, tr.Landed(), v)]++
			if tr.Killed && len(tr.Seen) > 0 {
				killedInTraffic++
			}
		})
		if !ok {
			t.Fatalf("trial %d (kill %v) failed; replay with MOAT_CRASH_SEED=%d MOAT_CRASH_TRIALS=%d", i, tr.Kill, cfg.Seed, i+1)
		}
	}
	keys := make([]string, 0, len(outcomes))
	for k := range outcomes {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		t.Logf("%4d × %s", outcomes[k], k)
	}
	t.Logf("%d trials and the control in %v; %d killed moat while requests were flowing", cfg.Trials, time.Since(start).Round(time.Second), killedInTraffic)
	// The harness did kill runs with traffic through the broker: with
	// crashKillPoints each fourth trial waits for provider requests before
	// it kills, and the workload is far longer than the delay.
	if cfg.Trials >= 4 && killedInTraffic == 0 {
		t.Errorf("no trial killed moat while the provider was receiving requests: the trials checked nothing")
	}
}

var fingerprintRE = regexp.MustCompile(`key fingerprint ([0-9a-f]{64})`)

// runCrashTrial runs one trial.
func runCrashTrial(t *testing.T, e *env, cfg crashConfig, tr *crashTrial) {
	tr.Dir = filepath.Join(e.dir, fmt.Sprintf("trial%03d", tr.I))
	if tr.I < 0 {
		tr.Dir = filepath.Join(e.dir, "control")
	}
	if err := os.Mkdir(tr.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	tr.AuditDir = filepath.Join(tr.Dir, "audit")
	tr.RunInfo = filepath.Join(tr.Dir, "run.json")
	tr.Provider = newProvider(t, false)
	args := cfg.Args(tr)
	tr.Cmd = e.command(args...)
	tr.Cmd.Env = append(tr.Cmd.Env, cfg.Env...)
	if cfg.TrialEnv != nil {
		tr.Cmd.Env = append(tr.Cmd.Env, cfg.TrialEnv(tr)...)
	}
	if cfg.Binary != "" {
		tr.Cmd.Path, tr.Cmd.Args[0] = cfg.Binary, cfg.Binary
	}
	// Files, not pipes: a pipe would keep Wait waiting for whatever moat
	// left holding it.
	so, err := os.Create(filepath.Join(tr.Dir, "stdout"))
	if err != nil {
		t.Fatal(err)
	}
	defer so.Close()
	se, err := os.Create(filepath.Join(tr.Dir, "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer se.Close()
	tr.Cmd.Stdout, tr.Cmd.Stderr = so, se
	if err := tr.Cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	done := make(chan struct{})
	go func() { tr.Cmd.Wait(); close(done) }()
	exited := func() bool {
		select {
		case <-done:
			return true
		default:
			return false
		}
	}
	// Poll the run's stages (for the milestones) and the kill point's
	// condition; once it holds, wait its delay, then SIGKILL. Bounded.
	milestones := func() {
		now := time.Since(t0)
		if tr.At.Journal == 0 && tr.JournalLines() >= 1 {
			tr.At.Journal = now
		}
		if tr.At.RunInfo == 0 && tr.HasRunInfo() {
			tr.At.RunInfo = now
			// What the run has made while it runs: the control for the
			// leftover check after the kill.
			if runs, _ := os.ReadDir(tr.AuditDir); len(runs) == 1 {
				tr.Running = crashLeftovers(runs[0].Name(), "")
			}
		}
		if tr.At.FirstRequest == 0 && len(tr.Provider.Requests()) > 0 {
			tr.At.FirstRequest = now
		}
	}
	var killAt time.Time
	deadline := t0.Add(120 * e2eSecond)
	for !exited() {
		milestones()
		now := time.Now()
		if now.After(deadline) {
			tr.Cmd.Process.Kill()
			<-done
			t.Fatalf("kill point %v: moat neither ended nor reached the kill point within 120s (%v); its stderr:\n%s", tr.Kill, tr.At, readFile(t, se.Name()))
		}
		if killAt.IsZero() && !tr.Kill.Never && (tr.Kill.After == nil || tr.Kill.After(tr)) {
			killAt = now.Add(tr.Kill.Delay)
		}
		if !killAt.IsZero() && !now.Before(killAt) {
			tr.Killed = tr.Cmd.Process.Signal(syscall.SIGKILL) == nil
			<-done
			break
		}
		if !tr.Kill.Spin || !killAt.IsZero() {
			time.Sleep(time.Millisecond)
		}
	}
	tr.At.End = time.Since(t0)
	state := tr.Cmd.ProcessState
	if ws, ok := state.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() {
		// moat ended on its own first: only a complete, successful run
		// is acceptable (the workload is far longer than any delay).
		tr.Killed = false
		if state.ExitCode() != 0 {
			t.Fatalf("kill point %v: moat exited %d on its own; stderr:\n%s", tr.Kill, state.ExitCode(), readFile(t, se.Name()))
		}
	}
	// Every request the provider is still handling is recorded once Close
	// returns.
	tr.Provider.Close()
	tr.Stderr = readFile(t, se.Name())
	seen := tr.Provider.Requests()
	tr.Seen = seen

	runs, _ := os.ReadDir(tr.AuditDir)
	if len(runs) > 1 {
		t.Fatalf("%d run directories in %s, want at most 1", len(runs), tr.AuditDir)
	}
	if len(runs) == 0 {
		// Killed before the run directory existed: nothing can have
		// been sent, and nothing else was made yet (the staging
		// directory and cgroups come after the journal).
		if len(seen) != 0 {
			t.Fatalf("the provider received %d requests, but there is no run directory", len(seen))
		}
		t.Logf("kill %v: before the run directory existed", tr.Kill)
		tr.Verify = result{code: -1}
		return
	}
	tr.RunID = runs[0].Name()
	tr.RunDir = filepath.Join(tr.AuditDir, tr.RunID)

	// Verify the journal as a user would: the binary, pinned.
	pin, source := crashPin(tr)
	vargs := []string{"audit", "verify", tr.RunDir}
	if pin != "" {
		vargs = append(vargs, "--key-fingerprint", pin)
	}
	v := crashMoat(t, e, vargs...)
	tr.Verify = v
	t.Logf("kill %v (%v; killed=%v, provider received %d): verify (pin from %s) exit %d: %s",
		tr.Kill, tr.At, tr.Killed, len(seen), source, v.code, strings.TrimSpace(v.stdout))
	if v.code != 0 && v.code != 2 {
		t.Errorf("moat audit verify exited %d, want 0 (complete) or 2 (incomplete), never 1\n%s\nmoat's stderr:\n%s", v.code, v, tr.Stderr)
	}
	if !tr.Killed && v.code != 0 {
		t.Errorf("moat exited 0 on its own, but its journal is not complete:\n%s", v)
	}

	// Every request that reached the provider has its byte-identical
	// signed record, durable, in the journal.
	j, _ := os.ReadFile(filepath.Join(tr.RunDir, audit.JournalFile))
	lines := map[string]bool{}
	rest := j
	for {
		l, after, ok := bytes.Cut(rest, []byte{'\n'})
		if !ok {
			break // a torn last line is not durable
		}
		lines[string(l)] = true
		rest = after
	}
	tr.Journal = j[:len(j)-len(rest)]
	pub, perr := audit.ParsePublicKeyPEM([]byte(readFileOr(filepath.Join(tr.RunDir, audit.PublicKeyFile))))
	for j, s := range seen {
		h := s.Header.Get("Moat-Pre-Effect")
		line, err := base64.StdEncoding.DecodeString(h)
		if h == "" || err != nil {
			t.Errorf("request %d to %s: Moat-Pre-Effect %q: %v", j, s.Path, h, err)
			continue
		}
		if !lines[string(line)] {
			t.Errorf("request %d to %s reached the provider, but its Moat-Pre-Effect line is not a complete line of the journal:\n%s", j, s.Path, line)
			continue
		}
		if perr != nil {
			t.Errorf("the journal holds request %d's line but pubkey.pem does not parse: %v", j, perr)
			continue
		}
		ent, err := audit.VerifyLine(line, pub)
		if err != nil {
			t.Errorf("request %d: its journal line does not verify: %v", j, err)
			continue
		}
		rec, ok := ent.Record.(audit.InferenceRequested)
		if !ok {
			t.Errorf("request %d: its Moat-Pre-Effect line is a %T, want inference.requested", j, ent.Record)
		} else if want := sha256hex(s.Body); rec.BodySHA256 != want {
			t.Errorf("request %d: the record's body_sha256 is %s, the body received hashes to %s", j, rec.BodySHA256, want)
		}
	}

	// Nothing of the run is left once the reaper is done.
	var ws string
	if cfg.Workspace != nil {
		ws = cfg.Workspace(tr)
	}
	var left []string
	ok := pollUntil(30*e2eSecond, func() bool { left = crashLeftovers(tr.RunID, ws); return len(left) == 0 })
	if !ok {
		t.Errorf("30s after the kill, the run's leftovers remain: %s", strings.Join(left, ", "))
	}
	if cfg.Check != nil {
		cfg.Check(t, tr)
	}
}

// crashPin is the key fingerprint to pin for tr, and where it came from:
// the run info; else what moat printed on stderr when it created the
// journal; else the keyid of the journal's first line; else none.
func crashPin(tr *crashTrial) (string, string) {
	if b, err := os.ReadFile(tr.RunInfo); err == nil {
		var info struct {
			KeyID string `json:"keyid"`
		}
		if json.Unmarshal(b, &info) == nil && info.KeyID != "" {
			return info.KeyID, "run info"
		}
	}
	if m := fingerprintRE.FindStringSubmatch(tr.Stderr); m != nil {
		return m[1], "stderr"
	}
	b, _ := os.ReadFile(filepath.Join(tr.RunDir, audit.JournalFile))
	if i := bytes.Index(b, []byte(`"keyid":"`)); i >= 0 && len(b) >= i+9+64 {
		return string(b[i+9 : i+9+64]), "journal"
	}
	return "", "nowhere (unpinned)"
}

// crashLeftovers lists what of run id is still there: its staging
// directory, its cgroups, and anything in the workspace ws (the workload
// writes nothing there, so whatever is there is moat's).
func crashLeftovers(runID, ws string) []string {
	m, _ := filepath.Glob(filepath.Join(os.TempDir(), "moat-"+runID+"-*"))
	out := m
	for _, ctrl := range []string{"memory", "pids"} {
		dir := filepath.Join("/sys/fs/cgroup", ctrl, ownCgroupV1(ctrl), "moat-"+runID)
		if _, err := os.Stat(dir); err == nil {
			out = append(out, dir)
		}
	}
	if ws != "" {
		ents, _ := os.ReadDir(ws)
		for _, e := range ents {
			out = append(out, filepath.Join(ws, e.Name()))
		}
	}
	return out
}

// ownCgroupV1 is the test's (and so moat's) path in a v1 controller.
func ownCgroupV1(ctrl string) string {
	b, _ := os.ReadFile("/proc/self/cgroup")
	for _, l := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(l, ":", 3)
		if len(parts) == 3 && slices.Contains(strings.Split(parts[1], ","), ctrl) {
			return parts[2]
		}
	}
	return "/"
}

// pollUntil polls cond until it holds (true) or d passes (false).
func pollUntil(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// crashMoat runs moat like env.moat, failing the trial's t, not the
// test's.
func crashMoat(t *testing.T, e *env, args ...string) result {
	t.Helper()
	cmd := e.command(args...)
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	err := cmd.Run()
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatalf("running moat: %v", err)
	}
	return result{so.String(), se.String(), cmd.ProcessState.ExitCode()}
}

func readFileOr(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}
