//go:build linux

package e2e

import (
	"bytes"
	"math/rand"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/broker"
)

// TestCrashAtAuditStages reuses the crash harness (runCrashTrials) with
// the moat_test_hooks build of moat and its audit-stage fault hook instead
// of timing: in each trial `moat run` serves one request (the control),
// then its broker stops at one of the three stages of the second request
// (broker.FaultStages, in turn: before the pre-effect record is written,
// after it is durable but before the send, after the provider answered
// but before the completion record), writes the marker and stops itself
// (SIGSTOP); the harness kills moat (SIGKILL) once the marker is there.
// Besides the harness's checks (moat audit verify exits 0 or 2, every
// request the provider got carries a byte-identical, verifying
// pre-effect line of the journal, the reaper removes what the run made),
// each trial checks: the marker names moat's own pid (the killed process
// is the stopped broker), verify exits 2 (an intact prefix, never
// complete), and the journal and the provider hold exactly what the stage
// allows. The harness's unkilled control run (the hook's variables unset)
// serves every request and verifies complete.
func TestCrashAtAuditStages(t *testing.T) {
	hooks := hooksBin(t)
	e := newEnv(t)
	ws := e.newWorkspace("stages-workspace")
	const requests = 4
	stageOf := func(tr *crashTrial) string { return broker.FaultStages[tr.I%len(broker.FaultStages)] }
	marker := func(tr *crashTrial) string { return filepath.Join(tr.Dir, "fault.marker") }
	// want: stage → pre-effect records, provider requests, completions.
	want := map[string][3]int{broker.FaultPreDurable: {1, 1, 1}, broker.FaultPreSend: {2, 1, 1}, broker.FaultPreComplete: {2, 2, 1}}
	runCrashTrials(t, e, crashConfig{
		Trials: 2 * len(broker.FaultStages),
		Seed:   crashSeed(t),
		Binary: hooks,
		Args: func(tr *crashTrial) []string {
			args := []string{"run", "--policy", crashPolicy(tr, ws, 16), "--run-info", tr.RunInfo, "--", e.probe, helperArg}
			for range requests {
				args = append(args, "sdk-anthropic=claude-e2e")
			}
			return args
		},
		Env: []string{"E2E_ANTHROPIC_KEY=" + anthropicCred, "E2E_OPENAI_KEY=" + openaiCred},
		TrialEnv: func(tr *crashTrial) []string {
			if tr.I < 0 {
				return nil
			}
			return []string{broker.FaultStageEnv + "=" + stageOf(tr), broker.FaultMarkerEnv + "=" + marker(tr), broker.FaultSkipEnv + "=1"}
		},
		Kill: func(_ *rand.Rand, i int, _ crashMilestones) crashKill {
			return crashKill{Phase: "fault-hook", Note: "(" + broker.FaultStages[i%len(broker.FaultStages)] + ")",
				After: func(tr *crashTrial) bool { _, err := os.Stat(marker(tr)); return err == nil }}
		},
		Workspace: func(*crashTrial) string { return ws },
		Check: func(t *testing.T, tr *crashTrial) {
			if tr.I < 0 {
				if len(tr.Seen) != requests {
					t.Errorf("control: the provider received %d requests, want %d", len(tr.Seen), requests)
				}
				return
			}
			stage := stageOf(tr)
			b, err := os.ReadFile(marker(tr))
			if err != nil || strings.TrimSpace(string(b)) != stage+" "+strconv.Itoa(tr.Cmd.Process.Pid) {
				t.Errorf("%s: marker %q (%v), want %q: the hook did not stop moat itself", stage, b, err, stage+" "+strconv.Itoa(tr.Cmd.Process.Pid))
			}
			if !tr.Killed || tr.Verify.code != 2 {
				t.Errorf("%s: killed=%v, moat audit verify exit %d, want a killed run and exit 2 (an intact prefix)\n%s", stage, tr.Killed, tr.Verify.code, tr.Verify)
			}
			var requested, completed int
			for _, l := range bytes.Split(tr.Journal, []byte{'\n'}) {
				if ent, err := audit.ParseLine(l); err == nil {
					switch ent.Record.(type) {
					case audit.InferenceRequested:
						requested++
					case audit.InferenceCompleted:
						completed++
					}
				}
			}
			w := want[stage]
			if got := [3]int{requested, len(tr.Seen), completed}; got != w {
				t.Errorf("%s: %d pre-effect records, %d provider requests, %d completions; want %v", stage, requested, len(tr.Seen), completed, w)
			}
		},
	})
	// The same variables make a moat without the hook refuse to start
	// (125), before it makes anything.
	cmd := e.command("run", "--policy", filepath.Join(e.dir, "nonexistent.yaml"), "--", "/bin/true")
	cmd.Env = append(cmd.Env, broker.FaultStageEnv+"="+broker.FaultPreSend, broker.FaultMarkerEnv+"="+filepath.Join(e.dir, "m"))
	out, _ := cmd.CombinedOutput()
	if code := cmd.ProcessState.ExitCode(); code != 125 || !strings.Contains(string(out), "moat_test_hooks") {
		t.Errorf("normal moat with %s set: exit %d, want 125 naming the tag\n%s", broker.FaultStageEnv, code, out)
	}
	if _, err := os.Stat(filepath.Join(e.dir, "m")); err == nil {
		t.Errorf("the normal moat wrote the marker")
	}
}
