package audit

import (
	"fmt"
	"strconv"
)

// Approval records (approvals in the policy, issue 14 item 1). A request
// that matches an approval rule is held: approval.requested is durable
// before anyone can decide it; approval.decided is durable before an
// approved request leaves (its own pre-effect record follows) and before
// a denied, timed-out or substituted one is refused. An attempt to decide
// an approval with other bytes, another principal, another run, or a
// second time, is journaled as approval.substitution.
const (
	TypeApprovalRequested    = "approval.requested"
	TypeApprovalDecided      = "approval.decided"
	TypeApprovalSubstitution = "approval.substitution"
)

// Approval decisions (approval.decided's decision).
const (
	ApprovalApproved    = "approved"
	ApprovalDenied      = "denied"
	ApprovalTimedOut    = "timed_out"
	ApprovalSubstituted = "substituted" // the request was refused after a substitution
	ApprovalCancelled   = "cancelled"   // the run ended while the request was held
)

// Substitution reasons (approval.substitution's reason).
const (
	SubstitutionDigest    = "digest_mismatch"    // the digest given is not the held request's
	SubstitutionPrincipal = "principal_mismatch" // the principal given is not the held request's
	SubstitutionRun       = "run_mismatch"       // the run given is not this run
	SubstitutionReplay    = "replay"             // the approval was already decided
	SubstitutionBytes     = "bytes_changed"      // the bytes about to leave are not the approved ones
)

// Principal is who a held request is for: the run, the sandbox (absent
// for moat run) and the process that made it.
type Principal struct {
	Run         string      `json:"run"`
	Sandbox     string      `json:"sandbox,omitempty"`
	Attribution Attribution `json:"attribution"`
}

// String is the principal in one line, as moat approvals show prints it
// and approve --principal takes it.
func (p Principal) String() string {
	s := "run=" + p.Run
	if p.Sandbox != "" {
		s += " sandbox=" + p.Sandbox
	}
	return s + " " + describeAttribution(p.Attribution)
}

// ApprovalRequested records a held request.
type ApprovalRequested struct {
	ApprovalID string `json:"approval_id"` // "moatapr_" and 24 hex digits, unique in the run
	RequestID  string `json:"request_id"`
	Road       string `json:"road"`   // inference, tool or service
	Target     string `json:"target"` // the provider, server or service
	Name       string `json:"name"`   // the model, tool or path
	// RequestSHA256 and RequestBytes cover the exact canonical request
	// bytes that leave if the request is approved.
	RequestSHA256 string    `json:"request_sha256"`
	RequestBytes  int64     `json:"request_bytes"`
	Principal     Principal `json:"principal"`
	TimeoutMS     int64     `json:"timeout_ms"`
}

// ApprovalDecided records the decision on a held request.
type ApprovalDecided struct {
	ApprovalID    string `json:"approval_id"`
	RequestID     string `json:"request_id"`
	Decision      string `json:"decision"` // one of the Approval* decisions
	RequestSHA256 string `json:"request_sha256"`
	// Approver is who decided, as the control socket saw the peer
	// ("uid 1000 pid 4242"); absent for a timeout or a cancellation.
	Approver string `json:"approver,omitempty"`
	Detail   string `json:"detail,omitempty"`
}

// ApprovalSubstitution records a refused attempt to decide an approval.
type ApprovalSubstitution struct {
	ApprovalID string `json:"approval_id"`
	Reason     string `json:"reason"` // one of the Substitution* reasons
	// RequestSHA256 is the held (or decided) request's digest,
	// PresentedSHA256 the digest given or, for bytes_changed, the digest
	// of the bytes that were about to leave.
	RequestSHA256   string `json:"request_sha256"`
	PresentedSHA256 string `json:"presented_sha256,omitempty"`
	Approver        string `json:"approver,omitempty"`
	Detail          string `json:"detail"`
}

func (ApprovalRequested) RecordType() string    { return TypeApprovalRequested }
func (ApprovalDecided) RecordType() string      { return TypeApprovalDecided }
func (ApprovalSubstitution) RecordType() string { return TypeApprovalSubstitution }

// describeApproval is audit show's line for an approval record.
func describeApproval(r Record) string {
	switch r := r.(type) {
	case ApprovalRequested:
		return fmt.Sprintf("approval=%s id=%s road=%s target=%s name=%s request=%s bytes=%d timeout_ms=%d %s",
			r.ApprovalID, r.RequestID, r.Road, strconv.Quote(r.Target), strconv.Quote(r.Name), short(r.RequestSHA256), r.RequestBytes, r.TimeoutMS, r.Principal)
	case ApprovalDecided:
		s := fmt.Sprintf("approval=%s id=%s decision=%s request=%s", r.ApprovalID, r.RequestID, r.Decision, short(r.RequestSHA256))
		if r.Approver != "" {
			s += " approver=" + strconv.Quote(r.Approver)
		}
		if r.Detail != "" {
			s += " detail=" + strconv.Quote(r.Detail)
		}
		return s
	case ApprovalSubstitution:
		return fmt.Sprintf("approval=%s reason=%s request=%s presented=%s approver=%s detail=%s",
			r.ApprovalID, r.Reason, short(r.RequestSHA256), short(r.PresentedSHA256), strconv.Quote(r.Approver), strconv.Quote(r.Detail))
	}
	return fmt.Sprintf("BUG: not an approval record %T", r)
}

func init() {
	recordTypes[TypeApprovalRequested] = decodeAs[ApprovalRequested]
	recordTypes[TypeApprovalDecided] = decodeAs[ApprovalDecided]
	recordTypes[TypeApprovalSubstitution] = decodeAs[ApprovalSubstitution]
}
