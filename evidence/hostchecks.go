package evidence

import (
	"bytes"
	"crypto/ed25519"
	"fmt"
	"strings"

	"github.com/moat-sandbox/moat/evidence/probe"
)

// Host checks: what the controller observes on the host itself, outside
// the sandbox, for the escape classes that issue 11's attack found. The
// raw observations are in host.json (HostRecord.Runs, Paths, Values,
// Inotify) and later-runs.out; ObserveCase turns them into HostChecks, and
// Score scores those. Neither the probe's output nor its claims feed
// them, except that a host canary found in the probe's output counts
// against the sandbox.
const (
	CheckPlainChmod       = "plain-chmod"       // control: a 0755 chmod shows on the host
	CheckNoSetID          = "no-setid"          // no set-id bit on any file the probe tried
	CheckNoRootExec       = "no-root-exec"      // no file the probe made is host uid 0 with an exec bit
	CheckNestedRead       = "nested-read"       // control: run 1 read the nested grant's content
	CheckPlanted          = "planted"           // control: run 1's workload planted its symlink
	CheckLaterRunRefused  = "later-run-refused" // run 2 refused before its workload started (exit 125)
	CheckHostCanary       = "host-canary"       // the canary outside the grants reached nothing
	CheckRunInfoReplaced  = "run-info-replaced" // control: run 3 wrote its run info over the planted link
	CheckTargetsUnchanged = "targets-unchanged" // every host file outside the grants is as it was
	CheckInotifyBefore    = "inotify-before"    // control: the owner uid makes an inotify instance before the run
	CheckInotifyDuring    = "inotify-during"    // and while the probe holds all it can
)

// Keys of HostRecord.Values.
const (
	ValueCanary  = "canary"  // the content of the host file outside the grants
	ValueGranted = "granted" // the content of the nested grant's file
	ValuePlanted = "planted" // where run 1's workload plants its symlink (scratch-relative)
	ValueTarget  = "target"  // where that symlink must point (absolute, as the probe was told)
	ValueRILink  = "ri-link" // run 3's planted --run-info symlink (scratch-relative)
)

// Path observation times (PathRecord.When).
const (
	WhenBefore = "before"      // before run 1
	WhenRun1   = "after-run-1" // between run 1 and run 2
	WhenAfter  = "after"       // after the last run
)

// RunRecord is one later run of a multi-run case (run 2, 3, …).
type RunRecord struct {
	Run int `json:"run"`
	// RunInfoPath is the --run-info path, relative to the case's scratch.
	RunInfoPath string `json:"run_info_path"`
	RunInfo     bool   `json:"run_info"` // the run info appeared: the sandbox got Ready
	RunID       string `json:"run_id,omitempty"`
	ExitCode    int    `json:"exit_code"` // -1 if it never ran
	TimedOut    bool   `json:"timed_out"`
}

// PathRecord is the host's lstat of one path a case names.
type PathRecord struct {
	When string `json:"when"`
	// Path is relative to the case's scratch directory ("workspace/…").
	Path   string `json:"path"`
	Exists bool   `json:"exists"`
	Mode   uint32 `json:"mode"` // st_mode, type bits included
	UID    uint32 `json:"uid"`
	GID    uint32 `json:"gid"`
	Link   string `json:"link,omitempty"`   // a symlink's target
	SHA256 string `json:"sha256,omitempty"` // a regular file's content
	Err    string `json:"error,omitempty"`  // why it could not be observed (not ENOENT)
}

// File type bits of PathRecord.Mode (Linux's, fixed by the ABI).
const (
	modeType    = 0o170000
	modeRegular = 0o100000
	modeDir     = 0o040000
	modeSymlink = 0o120000
	modeSetID   = 0o6000
)

func (p PathRecord) isRegular() bool { return p.Exists && p.Mode&modeType == modeRegular }
func (p PathRecord) isSymlink() bool { return p.Exists && p.Mode&modeType == modeSymlink }

func (p PathRecord) String() string {
	switch {
	case p.Err != "":
		return p.Path + ": " + p.Err
	case !p.Exists:
		return p.Path + " absent"
	case p.isSymlink():
		return fmt.Sprintf("%s -> %s", p.Path, p.Link)
	}
	return fmt.Sprintf("%s %s %#o uid %d", p.Path, typeName(p.Mode), p.Mode&0o7777, p.UID)
}

func typeName(m uint32) string {
	switch m & modeType {
	case modeRegular:
		return "file"
	case modeDir:
		return "dir"
	case modeSymlink:
		return "symlink"
	}
	return fmt.Sprintf("type %#o", m&modeType)
}

// InotifyRecord is inotify-counter's host measurement, made as the uid
// that owns the sandbox's user namespace (Owner).
type InotifyRecord struct {
	Owner int `json:"owner_uid"`
	// Before and During are "ok" or why inotify_init1 failed; During is
	// empty if the probe never said it held its instances.
	Before string `json:"before"`
	Held   bool   `json:"held"` // the probe's held marker appeared
	During string `json:"during,omitempty"`
	// WorkloadFDs is the number of inotify descriptors the host counted in
	// the run's processes while the probe held them (-1: not counted).
	WorkloadFDs int    `json:"workload_fds"`
	FDsErr      string `json:"fds_error,omitempty"`
}

// HostCheck is one host check's result.
type HostCheck struct {
	Name string `json:"name"`
	// Control: a positive control; failing it is missing evidence.
	Control bool `json:"control"`
	// Observed: the raw record holds what the check needs.
	Observed bool   `json:"observed"`
	Held     bool   `json:"held"`
	Detail   string `json:"detail"`
}

// checkInput is what the checks read: the raw host record and what
// ObserveCase already computed from the other raw files.
type checkInput struct {
	host     HostRecord
	verified [][]byte        // bodies of verified provider requests
	events   []ProviderEvent // every provider request
	outputs  [][]byte        // probe.out, moat.err, later-runs.out
	// The tool cases' inputs.
	records         []journalRecord // the journal's records (none if it is missing)
	pub             ed25519.PublicKey
	runID           string
	toolLog         []ToolLogLine
	toolLogExists   bool
	toolEvents      []ToolEvent
	toolEventsExist bool
	// The egress case's.
	egress            []EgressEvent
	egressEventsExist bool
}

var hostChecks = map[string]struct {
	control bool
	fn      func(in checkInput) (observed, held bool, detail string)
}{
	CheckPlainChmod:       {true, checkPlainChmod},
	CheckNoSetID:          {false, checkNoSetID},
	CheckNoRootExec:       {false, checkNoRootExec},
	CheckNestedRead:       {true, checkNestedRead},
	CheckPlanted:          {true, checkPlanted},
	CheckLaterRunRefused:  {false, checkLaterRunRefused},
	CheckHostCanary:       {false, checkHostCanary},
	CheckRunInfoReplaced:  {true, checkRunInfoReplaced},
	CheckTargetsUnchanged: {false, checkTargetsUnchanged},
	CheckInotifyBefore:    {true, checkInotifyBefore},
	CheckInotifyDuring:    {false, checkInotifyDuring},
	CheckToolResult:       {true, checkToolResult},
	CheckToolSignals:      {false, checkToolSignals},
	CheckToolLogged:       {true, checkToolLogged},
	CheckToolUnlisted:     {false, checkToolUnlisted},
	CheckToolEnvGiven:     {true, checkToolEnvGiven},
	CheckToolNoSecrets:    {false, checkToolNoSecrets},
	CheckToolDetached:     {true, checkToolDetached},
	CheckToolReaped:       {false, checkToolReaped},
	CheckToolPreEffect:    {false, checkToolPreEffect},
	CheckEgressFetch:      {true, checkEgressFetch},
	CheckEgressRefused:    {false, checkEgressRefused},
	CheckEgressReceivers:  {false, checkEgressReceivers},
}

// computeHostChecks runs the case's host checks, in the case's order.
func computeHostChecks(c Case, in checkInput) []HostCheck {
	var out []HostCheck
	for _, name := range c.HostChecks {
		hc, ok := hostChecks[name]
		if !ok {
			out = append(out, HostCheck{Name: name, Detail: "BUG: no such host check"})
			continue
		}
		obs, held, detail := hc.fn(in)
		out = append(out, HostCheck{Name: name, Control: hc.control, Observed: obs, Held: obs && held, Detail: detail})
	}
	return out
}

func (h HostRecord) path(when, path string) (PathRecord, bool) {
	for _, p := range h.Paths {
		if p.When == when && p.Path == path {
			return p, true
		}
	}
	return PathRecord{}, false
}

// wsPath is a workspace path as PathRecord spells it.
func wsPath(name string) string { return "workspace/" + name }

func checkPlainChmod(in checkInput) (bool, bool, string) {
	p, ok := in.host.path(WhenAfter, wsPath(probe.SetIDPlain))
	if !ok || p.Err != "" {
		return false, false, "the host did not stat " + wsPath(probe.SetIDPlain)
	}
	return true, p.isRegular() && p.Mode&0o7777 == 0o755, "host sees " + p.String() + ", want a file 0755"
}

func checkNoSetID(in checkInput) (bool, bool, string) {
	var bad, seen []string
	for _, name := range probe.SetIDAttacks {
		p, ok := in.host.path(WhenAfter, wsPath(name))
		if !ok || p.Err != "" {
			return false, false, "the host did not stat " + wsPath(name)
		}
		seen = append(seen, p.String())
		if p.Exists && p.Mode&modeSetID != 0 {
			bad = append(bad, p.String())
		}
	}
	if len(bad) > 0 {
		return true, false, "set-id on the host: " + strings.Join(bad, "; ")
	}
	return true, true, "host sees " + strings.Join(seen, "; ")
}

func checkNoRootExec(in checkInput) (bool, bool, string) {
	var bad []string
	n := 0
	for _, p := range in.host.Paths {
		if p.When != WhenAfter || !strings.HasPrefix(p.Path, "workspace/") {
			continue
		}
		n++
		if p.isRegular() && p.UID == 0 && p.Mode&0o111 != 0 {
			bad = append(bad, p.String())
		}
	}
	if n == 0 {
		return false, false, "no file in the workspace was stat'ed"
	}
	if len(bad) > 0 {
		return true, false, "files owned by host uid 0 with an exec bit: " + strings.Join(bad, "; ")
	}
	return true, true, fmt.Sprintf("none of %d files is host uid 0 with an exec bit", n)
}

func checkNestedRead(in checkInput) (bool, bool, string) {
	g := in.host.Values[ValueGranted]
	if g == "" {
		return false, false, "no granted content recorded"
	}
	for _, b := range in.verified {
		if bytes.Contains(b, []byte(ControlPrefix+"nested-read data="+g)) {
			return true, true, "a verified request carried the nested grant's content"
		}
	}
	return true, false, "no verified request carried the nested grant's content"
}

func checkPlanted(in checkInput) (bool, bool, string) {
	at, target := in.host.Values[ValuePlanted], in.host.Values[ValueTarget]
	if at == "" || target == "" {
		return false, false, "no planting recorded"
	}
	p, ok := in.host.path(WhenRun1, at)
	if !ok || p.Err != "" {
		return false, false, "the host did not stat " + at + " after run 1"
	}
	return true, p.isSymlink() && p.Link == target, "after run 1 the host sees " + p.String() + ", want a symlink to " + target
}

func checkLaterRunRefused(in checkInput) (bool, bool, string) {
	if len(in.host.Runs) == 0 || in.host.Runs[0].ExitCode == -1 || in.host.Runs[0].TimedOut {
		return false, false, "run 2 did not run to an exit"
	}
	r := in.host.Runs[0]
	return true, !r.RunInfo && r.ExitCode == 125, fmt.Sprintf("run 2 (--run-info %s) exited %d, run info written: %v; want 125 before Ready", r.RunInfoPath, r.ExitCode, r.RunInfo)
}

func checkHostCanary(in checkInput) (bool, bool, string) {
	c := in.host.Values[ValueCanary]
	if c == "" {
		return false, false, "no canary recorded"
	}
	n := 0
	for _, ev := range in.events {
		if requestHas(ev, c) {
			n++
		}
	}
	for _, b := range in.outputs {
		n += bytes.Count(b, []byte(c))
	}
	return true, n == 0, fmt.Sprintf("the host canary appeared %d time(s) at the provider or in the worker's output", n)
}

func checkRunInfoReplaced(in checkInput) (bool, bool, string) {
	link := in.host.Values[ValueRILink]
	if link == "" || len(in.host.Runs) < 2 {
		return false, false, "run 3 did not run"
	}
	r := in.host.Runs[1]
	p, ok := in.host.path(WhenAfter, link)
	if !ok || p.Err != "" {
		return false, false, "the host did not stat " + link
	}
	return true, r.RunInfo && r.ExitCode == 0 && p.isRegular(),
		fmt.Sprintf("run 3 (--run-info %s) exited %d, run info written: %v; the host sees %s", r.RunInfoPath, r.ExitCode, r.RunInfo, p.String())
}

func checkTargetsUnchanged(in checkInput) (bool, bool, string) {
	var changed, seen []string
	for _, b := range in.host.Paths {
		if b.When != WhenBefore {
			continue
		}
		a, ok := in.host.path(WhenAfter, b.Path)
		if b.Err != "" || !ok || a.Err != "" {
			return false, false, "the host did not stat " + b.Path + " before and after"
		}
		seen = append(seen, b.Path)
		if a != (PathRecord{When: WhenAfter, Path: b.Path, Exists: b.Exists, Mode: b.Mode, UID: b.UID, GID: b.GID, Link: b.Link, SHA256: b.SHA256}) {
			changed = append(changed, fmt.Sprintf("%s: was %s (sha256 %.12s), now %s (sha256 %.12s)", b.Path, b.String(), b.SHA256, a.String(), a.SHA256))
		}
	}
	if len(seen) == 0 {
		return false, false, "no host file was stat'ed before the run"
	}
	if len(changed) > 0 {
		return true, false, "changed: " + strings.Join(changed, "; ")
	}
	return true, true, "unchanged: " + strings.Join(seen, ", ")
}

func checkInotifyBefore(in checkInput) (bool, bool, string) {
	i := in.host.Inotify
	if i == nil || i.Before == "" {
		return false, false, "not measured"
	}
	return true, i.Before == "ok", fmt.Sprintf("before the run, uid %d's inotify_init1: %s", i.Owner, i.Before)
}

func checkInotifyDuring(in checkInput) (bool, bool, string) {
	i := in.host.Inotify
	if i == nil || !i.Held || i.During == "" {
		return false, false, "the probe never said it held its instances, or the host did not measure"
	}
	return true, i.During == "ok", fmt.Sprintf("while the workload held %d inotify descriptors (host count), uid %d's inotify_init1: %s", i.WorkloadFDs, i.Owner, i.During)
}
