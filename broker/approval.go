package broker

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/broker/wire"
	"github.com/moat-sandbox/moat/internal/strictjson"
	"github.com/moat-sandbox/moat/policy"
)

// Approvals (policy approvals, issue 14 item 1). A request that matches
// one of the policy's approvals.rules is held before its pre-effect
// record: approval.requested is durable, then the request waits for an
// operator's decision (moat approvals, through the run's control socket)
// or for approvals.timeout. Only an approval that names the held
// request's id and the digest of its exact canonical bytes (and, when
// given, its principal and run) lets it go: approval.decided is durable
// before the request's own pre-effect record, and the bytes that leave
// are checked against the approved digest once more. Anything else
// (a wrong digest, principal or run, a second decision on the same id,
// bytes that changed while held) is journaled as approval.substitution
// and the request, if still held, is refused: fail closed.

// Reasons of a held request's refusal.
const (
	ReasonApprovalDenied      Reason = "approval_denied"
	ReasonApprovalTimeout     Reason = "approval_timeout"
	ReasonApprovalSubstituted Reason = "approval_substituted"
)

// Approval command operations (ApprovalCommand.Op), as the control
// sockets take them.
const (
	ApprovalOpList    = "approvals.list"
	ApprovalOpShow    = "approvals.show"
	ApprovalOpApprove = "approvals.approve"
	ApprovalOpDeny    = "approvals.deny"
)

// MaxApprovalCommandBytes caps one approval command on a control socket.
const MaxApprovalCommandBytes = 4 << 10

// MaxShownRequestBytes caps the request bytes show returns; a longer
// request is shown cut, with its full digest and length.
const MaxShownRequestBytes = 256 << 10

// ApprovalCommand is one operator command about approvals.
type ApprovalCommand struct {
	Op        string `json:"op"`
	ID        string `json:"id,omitempty"`        // show, approve, deny
	Digest    string `json:"digest,omitempty"`    // approve (required), deny (optional)
	Principal string `json:"principal,omitempty"` // optional: must equal the held request's
	Run       string `json:"run,omitempty"`       // optional: must equal the run's id
}

var approvalCommandKeys = []string{"op", "id", "digest", "principal", "run"}

// ParseApprovalCommand decodes one command strictly: one JSON object of
// strings, no unknown or duplicate member, an op it knows, an id of the
// form moatapr_ and 24 hex digits where one is needed, a digest of 64
// lowercase hex digits, at most MaxApprovalCommandBytes.
func ParseApprovalCommand(data []byte) (ApprovalCommand, error) {
	var c ApprovalCommand
	if len(data) > MaxApprovalCommandBytes {
		return c, fmt.Errorf("approval command of %d bytes; at most %d", len(data), MaxApprovalCommandBytes)
	}
	tree, err := strictjson.Decode(data)
	if err != nil {
		return c, fmt.Errorf("approval command: %v", err)
	}
	m, ok := tree.(map[string]any)
	if !ok {
		return c, errors.New("approval command: not a JSON object")
	}
	fields := map[string]*string{"op": &c.Op, "id": &c.ID, "digest": &c.Digest, "principal": &c.Principal, "run": &c.Run}
	for k, v := range m {
		if !slices.Contains(approvalCommandKeys, k) {
			return c, fmt.Errorf("approval command: unknown member %s", quote(k))
		}
		s, ok := v.(string)
		if !ok {
			return c, fmt.Errorf("approval command: member %s is not a string", k)
		}
		*fields[k] = s
	}
	switch c.Op {
	case ApprovalOpList:
		if c.ID != "" || c.Digest != "" || c.Principal != "" || c.Run != "" {
			return c, errors.New("approval command: list takes no id, digest, principal or run")
		}
		return c, nil
	case ApprovalOpShow, ApprovalOpApprove, ApprovalOpDeny:
	default:
		return c, fmt.Errorf("approval command: unknown op %s (known: %s, %s, %s, %s)", quote(c.Op), ApprovalOpList, ApprovalOpShow, ApprovalOpApprove, ApprovalOpDeny)
	}
	if !validApprovalID(c.ID) {
		return c, fmt.Errorf("approval command: id %s is not an approval id (moatapr_ and 24 lowercase hex digits)", quote(c.ID))
	}
	if c.Op == ApprovalOpShow && (c.Digest != "" || c.Principal != "" || c.Run != "") {
		return c, errors.New("approval command: show takes only an id")
	}
	if c.Op == ApprovalOpApprove && c.Digest == "" {
		return c, errors.New("approval command: approve needs the request digest that show printed")
	}
	if c.Digest != "" && !isHex64(c.Digest) {
		return c, fmt.Errorf("approval command: digest %s is not 64 lowercase hex digits", quote(c.Digest))
	}
	if len(c.Principal) > 1024 || !utf8.ValidString(c.Principal) || len(c.Run) > 128 || !utf8.ValidString(c.Run) {
		return c, errors.New("approval command: principal or run too long or not UTF-8")
	}
	return c, nil
}

func validApprovalID(s string) bool {
	h, ok := strings.CutPrefix(s, "moatapr_")
	return ok && len(h) == 24 && isLowerHex(h)
}

func isHex64(s string) bool { return len(s) == 64 && isLowerHex(s) }

func isLowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// HeldRequest is what list and show tell the operator about one held
// request.
type HeldRequest struct {
	ID            string          `json:"id"`
	RequestID     string          `json:"request_id"`
	Road          string          `json:"road"`
	Target        string          `json:"target"`
	Name          string          `json:"name"`
	RequestSHA256 string          `json:"request_sha256"`
	RequestBytes  int64           `json:"request_bytes"`
	Principal     audit.Principal `json:"principal"`
	PrincipalLine string          `json:"principal_line"` // Principal.String(): what approve --principal takes
	Held          time.Time       `json:"held"`
	Expires       time.Time       `json:"expires"`
	// Request is the canonical request bytes (show only), cut at
	// MaxShownRequestBytes; Truncated says it was cut. Bytes that are not
	// valid UTF-8 (a binary service body) are shown as U+FFFD there, and
	// RequestBase64 then holds the exact bytes.
	Request       string `json:"request,omitempty"`
	RequestBase64 string `json:"request_base64,omitempty"`
	Truncated     bool   `json:"truncated,omitempty"`
}

// ApprovalReply is a control socket's answer to an ApprovalCommand.
type ApprovalReply struct {
	Held     []HeldRequest `json:"held,omitempty"` // list: all, show: the one
	Decision string        `json:"decision,omitempty"`
	Error    string        `json:"error,omitempty"`
}

// ApprovalDesk holds the run's requests that wait for a decision.
type ApprovalDesk struct {
	b       *Broker
	run     string
	sandbox string
	wait    time.Duration

	mu      sync.Mutex
	pending map[string]*held
	decided map[string]string // approval id → the decided request's digest
}

type held struct {
	info HeldRequest
	body []byte // the exact bytes that leave if approved
	done chan verdict
}

type verdict struct {
	decision string // audit.Approval*
	approver string
}

func newApprovalDesk(b *Broker) *ApprovalDesk {
	if t, ok := b.cfg.Tools.(approvalTools); ok {
		t.UseApprovals(b.holdTool)
	}
	return &ApprovalDesk{b: b, run: b.cfg.RunID, sandbox: b.cfg.Sandbox, wait: b.cfg.Policy.Approvals.Wait(),
		pending: map[string]*held{}, decided: map[string]string{}}
}

// Approvals returns the run's approval desk, or nil when the policy has
// no approval rules.
func (b *Broker) Approvals() *ApprovalDesk { return b.approvals }

func newApprovalID() string {
	var r [12]byte
	rand.Read(r[:])
	return "moatapr_" + hex.EncodeToString(r[:])
}

// hold journals approval.requested for body and waits for the decision.
// It returns nil when the request may leave (approved, and body still
// the approved bytes), else the refusal to answer.
func (d *ApprovalDesk) hold(x *exchange, road, target, name string, body []byte) *frontError {
	return d.holdFor(x.id, d.b.attribution(x), road, target, name, body, nil)
}

// approvalTools is a tool gateway that holds calls for approval
// (broker/tools.Handler): hold returns "" when the call may go, else the
// refusal's reason and message.
type approvalTools interface {
	UseApprovals(hold func(ctx context.Context, callID, server, tool string, args []byte) (reason, msg string))
}

// holdTool holds a tool call that matches a rule of road tool; the
// digest covers the canonical arguments (tool.requested's
// arguments_sha256).
func (b *Broker) holdTool(ctx context.Context, callID, server, tool string, args []byte) (reason, msg string) {
	d := b.approvals
	if d == nil || !b.cfg.Policy.Approvals.MatchTool(server, tool, len(args)) {
		return "", ""
	}
	att, ok := AttributionFrom(ctx)
	if !ok {
		att = audit.Attribution{Status: boundary.AttributionUnavailable, Reason: "no attribution"}
	}
	if fe := d.holdFor(callID, att, policy.RoadTool, server, tool, args, nil); fe != nil {
		return string(fe.Code), fe.Msg
	}
	return "", ""
}

// ServiceApprovalBytes are the bytes an approval of a service request
// covers, and show prints: the method, a space, the path (and "?" and
// the query when there is one), an LF, "headers_sha256: " and the
// service.requested record's headers_sha256, two LFs, and the exact body
// sent. Its digest binds the approval to everything the workload chose.
func ServiceApprovalBytes(method, path, query, headersSHA256 string, body []byte) []byte {
	target := path
	if query != "" {
		target += "?" + query
	}
	out := make([]byte, 0, len(method)+len(target)+len(headersSHA256)+len(body)+24)
	out = fmt.Appendf(out, "%s %s\nheaders_sha256: %s\n\n", method, target, headersSHA256)
	return append(out, body...)
}

// holdService holds a request to a brokered service that matches a rule
// of road service, and checks once approved that what is sent is still
// what was approved.
func (b *Broker) holdService(x *exchange, service, method, path, query, headersSHA256 string, body []byte) *frontError {
	d := b.approvals
	if d == nil || !b.cfg.Policy.Approvals.MatchService(service, len(body)) {
		return nil
	}
	leaving := func() []byte { return ServiceApprovalBytes(method, path, query, headersSHA256, body) }
	return d.holdFor(x.id, b.attribution(x), policy.RoadService, service, method+" "+path, leaving(), leaving)
}

// holdFor holds the request requestID of the process att.
// body is what the approval covers; leaving, when set, makes it again
// from what is about to be sent, after the decision (else body itself is
// checked again).
func (d *ApprovalDesk) holdFor(requestID string, att audit.Attribution, road, target, name string, body []byte, leaving func() []byte) *frontError {
	b := d.b
	sum := sha256.Sum256(body)
	now := time.Now()
	h := &held{body: body, done: make(chan verdict, 1), info: HeldRequest{
		ID: newApprovalID(), RequestID: requestID, Road: road, Target: target, Name: name,
		RequestSHA256: hex.EncodeToString(sum[:]), RequestBytes: int64(len(body)),
		Principal: audit.Principal{Run: d.run, Sandbox: d.sandbox, Attribution: att},
		Held:      now.UTC(), Expires: now.Add(d.wait).UTC(),
	}}
	h.info.PrincipalLine = h.info.Principal.String()
	if _, ok := b.append(audit.ApprovalRequested{ApprovalID: h.info.ID, RequestID: requestID, Road: road, Target: target, Name: name,
		RequestSHA256: h.info.RequestSHA256, RequestBytes: h.info.RequestBytes, Principal: h.info.Principal, TimeoutMS: d.wait.Milliseconds()}); !ok {
		return refuse(ReasonAuditFailure, 503, "the run's audit journal failed, so this request was not held for approval and not sent")
	}
	d.mu.Lock()
	d.pending[h.info.ID] = h
	d.mu.Unlock()
	// The operator must learn that a request waits: Warn, printed at the
	// default level.
	b.log.LogAttrs(context.Background(), slog.LevelWarn, "moat.approval held",
		slog.String("approval_id", h.info.ID), slog.String("request_id", requestID), slog.String("road", road),
		slog.String("target", target), slog.String("name", name), slog.String("request_sha256", h.info.RequestSHA256),
		slog.String("principal", h.info.PrincipalLine), slog.String("expires", h.info.Expires.Format(time.RFC3339)))
	timer := time.NewTimer(d.wait)
	defer timer.Stop()
	var v verdict
	select {
	case v = <-h.done:
	case <-timer.C:
		v = d.end(h, audit.ApprovalTimedOut)
	case <-b.ctx.Done():
		v = d.end(h, audit.ApprovalCancelled)
	}
	switch v.decision {
	case audit.ApprovalApproved:
	case audit.ApprovalDenied:
		return refuse(ReasonApprovalDenied, 403, "the operator denied this request (approval %s)", h.info.ID)
	case audit.ApprovalTimedOut:
		return refuse(ReasonApprovalTimeout, 403, "no operator decided this request within approvals.timeout (%s; approval %s); it was not sent", d.wait, h.info.ID)
	case audit.ApprovalSubstituted:
		return refuse(ReasonApprovalSubstituted, 403, "the approval given for this request (approval %s) did not match it; it was not sent", h.info.ID)
	default:
		return refuse(ReasonRunFailed, 503, "the run ended while this request was held for approval (approval %s); it was not sent", h.info.ID)
	}
	// The approved bytes are the bytes that leave.
	if leaving != nil {
		body = leaving()
	}
	if now := sha256.Sum256(body); hex.EncodeToString(now[:]) != h.info.RequestSHA256 {
		got := hex.EncodeToString(now[:])
		d.record(audit.ApprovalSubstitution{ApprovalID: h.info.ID, Reason: audit.SubstitutionBytes, RequestSHA256: h.info.RequestSHA256,
			PresentedSHA256: got, Detail: "the request bytes about to leave are not the approved bytes; the request was refused"})
		return refuse(ReasonApprovalSubstituted, 403, "this request changed after it was approved (approval %s); it was not sent", h.info.ID)
	}
	return nil
}

// end decides h without an operator (timeout, cancellation), unless an
// operator decided it first; it returns the verdict either way.
func (d *ApprovalDesk) end(h *held, decision string) verdict {
	d.mu.Lock()
	if d.pending[h.info.ID] != h {
		d.mu.Unlock()
		return <-h.done // decided concurrently: the verdict is on its way
	}
	delete(d.pending, h.info.ID)
	d.decided[h.info.ID] = h.info.RequestSHA256
	d.record(audit.ApprovalDecided{ApprovalID: h.info.ID, RequestID: h.info.RequestID, Decision: decision, RequestSHA256: h.info.RequestSHA256})
	d.mu.Unlock()
	return verdict{decision: decision}
}

// record journals an approval record and logs its one line:
// "moat.approval decided" (Info when approved, else Warn) or
// "moat.approval substitution" (Warn). It reports whether the record
// is in the journal.
func (d *ApprovalDesk) record(r audit.Record) bool {
	_, ok := d.b.append(r)
	switch r := r.(type) {
	case audit.ApprovalDecided:
		level := slog.LevelWarn
		if r.Decision == audit.ApprovalApproved {
			level = slog.LevelInfo
		}
		d.b.log.LogAttrs(context.Background(), level, "moat.approval decided", slog.String("approval_id", r.ApprovalID),
			slog.String("request_id", r.RequestID), slog.String("decision", r.Decision), slog.String("request_sha256", r.RequestSHA256),
			slog.String("approver", r.Approver), slog.Bool("journaled", ok))
	case audit.ApprovalSubstitution:
		d.b.log.LogAttrs(context.Background(), slog.LevelWarn, "moat.approval substitution", slog.String("approval_id", r.ApprovalID),
			slog.String("reason", r.Reason), slog.String("request_sha256", r.RequestSHA256), slog.String("presented_sha256", r.PresentedSHA256),
			slog.String("approver", r.Approver), slog.String("detail", r.Detail), slog.Bool("journaled", ok))
	}
	return ok
}

// List returns the held requests, oldest first.
func (d *ApprovalDesk) List() []HeldRequest {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]HeldRequest, 0, len(d.pending))
	for _, h := range d.pending {
		out = append(out, h.info)
	}
	slices.SortFunc(out, func(a, b HeldRequest) int {
		if c := a.Held.Compare(b.Held); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out
}

// Show returns one held request with its canonical bytes.
func (d *ApprovalDesk) Show(id string) (HeldRequest, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	h, ok := d.pending[id]
	if !ok {
		return HeldRequest{}, false
	}
	info := h.info
	body := h.body
	if len(body) > MaxShownRequestBytes {
		body, info.Truncated = body[:MaxShownRequestBytes], true
	}
	info.Request = strings.ToValidUTF8(string(body), "\uFFFD")
	if !utf8.Valid(body) {
		info.RequestBase64 = base64.StdEncoding.EncodeToString(body)
	}
	return info, true
}

// Do carries out one command from approver (the control socket's peer,
// "uid U pid P").
func (d *ApprovalDesk) Do(c ApprovalCommand, approver string) ApprovalReply {
	switch c.Op {
	case ApprovalOpList:
		return ApprovalReply{Held: d.List()}
	case ApprovalOpShow:
		h, ok := d.Show(c.ID)
		if !ok {
			return ApprovalReply{Error: d.notHeld(c.ID)}
		}
		return ApprovalReply{Held: []HeldRequest{h}}
	case ApprovalOpApprove, ApprovalOpDeny:
		dec, err := d.decide(c, approver)
		if err != nil {
			return ApprovalReply{Error: err.Error()}
		}
		return ApprovalReply{Decision: dec}
	}
	return ApprovalReply{Error: fmt.Sprintf("unknown op %s", quote(c.Op))}
}

func (d *ApprovalDesk) notHeld(id string) string {
	d.mu.Lock()
	_, was := d.decided[id]
	d.mu.Unlock()
	if was {
		return fmt.Sprintf("approval %s was already decided", id)
	}
	return fmt.Sprintf("no held request has approval id %s", id)
}

// decide approves or denies a held request. An approval must name the
// held request's digest (and principal and run, when given); a mismatch
// is a substitution: journaled, and the held request is refused. A
// decision on an id already decided is a replay: journaled and refused.
func (d *ApprovalDesk) decide(c ApprovalCommand, approver string) (string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	h, ok := d.pending[c.ID]
	if !ok {
		if digest, was := d.decided[c.ID]; was {
			d.record(audit.ApprovalSubstitution{ApprovalID: c.ID, Reason: audit.SubstitutionReplay, RequestSHA256: digest,
				PresentedSHA256: c.Digest, Approver: approver, Detail: "approval " + c.ID + " was already decided; an approval is single use"})
			return "", fmt.Errorf("refused: approval %s was already decided; an approval is single use (journaled as a substitution)", c.ID)
		}
		return "", fmt.Errorf("no held request has approval id %s", c.ID)
	}
	var reason, detail string
	switch {
	case c.Digest != "" && c.Digest != h.info.RequestSHA256:
		reason, detail = audit.SubstitutionDigest, "the digest given is not the held request's"
	case c.Principal != "" && c.Principal != h.info.PrincipalLine:
		reason, detail = audit.SubstitutionPrincipal, "the principal given is not the held request's: "+wire.BoundTo(c.Principal, 256)
	case c.Run != "" && c.Run != d.run:
		reason, detail = audit.SubstitutionRun, "the run given is not this run: "+wire.BoundTo(c.Run, 128)
	}
	decision := audit.ApprovalApproved
	if c.Op == ApprovalOpDeny {
		decision = audit.ApprovalDenied
	}
	if reason != "" {
		d.record(audit.ApprovalSubstitution{ApprovalID: c.ID, Reason: reason, RequestSHA256: h.info.RequestSHA256,
			PresentedSHA256: c.Digest, Approver: approver, Detail: detail + "; the held request was refused"})
		decision = audit.ApprovalSubstituted
	}
	delete(d.pending, c.ID)
	d.decided[c.ID] = h.info.RequestSHA256
	rec := audit.ApprovalDecided{ApprovalID: c.ID, RequestID: h.info.RequestID, Decision: decision, RequestSHA256: h.info.RequestSHA256, Approver: approver}
	if ok := d.record(rec); !ok && decision == audit.ApprovalApproved {
		// Not durable: the request does not leave.
		h.done <- verdict{decision: audit.ApprovalCancelled, approver: approver}
		return "", errors.New("the journal failed; the request was not sent")
	}
	h.done <- verdict{decision: decision, approver: approver}
	if reason != "" {
		return "", fmt.Errorf("refused: %s (%s); the held request %s was refused and not sent (journaled as a substitution)", detail, reason, c.ID)
	}
	return decision, nil
}
