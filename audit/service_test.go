package audit

import (
	"bytes"
	"strings"
	"testing"
)

// serviceRecords are one of each service record, after boundary.confirmed.
func serviceRecords() []Record {
	attr := Attribution{Status: "resolved", PID: 4242, Executable: "/usr/bin/git", SHA256: strings.Repeat("c", 64)}
	return []Record{
		ServiceRefused{RequestID: "moatreq_000000000000000000000001", Service: "github", Method: "GET",
			Reason: "service_path_not_allowed", Detail: `moat: refused: path "/other/repo.git/info/refs" is not allowed for service "github"`, Attribution: attr},
		ServiceRequested{RequestID: "moatreq_000000000000000000000002", Service: "github", Method: "GET", Path: "/owner/repo.git/info/refs",
			Query: "service=git-upload-pack", HeadersSHA256: strings.Repeat("d", 64), BodySHA256: strings.Repeat("e", 64), Attribution: attr},
		ServiceCompleted{RequestID: "moatreq_000000000000000000000002", Status: 200, BodySHA256: strings.Repeat("f", 64), BodyBytes: 11342},
		ServiceRequested{RequestID: "moatreq_000000000000000000000003", Service: "github", Method: "POST", Path: "/owner/repo.git/git-upload-pack",
			HeadersSHA256: strings.Repeat("1", 64), BodySHA256: strings.Repeat("2", 64), BodyBytes: 4100,
			ContentEncoding: "gzip", EncodedSHA256: strings.Repeat("3", 64), EncodedBytes: 720, Attribution: attr},
		ServiceFailed{RequestID: "moatreq_000000000000000000000003", Status: 302, Reason: "service_redirect",
			Detail: `moat: service_redirect: service "github" answered with a redirect (HTTP 302); moat neither follows nor passes on redirects`},
	}
}

// TestServiceRecordsVerify: service records sign, verify complete and
// decode back to what was written; they change no count of
// run.terminated (a run without them is what it was). A service record
// with a member its type does not have is refused.
func TestServiceRecordsVerify(t *testing.T) {
	j := checkRecords(t, recordsCase{records: serviceRecords()})
	lines, priv, pub := j.lines, j.priv, j.pub
	bad := joinLines(replaceLine(lines, 3, resign(t, priv, lines[3], func(m map[string]any) { m["url"] = "https://x" })))
	if r := Verify(bad, pub); r.Status != Invalid {
		t.Fatalf("service.requested with an unknown member: got %v (%v), want invalid", r.Status, r.Err)
	}
}

// Example_serviceRequested prints the payloads of service.requested (a
// gzip body) and service.failed as the writer makes them (pinned key and
// clock).
func Example_serviceRequested() {
	printPayloads(serviceRecords()[1:]...)
	// Output:
	// {"attribution":{"executable":"/usr/bin/git","pid":4242,"sha256":"cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc","status":"resolved"},"body_bytes":0,"body_sha256":"eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee","headers_sha256":"dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd","method":"GET","path":"/owner/repo.git/info/refs","prev":"55898897234ad4da482306cdb6528b39c2917bfbe7a2093e933803a43f7ee49b","query":"service=git-upload-pack","request_id":"moatreq_000000000000000000000002","run":"run-1","seq":3,"service":"github","time":"2026-12-01T02:00:00Z","type":"service.requested","v":1}
	// {"body_bytes":11342,"body_sha256":"ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff","prev":"e035e0075a857da207c35800c8b1af873f918f9235b90e30271957f8a8c6cdc1","request_id":"moatreq_000000000000000000000002","run":"run-1","seq":4,"status":200,"time":"2026-12-01T02:00:00Z","type":"service.completed","v":1}
	// {"attribution":{"executable":"/usr/bin/git","pid":4242,"sha256":"cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc","status":"resolved"},"body_bytes":4100,"body_sha256":"2222222222222222222222222222222222222222222222222222222222222222","content_encoding":"gzip","encoded_bytes":720,"encoded_sha256":"3333333333333333333333333333333333333333333333333333333333333333","headers_sha256":"1111111111111111111111111111111111111111111111111111111111111111","method":"POST","path":"/owner/repo.git/git-upload-pack","prev":"5409aaaaf79caef9476731aaa59f3d87b40713805eac2d1726667cea46f49506","request_id":"moatreq_000000000000000000000003","run":"run-1","seq":5,"service":"github","time":"2026-12-01T02:00:00Z","type":"service.requested","v":1}
	// {"detail":"moat: service_redirect: service \"github\" answered with a redirect (HTTP 302); moat neither follows nor passes on redirects","prev":"9322ac19a1461b49fd3790ecc8ed30c687959781eec2bb15d00ea084ffd52038","reason":"service_redirect","request_id":"moatreq_000000000000000000000003","run":"run-1","seq":6,"status":302,"time":"2026-12-01T02:00:00Z","type":"service.failed","v":1}
}

// TestServiceDescribe: audit show renders every service record, and the
// timeline marks refusals and failures.
func TestServiceDescribe(t *testing.T) {
	want := []string{
		`id=moatreq_000000000000000000000001 service="github" method="GET" reason=service_path_not_allowed pid=4242 exe=/usr/bin/git detail=`,
		`id=moatreq_000000000000000000000002 service=github GET "/owner/repo.git/info/refs" query="service=git-upload-pack" headers=dddddddddddd body=eeeeeeeeeeee bytes=0 pid=4242 exe=/usr/bin/git`,
		`id=moatreq_000000000000000000000002 status=200 body=ffffffffffff bytes=11342`,
		`id=moatreq_000000000000000000000003 service=github POST "/owner/repo.git/git-upload-pack" headers=111111111111 body=222222222222 bytes=4100 encoding=gzip encoded=333333333333 encoded_bytes=720 pid=4242`,
		`id=moatreq_000000000000000000000003 status=302 reason=service_redirect detail="moat: service_redirect: `,
	}
	for i, r := range serviceRecords() {
		if got := Describe(r); !strings.HasPrefix(got, want[i]) {
			t.Errorf("%s: got %s, want prefix %s", r.RecordType(), got, want[i])
		}
	}
	var out bytes.Buffer
	WriteTimeline(&out, checkRecords(t, recordsCase{records: serviceRecords()}).journal)
	if n := strings.Count(out.String(), "!! "); n != 2 || !strings.Contains(out.String(), "REFUSED service.refused") || !strings.Contains(out.String(), "FAILED service.failed") {
		t.Errorf("timeline marks %d lines, want the refusal and the failure:\n%s", n, out.String())
	}
}
