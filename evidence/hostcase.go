package evidence

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"time"

	"github.com/moat-sandbox/moat/evidence/probe"
)

// The controller's side of the cases with host checks (hostchecks.go).
// Most cases are one moat run; planted-grant-symlink and run-info-symlink
// need later runs against the same workspace, which finishHostCase starts
// after run 1 with the same policy, provider and receivers. Run 1 is the
// ordinary run: its run info, journal, controls and cleanup are the case's
// like any other; each later run is recorded as a RunRecord, its probe
// output and moat's stderr in later-runs.out.

// hostFileText is the content of the host files outside the grants that
// must not change.
const hostFileText = "a host file outside every grant: it must not change\n"

// setupHostCase prepares what the case's host checks need before run 1:
// the files, the values and the "before" observations.
func (r *caseRun) setupHostCase() error {
	switch r.c.Name {
	case "planted-grant-symlink":
		granted, canary := "granted-"+randHex(8), "MOAT-HOST-CANARY-"+randHex(12)
		etc := filepath.Join(r.workspace, probe.NestedGrantDir)
		outside := filepath.Join(r.sdir, "outside-sysroot")
		for _, d := range []string{etc, filepath.Join(outside, "etc")} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return err
			}
		}
		if err := os.WriteFile(filepath.Join(r.workspace, probe.NestedGrantFile), []byte(granted+"\n"), 0o644); err != nil {
			return err
		}
		// Readable by the workload, should the planted link ever be followed.
		if err := os.WriteFile(filepath.Join(outside, "etc", "conf"), []byte(canary+"\n"), 0o644); err != nil {
			return err
		}
		if geteuid() == 0 {
			for _, p := range []string{probe.NestedGrantParent, probe.NestedGrantDir, probe.NestedGrantFile} {
				if err := os.Chown(filepath.Join(r.workspace, p), workloadUID, workloadUID); err != nil {
					return err
				}
			}
		}
		r.extraRO = []string{etc}
		r.target = outside
		r.host.Values = map[string]string{ValueCanary: canary, ValueGranted: granted,
			ValuePlanted: wsPath(probe.NestedGrantParent), ValueTarget: outside}
	case "run-info-symlink":
		outside := filepath.Join(r.sdir, "outside")
		planted := filepath.Join(r.sdir, "planted")
		for _, d := range []string{outside, planted} {
			if err := os.Mkdir(d, 0o755); err != nil {
				return err
			}
		}
		t1, t2 := filepath.Join(outside, "ri-target-1"), filepath.Join(outside, "ri-target-2")
		for _, t := range []string{t1, t2} {
			if err := os.WriteFile(t, []byte(hostFileText), 0o644); err != nil {
				return err
			}
		}
		// Run 3's --run-info: a symlink planted outside every grant
		// (standing in for anyone who can write there).
		if err := os.Symlink(t2, filepath.Join(planted, FileRunInfo)); err != nil {
			return err
		}
		r.target = t1
		r.host.Values = map[string]string{ValuePlanted: wsPath(probe.PlantedRunInfo), ValueTarget: t1,
			ValueRILink: "planted/" + FileRunInfo}
		r.stat(WhenBefore, t1, t2)
	case "inotify-counter":
		owner := os.Geteuid()
		if owner == 0 {
			owner = workloadUID // the uid that owns the sandbox's user namespace
		}
		r.host.Inotify = &InotifyRecord{Owner: owner, WorkloadFDs: -1, Before: inotifyAs(owner)}
	}
	return nil
}

// finishHostCase runs the later runs and makes the host observations
// after run 1.
func (r *caseRun) finishHostCase(ctx context.Context, polPath string) error {
	defer func() {
		if r.laterRuns != nil {
			if err := os.WriteFile(filepath.Join(r.dir, FileLaterRuns), r.laterRuns, 0o644); err != nil {
				r.host.Missing = append(r.host.Missing, "later-runs.out: "+err.Error())
			}
		}
	}()
	switch r.c.Name {
	case "setid-file":
		var paths []string
		for _, n := range append(slices.Clone(probe.SetIDAttacks), probe.SetIDPlain) {
			paths = append(paths, filepath.Join(r.workspace, n))
		}
		r.stat(WhenAfter, paths...)
	case "planted-grant-symlink":
		r.stat(WhenRun1, filepath.Join(r.workspace, probe.NestedGrantParent))
		r.host.Runs = append(r.host.Runs, r.laterRun(ctx, polPath, 2, filepath.Join(r.sdir, "run-info-2.json")))
	case "run-info-symlink":
		planted := filepath.Join(r.workspace, probe.PlantedRunInfo)
		r.stat(WhenRun1, planted)
		r.host.Runs = append(r.host.Runs, r.laterRun(ctx, polPath, 2, planted))
		link := filepath.Join(r.sdir, "planted", FileRunInfo)
		r.host.Runs = append(r.host.Runs, r.laterRun(ctx, polPath, 3, link))
		var before []string
		for _, p := range r.host.Paths {
			if p.When == WhenBefore {
				before = append(before, filepath.Join(r.sdir, p.Path))
			}
		}
		r.stat(WhenAfter, append(before, link)...)
	}
	return nil
}

// stat records the host's lstat of each absolute path.
func (r *caseRun) stat(when string, paths ...string) {
	for _, p := range paths {
		rel, err := filepath.Rel(r.sdir, p)
		if err != nil {
			rel = p
		}
		r.host.Paths = append(r.host.Paths, lstatRecord(when, p, filepath.ToSlash(rel)))
	}
}

// laterRun starts run number n of the case with --run-info riPath and
// records what the host sees. If it gets Ready (it should not, for a run
// that must be refused), its key is pinned in the provider and the probe
// is let go, so that whatever it then does is observed.
func (r *caseRun) laterRun(ctx context.Context, polPath string, n int, riPath string) RunRecord {
	rel, err := filepath.Rel(r.sdir, riPath)
	if err != nil {
		rel = riPath
	}
	rec := RunRecord{Run: n, RunInfoPath: filepath.ToSlash(rel), ExitCode: -1}
	marker := filepath.Join(r.workspace, goMarker)
	os.Remove(marker)
	cctx, cancel := context.WithTimeout(ctx, CaseTimeout)
	defer cancel()
	cmd := exec.CommandContext(cctx, r.s.Binary, r.moatArgs(polPath, riPath, n)...)
	cmd.Dir = r.sdir
	cmd.Env = append(cleanEnv(), CredEnvAnthropic+"="+r.s.creds["anthropic"], CredEnvOpenAI+"="+r.s.creds["openai"])
	var stdout, stderr capBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	defer func() {
		r.laterRuns = fmt.Appendf(r.laterRuns, "== run %d: probe stdout ==\n%s== run %d: moat stderr ==\n%s",
			n, r.s.redact(stdout.Bytes()), n, r.s.redact(stderr.Bytes()))
	}()
	if err := cmd.Start(); err != nil {
		r.host.Missing = append(r.host.Missing, fmt.Sprintf("run %d: start %s: %v", n, r.s.Binary, err))
		return rec
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	ri, _, err := waitRunInfo(riPath, exited)
	starts := map[int]string{}
	switch {
	case err == nil:
		rec.RunInfo, rec.RunID = true, ri.RunID
		for _, pid := range []int{ri.HostPID, ri.WorkloadPID} {
			starts[pid] = procStart(pid)
		}
		if pub, perr := parsePublicKeyPEM([]byte(ri.PublicKeyPEM)); perr == nil {
			r.prov.Pin(ri.RunID, pub)
		}
		if werr := os.WriteFile(marker, []byte("go\n"), 0o644); werr != nil {
			r.host.Notes = append(r.host.Notes, fmt.Sprintf("run %d: marker: %v", n, werr))
		}
	case !errors.Is(err, errNoRunInfo):
		cancel()
	}
	<-exited
	rec.TimedOut = cctx.Err() == context.DeadlineExceeded
	var ee *exec.ExitError
	switch {
	case waitErr == nil:
		rec.ExitCode = 0
	case errors.As(waitErr, &ee):
		rec.ExitCode = ee.ExitCode()
	default:
		r.host.Missing = append(r.host.Missing, fmt.Sprintf("run %d: wait for moat: %v", n, waitErr))
	}
	if rec.RunInfo {
		// The later run's processes must be gone too.
		var h HostRecord
		observeCleanup(&h, []int{ri.HostPID, ri.WorkloadPID}, starts)
		if r.s.kube != nil {
			r.observePodGone(ctx, &h, ri.RunID)
		}
		if h.WorkerGone != nil && !*h.WorkerGone {
			r.host.Notes = append(r.host.Notes, fmt.Sprintf("run %d: a worker process was left running", n))
		}
	}
	return rec
}

// measureInotify waits for the probe to hold its inotify instances, counts
// them from the host, makes one instance as the sandbox's owner uid, and
// lets the probe go.
func (r *caseRun) measureInotify(exited <-chan struct{}, ri runInfo) {
	in := r.host.Inotify
	held := filepath.Join(r.workspace, probe.InotifyHeld)
	deadline := time.Now().Add(runInfoWait)
	for {
		if _, err := os.Stat(held); err == nil {
			break
		}
		select {
		case <-exited:
			return
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return
		}
	}
	in.Held = true
	var pids []int
	for _, p := range append([]int{ri.WorkloadPID, ri.HostPID}, r.podPids...) {
		if p > 0 && !slices.Contains(pids, p) {
			pids = append(pids, p)
		}
	}
	if n, err := inotifyFDs(pids); err != nil {
		in.FDsErr = err.Error()
	} else {
		in.WorkloadFDs = n
	}
	in.During = inotifyAs(in.Owner)
	if err := os.WriteFile(filepath.Join(r.workspace, probe.InotifyRelease), []byte("release\n"), 0o644); err != nil {
		r.host.Notes = append(r.host.Notes, "inotify release marker: "+err.Error())
	}
}
