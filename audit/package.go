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
	TypePackageLockfile  = "package.lockfile"
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

// PackageLockfile records a lockfile as moat read it when the sandbox
// started, before the workload ran: what it admits for the whole run.
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

func (PackageLockfile) RecordType() string  { return TypePackageLockfile }
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
	case PackageFailed:
		s := fmt.Sprintf("id=%s status=%d reason=%s detail=%s", r.RequestID, r.Status, r.Reason, strconv.Quote(r.Detail))
		if r.Got != "" {
			s += " got=" + short(r.Got)
		}
		return s
	}
	return fmt.Sprintf("BUG: not a package record %T", r)
}
