package broker

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/policy"
)

// bigBody asks for more than the approval rule's max_tokens_over (100);
// anthropicBody (16) stays under it.
func bigBody(content string) string {
	return `{"model":"claude-test","max_tokens":500,"messages":[{"role":"user","content":"` + content + `"}]}`
}

func approvalHarness(t *testing.T, timeout time.Duration) (*harness, *ApprovalDesk) {
	t.Helper()
	fp := newFakeProvider(t, false)
	pol := testPolicy(fp.srv.URL, 100)
	pol.Approvals = policy.Approvals{Timeout: policy.Duration(timeout), Rules: []policy.ApprovalRule{
		{Road: policy.RoadInference, Provider: "anthropic", MaxTokensOver: 100},
	}}
	h := startBroker(t, fp, pol, nil, func(c *Config) { c.RunID, c.Sandbox = "run-broker-test", "" })
	d := h.b.Approvals()
	if d == nil {
		t.Fatal("Approvals() is nil with an approval rule")
	}
	return h, d
}

// sendAsync sends body on a new connection; the result arrives on the
// channel once the broker answers.
func (h *harness) sendAsync(body string) <-chan result {
	ch := make(chan result, 1)
	go func() { ch <- h.raw(post("/v1/messages", body, "Connection: close")) }()
	return ch
}

// waitHeld waits until n requests are held and returns them.
func waitHeld(t *testing.T, d *ApprovalDesk, n int) []HeldRequest {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		l := d.List()
		if len(l) == n {
			return l
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d requests held, want %d", len(l), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func sha(s []byte) string {
	sum := sha256.Sum256(s)
	return hex.EncodeToString(sum[:])
}

func (h *harness) seqOf(typ, key, val string) int {
	for _, l := range h.j.lines() {
		if p := payloadOf(h.t, l); p["type"] == typ && p[key] == val {
			return int(p["seq"].(float64))
		}
	}
	return 0
}

const approver = "uid 1000 pid 7"

// TestApprovalApproved: a request under the rule's threshold is not held
// (control); one over it is held, never reaches the provider while held,
// is shown with its exact bytes, and once approved with its digest,
// principal and run goes out exactly once, with approval.decided durable
// before its pre-effect record. A second approval of the same id is a
// replay: refused, journaled, and nothing more reaches the provider.
func TestApprovalApproved(t *testing.T) {
	h, d := approvalHarness(t, time.Minute)
	h.mustSucceed() // max_tokens 16: not held
	if n := len(h.records(audit.TypeApprovalRequested)); n != 0 {
		t.Fatalf("%d approvals for a request under the threshold", n)
	}
	before := h.fp.count()
	res := h.sendAsync(bigBody("deploy"))
	held := waitHeld(t, d, 1)[0]
	time.Sleep(50 * time.Millisecond)
	if got := h.fp.count(); got != before {
		t.Fatalf("provider saw %d requests while one was held, want %d", got, before)
	}
	shown, ok := d.Show(held.ID)
	if !ok || sha([]byte(shown.Request)) != held.RequestSHA256 || shown.RequestBytes != int64(len(shown.Request)) {
		t.Fatalf("show: %v %+v", ok, shown)
	}
	if shown.Principal.Run != "run-broker-test" || shown.Road != "inference" || shown.Target != "anthropic" || shown.Name != "claude-test" {
		t.Errorf("held: %+v", shown)
	}
	rep := d.Do(ApprovalCommand{Op: ApprovalOpApprove, ID: held.ID, Digest: held.RequestSHA256, Principal: held.PrincipalLine, Run: "run-broker-test"}, approver)
	if rep.Error != "" || rep.Decision != audit.ApprovalApproved {
		t.Fatalf("approve: %+v", rep)
	}
	r := <-res
	if r.status != 200 {
		t.Fatalf("approved request: status %d body %s", r.status, r.body)
	}
	if got := h.fp.count(); got != before+1 {
		t.Fatalf("provider saw %d requests, want %d", got, before+1)
	}
	if got := sha(h.fp.last().body); got != held.RequestSHA256 {
		t.Errorf("provider got bytes %s, approved %s", got, held.RequestSHA256)
	}
	dec := h.records(audit.TypeApprovalDecided)
	if len(dec) != 1 || dec[0]["decision"] != "approved" || dec[0]["approver"] != approver || dec[0]["request_sha256"] != held.RequestSHA256 {
		t.Fatalf("approval.decided: %v", dec)
	}
	ds, rs := h.seqOf(audit.TypeApprovalDecided, "approval_id", held.ID), h.seqOf(audit.TypeInferenceRequested, "request_id", held.RequestID)
	if ds == 0 || rs == 0 || ds > rs || h.seqOf(audit.TypeApprovalRequested, "approval_id", held.ID) > ds {
		t.Errorf("order: approval.decided seq %d, inference.requested seq %d", ds, rs)
	}
	// Replay: single use.
	rep = d.Do(ApprovalCommand{Op: ApprovalOpApprove, ID: held.ID, Digest: held.RequestSHA256}, approver)
	if !strings.Contains(rep.Error, "single use") {
		t.Errorf("replay: %+v", rep)
	}
	subs := h.records(audit.TypeApprovalSubstitution)
	if len(subs) != 1 || subs[0]["reason"] != audit.SubstitutionReplay {
		t.Errorf("replay record: %v", subs)
	}
	// The same bytes again are a new request: held again, not let through.
	res2 := h.sendAsync(bigBody("deploy"))
	again := waitHeld(t, d, 1)[0]
	if again.ID == held.ID || again.RequestSHA256 != held.RequestSHA256 {
		t.Errorf("resent request: id %s digest %s (first %s %s)", again.ID, again.RequestSHA256, held.ID, held.RequestSHA256)
	}
	d.Do(ApprovalCommand{Op: ApprovalOpDeny, ID: again.ID}, approver)
	if r := <-res2; r.status != 403 || r.header.Get("Moat-Reason") != string(ReasonApprovalDenied) {
		t.Errorf("resent and denied: %d %s", r.status, r.body)
	}
	if got := h.fp.count(); got != before+1 {
		t.Errorf("provider saw %d requests, want %d: the approval was used twice", got, before+1)
	}
}

// refusedHeld holds one request, applies cmd (with the held id filled
// in by mod) and checks that the request is refused with reason, that
// nothing reached the provider, and that the decision was journaled.
func refusedHeld(t *testing.T, timeout time.Duration, mod func(d *ApprovalDesk, h HeldRequest) ApprovalReply, reason Reason, decision, sub string) {
	t.Helper()
	hh, d := approvalHarness(t, timeout)
	before := hh.fp.count()
	res := hh.sendAsync(bigBody("rm -rf"))
	held := waitHeld(t, d, 1)[0]
	rep := mod(d, held)
	r := <-res
	if r.status == 200 || r.header.Get("Moat-Reason") != string(reason) {
		t.Fatalf("status %d reason %q body %s; want reason %s (reply %+v)", r.status, r.header.Get("Moat-Reason"), r.body, reason, rep)
	}
	if got := hh.fp.count(); got != before {
		t.Errorf("provider saw %d requests, want %d", got, before)
	}
	dec := hh.records(audit.TypeApprovalDecided)
	if len(dec) != 1 || dec[0]["decision"] != decision {
		t.Errorf("approval.decided: %v, want decision %s", dec, decision)
	}
	subs := hh.records(audit.TypeApprovalSubstitution)
	if sub == "" && len(subs) != 0 || sub != "" && (len(subs) != 1 || subs[0]["reason"] != sub) {
		t.Errorf("approval.substitution: %v, want reason %q", subs, sub)
	}
	if ref := hh.records(audit.TypeInferenceRefused); len(ref) != 1 || ref[0]["request_id"] != held.RequestID {
		t.Errorf("inference.refused: %v", ref)
	}
	if rs := hh.records(audit.TypeInferenceRequested); len(rs) != 0 {
		t.Errorf("a refused held request has a pre-effect record: %v", rs)
	}
	// The same run still serves an approved request (positive control).
	res = hh.sendAsync(bigBody("ok"))
	held = waitHeld(t, d, 1)[0]
	if rep := d.Do(ApprovalCommand{Op: ApprovalOpApprove, ID: held.ID, Digest: held.RequestSHA256}, approver); rep.Error != "" {
		t.Fatalf("control approve: %+v", rep)
	}
	if r := <-res; r.status != 200 || hh.fp.count() != before+1 {
		t.Fatalf("control: status %d, provider saw %d (want %d)", r.status, hh.fp.count(), before+1)
	}
}

func TestApprovalDenied(t *testing.T) {
	refusedHeld(t, time.Minute, func(d *ApprovalDesk, h HeldRequest) ApprovalReply {
		return d.Do(ApprovalCommand{Op: ApprovalOpDeny, ID: h.ID}, approver)
	}, ReasonApprovalDenied, audit.ApprovalDenied, "")
}

func TestApprovalTimeout(t *testing.T) {
	refusedHeld(t, 300*time.Millisecond, func(*ApprovalDesk, HeldRequest) ApprovalReply { return ApprovalReply{} },
		ReasonApprovalTimeout, audit.ApprovalTimedOut, "")
}

func TestApprovalWrongDigest(t *testing.T) {
	refusedHeld(t, time.Minute, func(d *ApprovalDesk, h HeldRequest) ApprovalReply {
		rep := d.Do(ApprovalCommand{Op: ApprovalOpApprove, ID: h.ID, Digest: sha([]byte("other bytes"))}, approver)
		if !strings.Contains(rep.Error, "substitution") {
			t.Errorf("reply: %+v", rep)
		}
		return rep
	}, ReasonApprovalSubstituted, audit.ApprovalSubstituted, audit.SubstitutionDigest)
}

func TestApprovalWrongPrincipal(t *testing.T) {
	refusedHeld(t, time.Minute, func(d *ApprovalDesk, h HeldRequest) ApprovalReply {
		return d.Do(ApprovalCommand{Op: ApprovalOpApprove, ID: h.ID, Digest: h.RequestSHA256,
			Principal: strings.Replace(h.PrincipalLine, "run=run-broker-test", "run=run-broker-test sandbox=other", 1)}, approver)
	}, ReasonApprovalSubstituted, audit.ApprovalSubstituted, audit.SubstitutionPrincipal)
}

func TestApprovalWrongRun(t *testing.T) {
	refusedHeld(t, time.Minute, func(d *ApprovalDesk, h HeldRequest) ApprovalReply {
		return d.Do(ApprovalCommand{Op: ApprovalOpApprove, ID: h.ID, Digest: h.RequestSHA256, Run: "run-other"}, approver)
	}, ReasonApprovalSubstituted, audit.ApprovalSubstituted, audit.SubstitutionRun)
}

// TestApprovalBytesChanged: bytes that change while held (here in the
// broker's own memory) are caught before they leave, although the
// approval named the digest that was shown.
func TestApprovalBytesChanged(t *testing.T) {
	refusedHeld(t, time.Minute, func(d *ApprovalDesk, h HeldRequest) ApprovalReply {
		d.mu.Lock()
		body := d.pending[h.ID].body
		i := strings.Index(string(body), "rm -rf")
		copy(body[i:], "ls -la")
		d.mu.Unlock()
		return d.Do(ApprovalCommand{Op: ApprovalOpApprove, ID: h.ID, Digest: h.RequestSHA256}, approver)
	}, ReasonApprovalSubstituted, audit.ApprovalApproved, audit.SubstitutionBytes)
}

// TestApprovalSubstitution: two requests held at once; approving the
// first with the second's digest (the bytes the approver saw belong to
// another request) refuses the first and never sends it; the second,
// approved with its own digest, goes out once.
func TestApprovalSubstitution(t *testing.T) {
	h, d := approvalHarness(t, time.Minute)
	before := h.fp.count()
	resA := h.sendAsync(bigBody("send $1 to alice"))
	waitHeld(t, d, 1)
	resB := h.sendAsync(bigBody("send $1000000 to mallory"))
	l := waitHeld(t, d, 2)
	a, b := l[0], l[1]
	if a.RequestSHA256 == b.RequestSHA256 {
		t.Fatal("two different requests with one digest")
	}
	if rep := d.Do(ApprovalCommand{Op: ApprovalOpApprove, ID: b.ID, Digest: a.RequestSHA256}, approver); rep.Error == "" {
		t.Errorf("approving b with a's digest: %+v", rep)
	}
	if r := <-resB; r.status != 403 || r.header.Get("Moat-Reason") != string(ReasonApprovalSubstituted) {
		t.Errorf("substituted request: %d %s", r.status, r.body)
	}
	if rep := d.Do(ApprovalCommand{Op: ApprovalOpApprove, ID: a.ID, Digest: a.RequestSHA256}, approver); rep.Error != "" {
		t.Fatalf("approving a: %+v", rep)
	}
	if r := <-resA; r.status != 200 {
		t.Fatalf("approved request: %d %s", r.status, r.body)
	}
	if got := h.fp.count(); got != before+1 || !strings.Contains(string(h.fp.last().body), "alice") {
		t.Errorf("provider saw %d requests (want %d), last %s", got, before+1, h.fp.last().body)
	}
	if subs := h.records(audit.TypeApprovalSubstitution); len(subs) != 1 || subs[0]["approval_id"] != b.ID {
		t.Errorf("substitution records: %v", subs)
	}
}

// TestApprovalClose: a request held when the broker closes is refused,
// journaled as cancelled, and never sent.
func TestApprovalClose(t *testing.T) {
	h, d := approvalHarness(t, time.Minute)
	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, post("/v1/messages", bigBody("x"), "Connection: close"))
	res := make(chan []byte, 1)
	go func() { b, _ := io.ReadAll(c); res <- b }()
	waitHeld(t, d, 1)
	closed := make(chan struct{})
	go func() { h.b.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not end the held request")
	}
	<-res
	if dec := h.records(audit.TypeApprovalDecided); len(dec) != 1 || dec[0]["decision"] != audit.ApprovalCancelled {
		t.Errorf("approval.decided: %v", dec)
	}
	if h.fp.count() != 0 {
		t.Errorf("provider saw %d requests", h.fp.count())
	}
}

// TestParseApprovalCommand: each mistake is refused with its reason,
// beside the valid commands.
func TestParseApprovalCommand(t *testing.T) {
	id, dg := "moatapr_0123456789abcdef01234567", strings.Repeat("ab", 32)
	for _, ok := range []string{
		`{"op":"approvals.list"}`,
		fmt.Sprintf(`{"op":"approvals.show","id":%q}`, id),
		fmt.Sprintf(`{"op":"approvals.approve","id":%q,"digest":%q,"principal":"run=r pid=1 exe=/x","run":"r"}`, id, dg),
		fmt.Sprintf(`{"op":"approvals.deny","id":%q}`, id),
	} {
		if _, err := ParseApprovalCommand([]byte(ok)); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	for _, c := range []struct{ in, want string }{
		{`{"op":"approvals.list","op":"approvals.list"}`, "duplicate"},
		{`{"op":"approvals.nuke"}`, "unknown op"},
		{`{"op":"approvals.list","x":"1"}`, "unknown member"},
		{`{"op":"approvals.list","id":"` + id + `"}`, "list takes no id"},
		{`{"op":1}`, "not a string"},
		{`[]`, "not a JSON object"},
		{fmt.Sprintf(`{"op":"approvals.approve","id":%q}`, id), "needs the request digest"},
		{fmt.Sprintf(`{"op":"approvals.approve","id":%q,"digest":%q}`, id, strings.ToUpper(dg)), "64 lowercase hex"},
		{fmt.Sprintf(`{"op":"approvals.approve","id":"moatreq_0123456789abcdef01234567","digest":%q}`, dg), "not an approval id"},
		{fmt.Sprintf(`{"op":"approvals.show","id":%q,"digest":%q}`, id, dg), "only an id"},
		{`{"op":"approvals.list"` + strings.Repeat(" ", MaxApprovalCommandBytes) + `}`, "at most"},
	} {
		if _, err := ParseApprovalCommand([]byte(c.in)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%.80s: got %v, want %q", c.in, err, c.want)
		}
	}
}

// FuzzApprovalCommand: any input is parsed or refused without a panic;
// a parsed command encodes and parses back to itself.
func FuzzApprovalCommand(f *testing.F) {
	f.Add([]byte(`{"op":"approvals.list"}`))
	f.Add([]byte(`{"op":"approvals.approve","id":"moatapr_0123456789abcdef01234567","digest":"` + strings.Repeat("0", 64) + `"}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		c, err := ParseApprovalCommand(in)
		if err != nil {
			return
		}
		out, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		c2, err := ParseApprovalCommand(out)
		if err != nil || c2 != c {
			t.Fatalf("%q parsed as %+v, which encodes as %s and parses as %+v (%v)", in, c, out, c2, err)
		}
	})
}

// TestApprovalShowBinary: show gives the exact bytes of a body that is
// not UTF-8 in request_base64 (the text form cannot carry them); a UTF-8
// body has none (control).
func TestApprovalShowBinary(t *testing.T) {
	_, d := approvalHarness(t, time.Minute)
	for _, body := range [][]byte{[]byte("GET /x\n\n\xff\x00\x80"), []byte("GET /y\n\nplain")} {
		done := make(chan *frontError, 1)
		go func() {
			done <- d.holdFor("moatreq_000000000000000000000001", audit.Attribution{Status: "unavailable", Reason: "test"}, policy.RoadService, "git", "GET /x", body, nil)
		}()
		held := waitHeld(t, d, 1)[0]
		shown, _ := d.Show(held.ID)
		raw, err := base64.StdEncoding.DecodeString(shown.RequestBase64)
		switch {
		case utf8.Valid(body) && shown.RequestBase64 != "":
			t.Errorf("UTF-8 body with request_base64 %q", shown.RequestBase64)
		case !utf8.Valid(body) && (err != nil || string(raw) != string(body) || sha(raw) != held.RequestSHA256):
			t.Errorf("binary body: request_base64 %q (%v), want the exact bytes", shown.RequestBase64, err)
		}
		d.Do(ApprovalCommand{Op: ApprovalOpDeny, ID: held.ID}, approver)
		if fe := <-done; fe == nil || fe.Code != ReasonApprovalDenied {
			t.Errorf("denied: %v", fe)
		}
	}
}

// TestApprovalConcurrentDecisions: many operators approve and deny the
// same held requests at once, while their timeout fires: each request
// gets exactly one approval.decided, every other decision is refused as
// a replay, and the provider sees exactly the requests whose decision
// was an approval, once each.
func TestApprovalConcurrentDecisions(t *testing.T) {
	h, d := approvalHarness(t, 2*time.Second)
	const n = 8
	res := make([]<-chan result, n)
	for i := range res {
		res[i] = h.sendAsync(bigBody(fmt.Sprintf("job %d", i)))
	}
	held := waitHeld(t, d, n)
	var wg sync.WaitGroup
	// A burst of six decisions per request, approvals and denials mixed;
	// the bursts of the last requests come after their timeout.
	for i, hr := range held {
		for k := 0; k < 6; k++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				op := ApprovalOpApprove
				if (i+k)%2 == 1 {
					op = ApprovalOpDeny
				}
				time.Sleep(time.Duration(i*300+k) * time.Millisecond)
				d.Do(ApprovalCommand{Op: op, ID: hr.ID, Digest: hr.RequestSHA256}, approver)
			}()
		}
	}
	wg.Wait()
	ok := 0
	for _, ch := range res {
		if r := <-ch; r.status == 200 {
			ok++
		}
	}
	decided := map[string]int{}
	approved := 0
	for _, rec := range h.records(audit.TypeApprovalDecided) {
		decided[rec["approval_id"].(string)]++
		if rec["decision"] == audit.ApprovalApproved {
			approved++
		}
	}
	for _, hr := range held {
		if decided[hr.ID] != 1 {
			t.Errorf("approval %s decided %d times", hr.ID, decided[hr.ID])
		}
	}
	kinds := map[any]int{}
	for _, rec := range h.records(audit.TypeApprovalDecided) {
		kinds[rec["decision"]]++
	}
	t.Logf("decisions: %v", kinds)
	if ok != approved || h.fp.count() != approved || approved == 0 {
		t.Errorf("%d answered 200, %d approved, provider saw %d", ok, approved, h.fp.count())
	}
	for _, s := range h.records(audit.TypeApprovalSubstitution) {
		if s["reason"] != audit.SubstitutionReplay {
			t.Errorf("substitution %v, want replays only", s)
		}
	}
}

// TestApprovalLogLines: each step of an approval has its one log line
// with fixed fields: held, substitution and decided (a refused decision
// at Warn), beside the request's own refused line.
func TestApprovalLogLines(t *testing.T) {
	var buf syncBuffer
	fp := newFakeProvider(t, false)
	pol := testPolicy(fp.srv.URL, 10)
	pol.Approvals = policy.Approvals{Timeout: policy.Duration(time.Minute), Rules: []policy.ApprovalRule{{Road: policy.RoadInference}}}
	h := startBroker(t, fp, pol, nil, func(c *Config) {
		c.Log = slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	d := h.b.Approvals()
	res := h.sendAsync(anthropicBody)
	held := waitHeld(t, d, 1)[0]
	d.Do(ApprovalCommand{Op: ApprovalOpApprove, ID: held.ID, Digest: strings.Repeat("0", 64)}, approver)
	<-res
	out := buf.String()
	for _, w := range []string{
		`level=WARN msg="moat.approval held" approval_id=` + held.ID,
		`level=WARN msg="moat.approval substitution" approval_id=` + held.ID + ` reason=digest_mismatch`,
		`level=WARN msg="moat.approval decided" approval_id=` + held.ID + ` request_id=` + held.RequestID + ` decision=substituted`,
		`level=WARN msg="moat.broker refused" request_id=` + held.RequestID + ` reason=approval_substituted`,
	} {
		if !strings.Contains(out, w) {
			t.Errorf("log lacks %s\n%s", w, out)
		}
	}
}

// syncBuffer is a bytes.Buffer for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
