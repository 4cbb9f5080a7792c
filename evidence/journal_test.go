package evidence

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/confirmation"
	"github.com/moat-sandbox/moat/internal/strictjson"
)

func sampleJournal(t *testing.T) *fakeJournal {
	j := newFakeJournal(t, "run-j")
	j.add("run.started", nil)
	j.add("boundary.confirmed", map[string]any{"ready": true})
	j.add("inference.requested", map[string]any{"body_sha256": sha([]byte("x"))})
	j.add("run.terminated", map[string]any{"reason": "completed"})
	return j
}

func TestVerifyJournal(t *testing.T) {
	j := sampleJournal(t)
	full := string(j.data)
	lines := strings.SplitAfter(strings.TrimSuffix(full, "\n"), "\n")
	_, otherPriv, _ := ed25519.GenerateKey(rand.Reader)
	tests := []struct {
		name string
		data string
		pub  ed25519.PublicKey
		want string
	}{
		{"complete", full, j.pub(), JournalComplete},
		{"prefix without terminal", strings.Join(lines[:3], ""), j.pub(), JournalIncomplete},
		{"torn last line", strings.Join(lines[:3], "") + lines[3][:40], j.pub(), JournalIncomplete},
		{"bytes after terminal", full + "x", j.pub(), JournalInvalid},
		{"line after terminal", full + lines[1], j.pub(), JournalInvalid},
		{"other key", full, otherPriv.Public().(ed25519.PublicKey), JournalInvalid},
		{"line dropped", lines[0] + strings.Join(lines[2:], ""), j.pub(), JournalInvalid},
		{"lines swapped", lines[0] + lines[2] + lines[1] + lines[3], j.pub(), JournalInvalid},
		{"payload edited", strings.Replace(full, `"payload":"ey`, `"payload":"eX`, 1), j.pub(), JournalInvalid},
		{"empty", "", j.pub(), JournalIncomplete},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := verifyJournal([]byte(tc.data), tc.pub)
			if got.Status != tc.want {
				t.Fatalf("got %s (%s), want %s", got.Status, got.Reason, tc.want)
			}
		})
	}
}

func FuzzVerifyJournal(f *testing.F) {
	j := newFakeJournal(&testing.T{}, "run-f")
	j.add("run.started", nil)
	j.add("run.terminated", map[string]any{"reason": "completed"})
	f.Add(j.data)
	f.Add([]byte("{}\n"))
	pub := j.pub()
	f.Fuzz(func(t *testing.T, data []byte) {
		r := verifyJournal(data, pub)
		switch r.Status {
		case JournalComplete, JournalIncomplete, JournalInvalid:
		default:
			t.Fatalf("status %q", r.Status)
		}
	})
}

func FuzzParseClaims(f *testing.F) {
	f.Add([]byte(`{"claims":{"passed":true,"escape_success":true,"audit_verified":true}}` + "\n"))
	f.Fuzz(func(t *testing.T, data []byte) { ParseClaims(data) })
}

func FuzzCheckPreEffect(f *testing.F) {
	j := newFakeJournal(&testing.T{}, "run-p")
	line := j.add("inference.requested", map[string]any{"body_sha256": sha([]byte("b"))})
	f.Add([]byte(line), []byte("b"))
	pub := j.pub()
	f.Fuzz(func(t *testing.T, line, body []byte) { checkPreEffect(line, body, "run-p", pub) })
}

// FuzzObserveEvents feeds arbitrary provider and receiver event files to
// ObserveCase: malformed input is an error or missing evidence, never a panic.
func FuzzObserveEvents(f *testing.F) {
	f.Add([]byte(`{"n":1,"body":"e30=","pre_effect":"{}","headers":{"moat-x":"1"}}`+"\n"), []byte(`{"receiver":"tcp","kind":"hit"}`+"\n"))
	f.Add([]byte("{\"n\":\n"), []byte(`{"receiver":"nope","kind":"control"}`))
	c, _ := CaseByName("provider-redirect")
	f.Fuzz(func(t *testing.T, prov, recv []byte) {
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, FileProviderEvents), prov, 0o644)
		os.WriteFile(filepath.Join(dir, FileReceiverEvents), recv, 0o644)
		os.WriteFile(filepath.Join(dir, FileRedirectEvents), recv, 0o644)
		os.WriteFile(filepath.Join(dir, FileHost), prov, 0o644)
		if o, err := ObserveCase(dir, c); err == nil {
			Score(c, o)
		}
	})
}

// TestParsePublicKeyPEMStrict: the evidence reading of pubkey.pem refuses
// what package audit refuses (headers, data before or after the block, a
// second block, another type, an oversized file), and both accept the key
// file that the writer makes (the positive control).
func TestParsePublicKeyPEMStrict(t *testing.T) {
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	good := string(publicKeyPEM(pub))
	withHeaders := strings.Replace(good, "-----BEGIN PUBLIC KEY-----\n", "-----BEGIN PUBLIC KEY-----\nProc-Type: 4,ENCRYPTED\n\n", 1)
	tests := []struct {
		name string
		in   string
		ok   bool
	}{
		{"the writer's file", good, true},
		{"surrounding whitespace", "\n" + good + "\n\n", true},
		{"headers", withHeaders, false},
		{"data after the block", good + "trailing\n", false},
		{"a second block", good + good, false},
		{"data before the block", "comment\n" + good, false},
		{"a begin line before the block", "-----BEGIN \n" + good, false},
		{"a broken block before the block", "-----BEGIN PUBLIC KEY-----\n!!\n-----END PUBLIC KEY-----\n" + good, false},
		{"another block type", strings.ReplaceAll(good, "PUBLIC KEY", "PRIVATE KEY"), false},
		{"oversized", good + strings.Repeat(" ", maxPublicKeyPEM), false},
		{"empty", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parsePublicKeyPEM([]byte(tc.in))
			if (err == nil) != tc.ok {
				t.Fatalf("evidence: err %v, want ok=%v", err, tc.ok)
			}
			if tc.ok && !got.Equal(pub) {
				t.Fatalf("evidence: got another key")
			}
			if _, aerr := audit.ParsePublicKeyPEM([]byte(tc.in)); (aerr == nil) != tc.ok {
				t.Fatalf("package audit: err %v, want ok=%v (the two readings must agree)", aerr, tc.ok)
			}
		})
	}
	if _, err := parsePublicKeyPEM([]byte(withHeaders)); err == nil || !strings.Contains(err.Error(), "headers") {
		t.Fatalf("headers: got %v, want the error to say headers", err)
	}
	if _, err := parsePublicKeyPEM([]byte(good + "x")); err == nil || !strings.Contains(err.Error(), "after") {
		t.Fatalf("trailing data: got %v, want the error to say data after the block", err)
	}
}

// rekeyed is a journal that package audit's writer made, its payloads
// re-signed (and run.started's public_key replaced) with a key the test
// holds, so that a test can change a payload and sign it again: each
// change then has to be caught by the reading itself, not by a signature.
type rekeyed struct {
	priv     ed25519.PrivateKey
	payloads []map[string]any
}

func newRekeyed(t *testing.T) *rekeyed {
	t.Helper()
	w, err := audit.Create(filepath.Join(t.TempDir(), "audit"), "run-strict")
	if err != nil {
		t.Fatal(err)
	}
	var lines [][]byte
	for _, r := range []audit.Record{
		audit.RunStarted{Backend: "native", PolicySHA256: sha(nil), BinarySHA256: sha(nil), PublicKey: string(w.PublicKeyPEM())},
		audit.BoundaryConfirmed{Ready: true},
		audit.InferenceRequested{RequestID: "r1", Provider: "anthropic", API: "anthropic-messages", Endpoint: "/v1/messages",
			Model: "m", BodySHA256: sha(nil), ReservedTokens: 1, Attribution: audit.Attribution{Status: confirmation.AttributionUnavailable, Reason: "test"}},
		audit.InferenceCompleted{RequestID: "r1", Status: 200, ResponseSHA256: sha(nil)},
		audit.ToolRequested{CallID: "moatcall_000000000000000000000001", Server: "calc", Tool: "add", ArgumentsSHA256: sha(nil),
			Attribution: audit.Attribution{Status: confirmation.AttributionUnavailable, Reason: "test"}},
		audit.ToolCompleted{CallID: "moatcall_000000000000000000000001", ResultSHA256: sha(nil)},
		audit.RunTerminated{Reason: audit.ReasonCompleted},
	} {
		line, err := w.Append(r)
		if err != nil {
			t.Fatal(err)
		}
		lines = append(lines, line)
	}
	w.Close()
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	k := &rekeyed{priv: priv}
	for _, line := range lines {
		payload, _, _, err := verifyEnvelope(line, auditPayloadType, w.PublicKey())
		if err != nil {
			t.Fatal(err)
		}
		f, err := decodePayload(payload)
		if err != nil {
			t.Fatal(err)
		}
		k.payloads = append(k.payloads, f)
	}
	k.payloads[0]["public_key"] = string(publicKeyPEM(priv.Public().(ed25519.PublicKey)))
	return k
}

func (k *rekeyed) pub() ed25519.PublicKey { return k.priv.Public().(ed25519.PublicKey) }

// line signs payload into an envelope line.
func (k *rekeyed) line(payload []byte) []byte {
	line, _ := json.Marshal(envelope{PayloadType: auditPayloadType, Payload: base64.StdEncoding.EncodeToString(payload),
		Signatures: []signature{{KeyID: keyIDOf(k.pub()), Sig: base64.StdEncoding.EncodeToString(ed25519.Sign(k.priv, dssePAE(auditPayloadType, payload)))}}})
	return line
}

// journal chains and signs the payloads; editPayload, when not nil, may
// change the canonical payload bytes of record i, editLine its envelope
// line, after the prev chain is set and before the line is hashed.
func (k *rekeyed) journal(t *testing.T, editPayload func(i int, p []byte) []byte, editLine func(i int, l []byte) []byte) []byte {
	t.Helper()
	var data []byte
	prev := zeroPrev
	for i, f := range k.payloads {
		f["prev"] = prev
		p, err := canonical(nil, f)
		if err != nil {
			t.Fatal(err)
		}
		if editPayload != nil {
			p = editPayload(i, p)
		}
		l := k.line(p)
		if editLine != nil {
			l = editLine(i, l)
		}
		prev = sha(l)
		data = append(append(data, l...), '\n')
	}
	return data
}

// TestVerifyJournalStrict: each thing that package audit's verifier
// refuses in a line's form is refused here too, and audit agrees: the
// unchanged journal (the positive control, in the same setup) is complete
// for both readings, and every change, signed again with the run's key, is
// invalid for both.
func TestVerifyJournalStrict(t *testing.T) {
	k := newRekeyed(t)
	last := len(k.payloads) - 1
	onPayload := func(at int, f func([]byte) []byte) func(int, []byte) []byte {
		return func(i int, p []byte) []byte {
			if i == at {
				return f(p)
			}
			return p
		}
	}
	onLine := onPayload
	set := func(at int, key string, v any) func(int, []byte) []byte {
		return onPayload(at, func(p []byte) []byte {
			f, _ := decodePayload(p)
			f[key] = v
			b, _ := canonical(nil, f)
			return b
		})
	}
	tests := []struct {
		name     string
		payload  func(int, []byte) []byte
		line     func(int, []byte) []byte
		complete bool
	}{
		{name: "unchanged (control)", complete: true},
		{name: "payload: trailing data", payload: onPayload(2, func(p []byte) []byte { return append(p, " {}"...) })},
		{name: "payload: trailing whitespace", payload: onPayload(2, func(p []byte) []byte { return append(p, ' ') })},
		{name: "payload: whitespace inside", payload: onPayload(2, func(p []byte) []byte { return bytes.Replace(p, []byte(`":`), []byte(`": `), 1) })},
		{name: "payload: duplicate member", payload: onPayload(2, func(p []byte) []byte { return append([]byte(`{"api":"x",`), p[1:]...) })},
		{name: "payload: members unsorted", payload: onPayload(3, func(p []byte) []byte {
			return bytes.Replace(p, []byte(`{"prev":`), []byte(`{"v":1,"prev":`), 1)
		})},
		{name: "payload: escaped slash", payload: onPayload(2, func(p []byte) []byte { return bytes.Replace(p, []byte(`/v1/messages`), []byte(`\/v1/messages`), 1) })},
		{name: "payload: a fraction", payload: set(3, "status", json.Number("200.0"))},
		{name: "payload: not an object", payload: onPayload(2, func([]byte) []byte { return []byte(`[1]`) })},
		{name: "envelope: trailing data", line: onLine(last, func(l []byte) []byte { return append(l, ']') })},
		{name: "envelope: trailing space", line: onLine(last, func(l []byte) []byte { return append(l, ' ') })},
		{name: "envelope: whitespace", line: onLine(2, func(l []byte) []byte { return bytes.Replace(l, []byte(`","payload"`), []byte(`", "payload"`), 1) })},
		{name: "envelope: member case", line: onLine(2, func(l []byte) []byte { return bytes.Replace(l, []byte(`"payloadType"`), []byte(`"PayloadType"`), 1) })},
		{name: "header: v 2", payload: set(2, "v", json.Number("2"))},
		{name: "header: unknown type", payload: set(2, "type", "inference.invented")},
		{name: "header: time not UTC", payload: set(2, "time", "2026-11-29T09:00:00+01:00")},
		{name: "header: bad run id", payload: set(0, "run", "run id")},
		{name: "order: boundary.confirmed again", payload: set(3, "type", "boundary.confirmed")},
		{name: "terminal: wrong counts", payload: set(last, "counts", map[string]any{"requested": json.Number("1"), "completed": json.Number("0"), "refused": json.Number("0"), "failed": json.Number("0"), "processes": json.Number("0"),
			"tools": map[string]any{"requested": json.Number("1"), "completed": json.Number("1"), "refused": json.Number("0"), "failed": json.Number("0")}})},
		{name: "terminal: tool counts dropped", payload: set(last, "counts", map[string]any{"requested": json.Number("1"), "completed": json.Number("1"), "refused": json.Number("0"), "failed": json.Number("0"), "processes": json.Number("0")})},
		{name: "terminal: tool count wrong", payload: set(last, "counts", map[string]any{"requested": json.Number("1"), "completed": json.Number("1"), "refused": json.Number("0"), "failed": json.Number("0"), "processes": json.Number("0"),
			"tools": map[string]any{"requested": json.Number("1"), "completed": json.Number("0"), "refused": json.Number("0"), "failed": json.Number("0")}})},
		{name: "terminal: a tool count missing", payload: set(last, "counts", map[string]any{"requested": json.Number("1"), "completed": json.Number("1"), "refused": json.Number("0"), "failed": json.Number("0"), "processes": json.Number("0"),
			"tools": map[string]any{"requested": json.Number("1"), "completed": json.Number("1"), "refused": json.Number("0")}})},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			data := k.journal(t, tc.payload, tc.line)
			want := JournalInvalid
			if tc.complete {
				want = JournalComplete
			}
			got := verifyJournal(data, k.pub())
			if got.Status != want {
				t.Fatalf("evidence: got %s (%s), want %s", got.Status, got.Reason, want)
			}
			if a := audit.Verify(data, k.pub()); a.Status.String() != want {
				t.Fatalf("package audit: got %s (%s), want %s: the test's journal is not what it claims", a.Status, a.Reason, want)
			}
		})
	}
}

// FuzzParsePublicKeyPEM: the evidence reading of a key file and package
// audit's accept and refuse the same inputs, and accept only Ed25519 keys.
func FuzzParsePublicKeyPEM(f *testing.F) {
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	good := publicKeyPEM(pub)
	f.Add(good)
	f.Add(append(append([]byte{}, good...), good...))
	f.Add([]byte(strings.Replace(string(good), "KEY-----\n", "KEY-----\nA: b\n\n", 1)))
	f.Add([]byte("-----BEGIN PUBLIC KEY-----\n-----END PUBLIC KEY-----\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		k, err := parsePublicKeyPEM(b)
		_, aerr := audit.ParsePublicKeyPEM(b)
		if (err == nil) != (aerr == nil) {
			t.Fatalf("evidence err %v, audit err %v: the readings disagree on %q", err, aerr, b)
		}
		if err == nil && len(k) != ed25519.PublicKeySize {
			t.Fatalf("accepted a %d-byte key", len(k))
		}
	})
}

// FuzzDecodePayload: what the evidence reading accepts as a payload is
// one JSON object that the module's RFC 8785 encoder (strictjson, which
// package audit uses) leaves unchanged, so the two canonical encoders
// never disagree in the evidence reading's favour.
func FuzzDecodePayload(f *testing.F) {
	f.Add([]byte(`{"a":1,"b":[true,null,"x\n\u001f"],"c":{"d":-5}}`))
	f.Add([]byte(`{"b":1,"a":2}`))
	f.Add([]byte(`{"a":1,"a":1}`))
	f.Add([]byte(`{"a":"\u00e9"}`))
	f.Add([]byte(`{"\u20ac":1,"😀":2}`))
	f.Add([]byte(`{"a":1.5}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodePayload(b)
		if err != nil {
			return
		}
		if m == nil {
			t.Fatal("accepted without an object")
		}
		canon, err := strictjson.Canonicalize(b)
		if err != nil || !bytes.Equal(canon, b) {
			t.Fatalf("accepted %q, which strictjson canonicalizes to %q (%v)", b, canon, err)
		}
	})
}

// Members sort by UTF-16 code units (RFC 8785 3.2.3), not by UTF-8 bytes:
// U+1F600 (surrogates D83D DE00) comes before U+FF01, though its UTF-8
// sorts after. The reverse order is refused; audit's encoder agrees.
func TestDecodePayloadOrder(t *testing.T) {
	good, bad := []byte(`{"😀":1,"！":2}`), []byte(`{"！":2,"😀":1}`)
	if _, err := decodePayload(good); err != nil {
		t.Fatalf("UTF-16 order: %v", err)
	}
	if _, err := decodePayload(bad); err == nil {
		t.Fatal("UTF-8 byte order accepted")
	}
	if c, err := strictjson.Canonicalize(bad); err != nil || !bytes.Equal(c, good) {
		t.Fatalf("strictjson: %s, %v; want %s", c, err, good)
	}
}

// TestVerifyJournalEgressServiceRecords: a journal that the writer makes
// with every egress, service, approval and budget record type, and a tool server's
// confirmation without any tool call, is complete for the evidence
// reading as for package audit (run.terminated then has no counts.tools:
// tool.server_confirmed counts nowhere). Control: the same journal with a
// type neither reading knows, re-signed, is invalid for both.
func TestVerifyJournalEgressServiceRecords(t *testing.T) {
	w, err := audit.Create(filepath.Join(t.TempDir(), "audit"), "run-egress")
	if err != nil {
		t.Fatal(err)
	}
	attr := audit.Attribution{Status: confirmation.AttributionUnavailable, Reason: "test"}
	var lines [][]byte
	for _, r := range []audit.Record{
		audit.RunStarted{Backend: "native", PolicySHA256: sha(nil), BinarySHA256: sha(nil), PublicKey: string(w.PublicKeyPEM())},
		audit.BoundaryConfirmed{Ready: true},
		audit.ToolServerConfirmed{Server: "calc", Ready: true},
		audit.EgressOpened{TunnelID: "moattun_000000000000000000000001", Host: "pypi.org", Port: 443, Grant: "pypi.org:443",
			Address: "151.101.0.223", SNI: "pypi.org", Attribution: attr},
		audit.EgressClosed{TunnelID: "moattun_000000000000000000000001", BytesToHost: 10, BytesToWorkload: 20, DurationMS: 3, Reason: "closed"},
		audit.EgressRefused{TunnelID: "moattun_000000000000000000000002", Host: "evil.test", Port: 443, Reason: "egress_not_granted", Detail: "no grant", Attribution: attr},
		audit.ServiceRequested{RequestID: "moatreq_000000000000000000000001", Service: "github", Method: "GET", Path: "/o/r.git/info/refs",
			HeadersSHA256: sha(nil), BodySHA256: sha(nil), Attribution: attr},
		audit.ServiceCompleted{RequestID: "moatreq_000000000000000000000001", Status: 200, BodySHA256: sha(nil)},
		audit.ServiceRequested{RequestID: "moatreq_000000000000000000000002", Service: "github", Method: "GET", Path: "/o/r.git/x",
			HeadersSHA256: sha(nil), BodySHA256: sha(nil), Attribution: attr},
		audit.ServiceFailed{RequestID: "moatreq_000000000000000000000002", Reason: "service_redirect", Detail: "redirect refused"},
		audit.ServiceRefused{RequestID: "moatreq_000000000000000000000003", Service: "github", Method: "DELETE", Reason: "service_method_not_allowed", Detail: "no", Attribution: attr},
		audit.ApprovalRequested{ApprovalID: "moatapr_000000000000000000000001", RequestID: "moatreq_000000000000000000000004", Road: "service",
			Target: "github", Name: "/o/r.git/x", RequestSHA256: sha(nil), Principal: audit.Principal{Run: "run-egress", Attribution: attr}, TimeoutMS: 1000},
		audit.ApprovalSubstitution{ApprovalID: "moatapr_000000000000000000000001", Reason: audit.SubstitutionDigest, RequestSHA256: sha(nil), PresentedSHA256: sha([]byte("x")), Detail: "no"},
		audit.ApprovalDecided{ApprovalID: "moatapr_000000000000000000000001", RequestID: "moatreq_000000000000000000000004", Decision: audit.ApprovalDenied, RequestSHA256: sha(nil)},
		audit.BudgetUpdated{RequestID: "r1", Outcome: "settled", ReservedTokens: 64, ChargedTokens: 10,
			Accounts: []audit.BudgetBalance{{Account: "a", Requests: 1, MaxRequests: 2, Tokens: 10, MaxTokens: 100}}},
		audit.RunTerminated{Reason: audit.ReasonCompleted},
	} {
		line, err := w.Append(r)
		if err != nil {
			t.Fatalf("%T: %v", r, err)
		}
		lines = append(lines, line)
	}
	w.Close()
	data := bytes.Join(append(lines, nil), []byte("\n"))
	if ar := audit.Verify(data, w.PublicKey()); ar.Status != audit.Complete {
		t.Fatalf("package audit: %s (%s)", ar.Status, ar.Reason)
	}
	r := verifyJournal(data, w.PublicKey())
	if r.Status != JournalComplete {
		t.Fatalf("the evidence reading: %s (%s)", r.Status, r.Reason)
	}
	var types []string
	for _, rec := range r.Records {
		types = append(types, rec.Type)
	}
	for _, want := range []string{"egress.opened", "egress.closed", "egress.refused", "service.requested", "service.completed", "service.failed", "service.refused", "tool.server_confirmed",
		"approval.requested", "approval.substitution", "approval.decided", "budget.updated"} {
		if !slices.Contains(types, want) {
			t.Errorf("no %s among %v", want, types)
		}
	}

	// The control: an unknown type in the same place, re-signed.
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	k := &rekeyed{priv: priv}
	for _, line := range lines {
		payload, _, _, err := verifyEnvelope(line, auditPayloadType, w.PublicKey())
		if err != nil {
			t.Fatal(err)
		}
		f, err := decodePayload(payload)
		if err != nil {
			t.Fatal(err)
		}
		k.payloads = append(k.payloads, f)
	}
	k.payloads[0]["public_key"] = string(publicKeyPEM(priv.Public().(ed25519.PublicKey)))
	good := k.journal(t, nil, nil)
	pub := priv.Public().(ed25519.PublicKey)
	if r := verifyJournal(good, pub); r.Status != JournalComplete {
		t.Fatalf("re-signed unchanged: %s (%s)", r.Status, r.Reason)
	}
	k.payloads[4]["type"] = "egress.invented"
	bad := k.journal(t, nil, nil)
	if r := verifyJournal(bad, pub); r.Status != JournalInvalid {
		t.Errorf("an unknown egress type: %s, want invalid", r.Status)
	}
	if ar := audit.Verify(bad, pub); ar.Status != audit.Invalid {
		t.Errorf("package audit on an unknown egress type: %s, want invalid", ar.Status)
	}
}
