package broker

import (
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/policy"
)

// TestApprovalService: on the service road, a request to the rule's
// service is held and sent only once approved with the digest of
// ServiceApprovalBytes (method, path, query, headers digest, body); show
// prints exactly those bytes; a denied request and one approved with
// another digest never leave (no service.requested).
func TestApprovalService(t *testing.T) {
	srv := startGit(t, 2)
	g := gitGrant(srv.URL)
	fp := newFakeProvider(t, false)
	svc, err := NewServices(ServicesConfig{Grants: []policy.EgressService{g}, Credentials: map[string]string{g.Name: "git:" + testSvcCred},
		Guarded: []string{testCred}, Dial: testGuard(), RootCAs: srv.RootCAs()})
	if err != nil {
		t.Fatal(err)
	}
	pol := testPolicy(fp.srv.URL, 10)
	pol.Approvals = policy.Approvals{Timeout: policy.Duration(time.Minute), Rules: []policy.ApprovalRule{{Road: policy.RoadService, Service: "git"}}}
	h := startBroker(t, fp, pol, nil, func(c *Config) { c.Services = svc; c.RunID = "run-broker-test" })
	d := h.b.Approvals()
	target := "/svc/git/repo.git/info/refs?service=git-upload-pack"
	send := func() <-chan result {
		ch := make(chan result, 1)
		go func() { ch <- h.raw(get(target, "Connection: close")) }()
		return ch
	}
	res := send()
	held := waitHeld(t, d, 1)[0]
	shown, _ := d.Show(held.ID)
	if held.Road != "service" || held.Target != "git" || held.Name != "GET /repo.git/info/refs" ||
		!strings.HasPrefix(shown.Request, "GET /repo.git/info/refs?service=git-upload-pack\nheaders_sha256: ") || sha([]byte(shown.Request)) != held.RequestSHA256 {
		t.Fatalf("held: %+v", shown)
	}
	if n := len(h.records(audit.TypeServiceRequested)); n != 0 {
		t.Fatalf("%d service.requested while held", n)
	}
	d.Do(ApprovalCommand{Op: ApprovalOpApprove, ID: held.ID, Digest: held.RequestSHA256}, approver)
	if r := <-res; r.status != 200 || !strings.Contains(r.body, "refs/heads/") {
		t.Fatalf("approved: %d %.200s", r.status, r.body)
	}
	if n := len(h.records(audit.TypeServiceCompleted)); n != 1 {
		t.Fatalf("%d service.completed, want 1", n)
	}
	res = send()
	held = waitHeld(t, d, 1)[0]
	d.Do(ApprovalCommand{Op: ApprovalOpDeny, ID: held.ID}, approver)
	if r := <-res; r.header.Get("Moat-Reason") != string(ReasonApprovalDenied) {
		t.Errorf("denied: %d %s", r.status, r.body)
	}
	res = send()
	held = waitHeld(t, d, 1)[0]
	d.Do(ApprovalCommand{Op: ApprovalOpApprove, ID: held.ID, Digest: sha([]byte("GET /repo.git/info/refs"))}, approver)
	if r := <-res; r.header.Get("Moat-Reason") != string(ReasonApprovalSubstituted) {
		t.Errorf("substituted: %d %s", r.status, r.body)
	}
	if n := len(h.records(audit.TypeServiceRequested)); n != 1 {
		t.Errorf("%d service.requested, want the approved one only", n)
	}
	if n := len(h.records(audit.TypeServiceRefused)); n != 2 {
		t.Errorf("%d service.refused, want 2", n)
	}
}
