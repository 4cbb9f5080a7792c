package audit

import (
	"fmt"
	"strconv"
)

// Package registry records (egress.packages, issue 19). A request the
// workload's package manager sends to /pkg/<kind>/... that the broker
// admits is journaled as package.requested, durable before anything is
// fetched from the upstream, and closed by exactly one package.completed
// (the artifact or metadata was served) or package.failed (nothing was
// served: the upstream failed, or the artifact's bytes did not match the
// lockfile's digest). A request the broker does not admit (a name or
// version no lockfile pins, a publish, a method other than GET)
// is journaled as package.refused and never reaches the upstream.
const (
	TypePackageRequested = "package.requested"
	TypePackageCompleted = "package.completed"
	TypePackageRefused   = "package.refused"
	TypePackageFailed    = "package.failed"
	TypePackageLockfile  = "package.lockfile" // read only: older journals' form of run.started.lockfiles
	TypePackageReload    = "package.reload"
)

// Outcomes of a package.reload record.
const (
	ReloadApplied = "applied" // the lockfiles' new pins are in force from the next request on
	ReloadRefused = "refused" // the old pins stay in force
)

// Artifact kinds of a package.requested record.
const (
	PackageArtifactTarball  = "tarball"  // the package itself, checked against the lockfile's digest
	PackageArtifactMetadata = "metadata" // resolution metadata (an npm packument), filtered to the pins
	PackageArtifactZip      = "zip"      // a Go module zip, checked against go.sum's h1 hash
	PackageArtifactGoMod    = "go.mod"   // a Go module's go.mod, checked against go.sum's h1 hash
	PackageArtifactFile     = "file"     // a PyPI distribution file, checked against the requirements' sha256
)

// PackageRequested is the pre-effect record of one package fetch.
type PackageRequested struct {
	RequestID string `json:"request_id"`
	Kind      string `json:"kind"` // the registry kind, e.g. "npm"
	Artifact  string `json:"artifact"`
	Name      string `json:"name"`
	// Version is the pinned version fetched (absent for metadata).
	Version string `json:"version,omitempty"`
	// Expected is the lockfile's digest the bytes must match, in the
	// lockfile's own form (npm: "sha512-<base64>", go.sum: "h1:<base64>");
	// absent for metadata.
	Expected string `json:"expected,omitempty"`
	// Path is the path fetched below the upstream.
	Path        string      `json:"path"`
	Lockfile    string      `json:"lockfile,omitempty"` // the lockfile that pins it (absent for metadata)
	Attribution Attribution `json:"attribution"`
}

// PackageCompleted records an artifact or metadata served.
type PackageCompleted struct {
	RequestID string `json:"request_id"`
	Status    int    `json:"status"`
	// BodySHA256 and BodyBytes cover the exact bytes served.
	BodySHA256 string `json:"body_sha256"`
	BodyBytes  int64  `json:"body_bytes"`
}

// PackageRefused records a request the broker refused; nothing was
// fetched.
type PackageRefused struct {
	RequestID   string      `json:"request_id"`
	Kind        string      `json:"kind,omitempty"`
	Method      string      `json:"method"`
	Name        string      `json:"name,omitempty"`
	Reason      string      `json:"reason"`
	Detail      string      `json:"detail"`
	Attribution Attribution `json:"attribution"`
}

// PackageFailed closes a package.requested whose answer was not served.
type PackageFailed struct {
	RequestID string `json:"request_id"`
	Status    int    `json:"status,omitempty"` // the upstream's status, when it answered
	Reason    string `json:"reason"`
	Detail    string `json:"detail"`
	// Got is the digest of the bytes received, in Expected's form, when
	// they did not match.
	Got string `json:"got,omitempty"`
}

// PackageLockfile is a lockfile as moat read it when the sandbox
// started, before the workload ran (an element of run.started's
// lockfiles): what it admits until an operator reloads it. Journals
// written before run.started carried them hold one package.lockfile
// record of this form per lockfile after boundary.confirmed; moat no
// longer writes that record, and reads it.
type PackageLockfile struct {
	Kind   string `json:"kind"`   // the grant's registry kind
	Path   string `json:"path"`   // the lockfile on the host
	SHA256 string `json:"sha256"` // of the bytes read
	Pins   int    `json:"pins"`   // artifacts it pins that the registry serves
	// Trust is "pinned" (outside every writable grant, or its sha256
	// pinned by the policy) or "workspace" (the workload may have written
	// it; the policy said so).
	Trust string `json:"trust"`
}

// PackageReload records an operator's explicit re-read of the lockfiles
// of a running sandbox (moat sandbox reload-lockfiles). It is durable
// before the new pins take effect. Applied: every lockfile of the set
// in force was read again, by the same rule as at start (no symlink
// followed, the trust rule, lockfile_sha256), and its new digest
// admits from the next request on. Refused: a lockfile could not be
// read, failed the trust rule or did not parse; the set in force is
// unchanged, and reason and detail say why.
type PackageReload struct {
	// Requester is who asked, from the control socket's peer
	// credentials ("uid U pid P").
	Requester string                  `json:"requester"`
	Outcome   string                  `json:"outcome"` // ReloadApplied or ReloadRefused
	Lockfiles []PackageLockfileChange `json:"lockfiles"`
	Reason    string                  `json:"reason,omitempty"` // refused only
	Detail    string                  `json:"detail,omitempty"`
}

// PackageLockfileChange is one lockfile of a package.reload.
type PackageLockfileChange struct {
	Kind string `json:"kind"`
	Path string `json:"path"`
	// OldSHA256 is the digest in force before (run.started's, or the last
	// applied reload's); SHA256 is that of the bytes read now, absent
	// when they could not be read.
	OldSHA256 string `json:"old_sha256"`
	SHA256    string `json:"sha256,omitempty"`
	Pins      int    `json:"pins,omitempty"` // artifacts the new bytes pin (absent when refused)
	Trust     string `json:"trust"`
}

func (PackageLockfile) RecordType() string  { return TypePackageLockfile }
func (PackageReload) RecordType() string    { return TypePackageReload }
func (PackageRequested) RecordType() string { return TypePackageRequested }
func (PackageCompleted) RecordType() string { return TypePackageCompleted }
func (PackageRefused) RecordType() string   { return TypePackageRefused }
func (PackageFailed) RecordType() string    { return TypePackageFailed }

func init() {
	recordTypes[TypePackageRequested] = decodeAs[PackageRequested]
	recordTypes[TypePackageCompleted] = decodeAs[PackageCompleted]
	recordTypes[TypePackageRefused] = decodeAs[PackageRefused]
	recordTypes[TypePackageFailed] = decodeAs[PackageFailed]
	recordTypes[TypePackageLockfile] = decodeAs[PackageLockfile]
	recordTypes[TypePackageReload] = decodeAs[PackageReload]
}

// lockfileSet follows the lockfile digests in force through a journal:
// run.started's lockfiles, then each applied package.reload. The writer
// and the verifier both check every record against it (check), so that
// a reload always names the digest it replaces.
type lockfileSet map[string]string // path -> sha256

// check reports why r cannot follow the records that made s, or nil.
func (s lockfileSet) check(r Record) error {
	switch r := r.(type) {
	case RunStarted:
		seen := map[string]bool{}
		for i, lf := range r.Lockfiles {
			switch {
			case lf.Kind == "" || lf.Path == "":
				return fmt.Errorf("%s.lockfiles[%d]: kind and path are required", TypeRunStarted, i)
			case !isSHA256Hex(lf.SHA256):
				return fmt.Errorf("%s.lockfiles[%d]: sha256 %q is not 64 lower-case hex digits", TypeRunStarted, i, lf.SHA256)
			case lf.Trust != "pinned" && lf.Trust != "workspace":
				return fmt.Errorf("%s.lockfiles[%d]: trust %q is not pinned or workspace", TypeRunStarted, i, lf.Trust)
			case lf.Pins < 0:
				return fmt.Errorf("%s.lockfiles[%d]: pins %d", TypeRunStarted, i, lf.Pins)
			case seen[lf.Path]:
				return fmt.Errorf("%s.lockfiles[%d]: %s is listed twice", TypeRunStarted, i, lf.Path)
			}
			seen[lf.Path] = true
		}
	case PackageReload:
		if r.Requester == "" {
			return fmt.Errorf("%s: no requester", TypePackageReload)
		}
		if r.Outcome != ReloadApplied && r.Outcome != ReloadRefused {
			return fmt.Errorf("%s: outcome %q is not %s or %s", TypePackageReload, r.Outcome, ReloadApplied, ReloadRefused)
		}
		if (r.Outcome == ReloadRefused) != (r.Reason != "") {
			return fmt.Errorf("%s: a reason goes with outcome %s, and only with it", TypePackageReload, ReloadRefused)
		}
		if len(r.Lockfiles) != len(s) || len(s) == 0 {
			return fmt.Errorf("%s: %d lockfiles, but %d are in force", TypePackageReload, len(r.Lockfiles), len(s))
		}
		seen := map[string]bool{}
		for i, lf := range r.Lockfiles {
			old, ok := s[lf.Path]
			switch {
			case !ok || seen[lf.Path]:
				return fmt.Errorf("%s.lockfiles[%d]: %s is not a lockfile in force, or is listed twice", TypePackageReload, i, lf.Path)
			case lf.OldSHA256 != old:
				return fmt.Errorf("%s.lockfiles[%d]: old_sha256 %s, but %s is in force for %s", TypePackageReload, i, lf.OldSHA256, old, lf.Path)
			case lf.SHA256 != "" && !isSHA256Hex(lf.SHA256), r.Outcome == ReloadApplied && lf.SHA256 == "":
				return fmt.Errorf("%s.lockfiles[%d]: sha256 %q is not 64 lower-case hex digits", TypePackageReload, i, lf.SHA256)
			case lf.Trust != "pinned" && lf.Trust != "workspace" || lf.Kind == "" || lf.Pins < 0:
				return fmt.Errorf("%s.lockfiles[%d]: kind %q, trust %q, pins %d", TypePackageReload, i, lf.Kind, lf.Trust, lf.Pins)
			}
			seen[lf.Path] = true
		}
	}
	return nil
}

// apply moves s past r (which check accepted).
func (s lockfileSet) apply(r Record) {
	switch r := r.(type) {
	case RunStarted:
		for _, lf := range r.Lockfiles {
			s[lf.Path] = lf.SHA256
		}
	case PackageReload:
		if r.Outcome == ReloadApplied {
			for _, lf := range r.Lockfiles {
				s[lf.Path] = lf.SHA256
			}
		}
	}
}

func isSHA256Hex(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !('0' <= s[i] && s[i] <= '9' || 'a' <= s[i] && s[i] <= 'f') {
			return false
		}
	}
	return true
}

// describePackage is audit show's line for a package record.
func describePackage(r Record) string {
	switch r := r.(type) {
	case PackageRequested:
		s := fmt.Sprintf("id=%s kind=%s %s %s", r.RequestID, r.Kind, r.Artifact, strconv.Quote(r.Name))
		if r.Version != "" {
			s += " version=" + strconv.Quote(r.Version)
		}
		if r.Expected != "" {
			s += " expected=" + short(r.Expected)
		}
		s += " path=" + strconv.Quote(r.Path)
		if r.Lockfile != "" {
			s += " lockfile=" + strconv.Quote(r.Lockfile)
		}
		return s + " " + describeAttribution(r.Attribution)
	case PackageCompleted:
		return fmt.Sprintf("id=%s status=%d body=%s bytes=%d", r.RequestID, r.Status, short(r.BodySHA256), r.BodyBytes)
	case PackageRefused:
		return fmt.Sprintf("id=%s kind=%s method=%s name=%s reason=%s %s detail=%s", r.RequestID, r.Kind, strconv.Quote(r.Method), strconv.Quote(r.Name), r.Reason, describeAttribution(r.Attribution), strconv.Quote(r.Detail))
	case PackageLockfile:
		return fmt.Sprintf("kind=%s path=%s sha256=%s pins=%d trust=%s", r.Kind, strconv.Quote(r.Path), short(r.SHA256), r.Pins, r.Trust)
	case PackageReload:
		s := fmt.Sprintf("outcome=%s requester=%s", r.Outcome, strconv.Quote(r.Requester))
		for _, lf := range r.Lockfiles {
			to := "unread"
			if lf.SHA256 != "" {
				to = short(lf.SHA256)
			}
			s += fmt.Sprintf(" %s:%s->%s", strconv.Quote(lf.Path), short(lf.OldSHA256), to)
		}
		if r.Reason != "" {
			s += " reason=" + r.Reason + " detail=" + strconv.Quote(r.Detail)
		}
		return s
	case PackageFailed:
		s := fmt.Sprintf("id=%s status=%d reason=%s detail=%s", r.RequestID, r.Status, r.Reason, strconv.Quote(r.Detail))
		if r.Got != "" {
			s += " got=" + short(r.Got)
		}
		return s
	}
	return fmt.Sprintf("BUG: not a package record %T", r)
}
