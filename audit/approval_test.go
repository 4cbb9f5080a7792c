package audit

import (
	"bytes"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/confirmation"
)

func approvalRecords() []Record {
	att := Attribution{Status: confirmation.AttributionResolved, PID: 4242, Executable: "/usr/bin/python3", SHA256: strings.Repeat("c", 64)}
	return []Record{
		ApprovalRequested{ApprovalID: "moatapr_000000000000000000000001", RequestID: "moatreq_000000000000000000000002", Road: "inference",
			Target: "anthropic", Name: "claude-x", RequestSHA256: strings.Repeat("d", 64), RequestBytes: 120,
			Principal: Principal{Run: "run-1", Sandbox: "dev", Attribution: att}, TimeoutMS: 300000},
		ApprovalSubstitution{ApprovalID: "moatapr_000000000000000000000001", Reason: SubstitutionDigest, RequestSHA256: strings.Repeat("d", 64),
			PresentedSHA256: strings.Repeat("e", 64), Approver: "uid 1000 pid 77", Detail: "the digest given is not the held request's"},
		ApprovalDecided{ApprovalID: "moatapr_000000000000000000000001", RequestID: "moatreq_000000000000000000000002", Decision: ApprovalSubstituted,
			RequestSHA256: strings.Repeat("d", 64), Approver: "uid 1000 pid 77"},
	}
}

// Example_approvalRequested prints the payloads of an approval held,
// a substitution and the decision it caused, with the key and clock
// pinned (doc.go shows them).
func Example_approvalRequested() {
	printPayloads(approvalRecords()...)
	// Output:
	// {"approval_id":"moatapr_000000000000000000000001","name":"claude-x","prev":"55898897234ad4da482306cdb6528b39c2917bfbe7a2093e933803a43f7ee49b","principal":{"attribution":{"executable":"/usr/bin/python3","pid":4242,"sha256":"cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc","status":"resolved"},"run":"run-1","sandbox":"dev"},"request_bytes":120,"request_id":"moatreq_000000000000000000000002","request_sha256":"dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd","road":"inference","run":"run-1","seq":3,"target":"anthropic","time":"2026-12-01T02:00:00Z","timeout_ms":300000,"type":"approval.requested","v":1}
	// {"approval_id":"moatapr_000000000000000000000001","approver":"uid 1000 pid 77","detail":"the digest given is not the held request's","presented_sha256":"eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee","prev":"90624a2ca79be62979fcc34d115df41252411afd227ef73086dd0fc35ff49dd4","reason":"digest_mismatch","request_sha256":"dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd","run":"run-1","seq":4,"time":"2026-12-01T02:00:00Z","type":"approval.substitution","v":1}
	// {"approval_id":"moatapr_000000000000000000000001","approver":"uid 1000 pid 77","decision":"substituted","prev":"c38857f9798e4f23c40cc4db24cfc62b12f0bc40c950668c9909eff8e9bbe666","request_id":"moatreq_000000000000000000000002","request_sha256":"dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd","run":"run-1","seq":5,"time":"2026-12-01T02:00:00Z","type":"approval.decided","v":1}
}

// TestApprovalRecords: each approval record round-trips through the
// journal (the verifier re-encodes it), audit show describes it, the
// timeline marks a substitution and no other approval record.
func TestApprovalRecords(t *testing.T) {
	journal := checkRecords(t, recordsCase{records: approvalRecords()}).journal
	want := []string{
		`approval=moatapr_000000000000000000000001 id=moatreq_000000000000000000000002 road=inference target="anthropic" name="claude-x" request=dddddddddddd bytes=120 timeout_ms=300000 run=run-1 sandbox=dev pid=4242 exe=/usr/bin/python3`,
		`approval=moatapr_000000000000000000000001 reason=digest_mismatch request=dddddddddddd presented=eeeeeeeeeeee approver="uid 1000 pid 77" detail=`,
		`approval=moatapr_000000000000000000000001 id=moatreq_000000000000000000000002 decision=substituted request=dddddddddddd approver="uid 1000 pid 77"`,
	}
	for i, r := range approvalRecords() {
		if got := Describe(r); !strings.HasPrefix(got, want[i]) {
			t.Errorf("Describe %T:\n got %s\nwant %s", r, got, want[i])
		}
	}
	var tl bytes.Buffer
	WriteTimeline(&tl, journal)
	if n := strings.Count(tl.String(), "!! "); n != 1 || !strings.Contains(tl.String(), "SUBSTITUTION approval.substitution") {
		t.Errorf("timeline marks %d lines, want the substitution only:\n%s", n, tl.String())
	}
}
