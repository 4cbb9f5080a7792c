package fakeprovider

import (
	"bufio"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/audit"
)

func start(t *testing.T, o Options) *Server {
	t.Helper()
	s, err := Start(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func post(t *testing.T, s *Server, path, body string, hdr ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequest("POST", s.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := s.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// Each API's answer decodes as the API's shape, with the request's model
// and the fixed text, over HTTP and HTTPS.
func TestRespond(t *testing.T) {
	for _, tls := range []bool{false, true} {
		s := start(t, Options{TLS: tls})
		if (s.Certificate() != nil) != tls || strings.HasPrefix(s.URL, "https://") != tls {
			t.Fatalf("tls %v: URL %s, certificate %v", tls, s.URL, s.Certificate() != nil)
		}
		for _, tt := range []struct {
			path, text string // text: where the answer's text is, as a JSON path
			get        func(map[string]any) any
		}{
			{"/v1/messages", Text, func(m map[string]any) any { return m["content"].([]any)[0].(map[string]any)["text"] }},
			{"/v1/chat/completions", Text, func(m map[string]any) any {
				return m["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)["content"]
			}},
			{"/v1/responses", Text, func(m map[string]any) any {
				return m["output"].([]any)[0].(map[string]any)["content"].([]any)[0].(map[string]any)["text"]
			}},
		} {
			resp := post(t, s, tt.path, `{"model":"m\"1"}`)
			var m map[string]any
			if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
				t.Fatalf("%s: %v", tt.path, err)
			}
			if m["model"] != `m"1` || tt.get(m) != tt.text {
				t.Errorf("%s: got model %v text %v, want %q %q", tt.path, m["model"], tt.get(m), `m"1`, tt.text)
			}
		}
		// Control: another path is not an API.
		if resp := post(t, s, "/v1/other", `{}`); resp.StatusCode != 404 {
			t.Errorf("/v1/other: got %d, want 404", resp.StatusCode)
		}
		if got := s.Count(); got != 4 {
			t.Errorf("got %d requests recorded, want 4", got)
		}
	}
}

// A streamed Messages answer is server-sent events whose deltas make
// StreamText, ending with message_stop.
func TestStream(t *testing.T) {
	s := start(t, Options{})
	resp := post(t, s, "/v1/messages", `{"model":"m","stream":true}`)
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("got Content-Type %q", ct)
	}
	var text, last string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var ev struct {
			Type  string `json:"type"`
			Delta struct {
				Text string `json:"text"`
			} `json:"delta"`
		}
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Fatalf("%q: %v", data, err)
		}
		text += ev.Delta.Text
		last = ev.Type
	}
	if text != StreamText || last != "message_stop" {
		t.Fatalf("got text %q ending %q, want %q ending message_stop", text, last, StreamText)
	}
}

// The recorded request is what arrived; SetRespond replaces the answer
// but not the record.
func TestRecordAndSetRespond(t *testing.T) {
	s := start(t, Options{})
	s.SetRespond(func(w http.ResponseWriter, r *http.Request, body []byte) { http.Error(w, "overloaded", 529) })
	resp := post(t, s, "/v1/messages?beta=true", `{"model":"m"}`, "X-Api-Key", "k")
	if resp.StatusCode != 529 {
		t.Fatalf("got %d, want 529", resp.StatusCode)
	}
	r := s.Last()
	if r.Method != "POST" || r.Path != "/v1/messages" || r.Query != "beta=true" || string(r.Body) != `{"model":"m"}` || r.Header.Get("X-Api-Key") != "k" {
		t.Fatalf("got %+v", r)
	}
	s.SetRespond(nil)
	if resp := post(t, s, "/v1/messages", `{}`); resp.StatusCode != 200 {
		t.Fatalf("after SetRespond(nil): got %d, want 200", resp.StatusCode)
	}
}

// A body over MaxBody is refused, and recorded cut.
func TestMaxBody(t *testing.T) {
	s := start(t, Options{})
	resp := post(t, s, "/v1/messages", strings.Repeat("x", MaxBody+1))
	io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusRequestEntityTooLarge || len(s.Last().Body) != MaxBody {
		t.Fatalf("got %d with %d bytes recorded", resp.StatusCode, len(s.Last().Body))
	}
}

// The pre-effect check passes a line signed by the pinned key over the
// body received, and refuses each way of getting it wrong.
func TestCheckPreEffect(t *testing.T) {
	w, err := audit.Create(filepath.Join(t.TempDir(), "run"), "run-fake")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := w.Append(audit.RunStarted{PolicySHA256: "p", Backend: "native", BinarySHA256: "b", PublicKey: string(w.PublicKeyPEM())}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Append(audit.BoundaryConfirmed{Ready: true}); err != nil {
		t.Fatal(err)
	}
	body := `{"model":"m"}`
	sum := sha256.Sum256([]byte(body))
	line, err := w.Append(audit.InferenceRequested{RequestID: "r1", Provider: "anthropic", Model: "m", BodySHA256: hex.EncodeToString(sum[:])})
	if err != nil {
		t.Fatal(err)
	}
	hdr := base64.StdEncoding.EncodeToString(line)
	other, err := audit.Create(filepath.Join(t.TempDir(), "run"), "run-other")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()

	s := start(t, Options{CheckPreEffect: true})
	check := func(name, body, hdr string, want string) {
		t.Helper()
		if hdr == "" {
			post(t, s, "/v1/messages", body)
		} else {
			post(t, s, "/v1/messages", body, "Moat-Pre-Effect", hdr)
		}
		err := s.Last().PreEffectErr
		switch {
		case want == "" && err != nil:
			t.Errorf("%s: got %v, want it verified", name, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("%s: got %v, want an error with %q", name, err, want)
		}
	}
	check("before Pin", body, hdr, "no run key")
	s.Pin(w.PublicKey())
	check("good", body, hdr, "")
	if string(s.Last().PreEffect) != string(line) {
		t.Errorf("PreEffect: got %q, want the line", s.Last().PreEffect)
	}
	check("other body", `{"model":"n"}`, hdr, "hashes to")
	check("not base64", body, "!!", "Moat-Pre-Effect")
	check("absent", body, "", "0 Moat-Pre-Effect headers")
	s.Pin(other.PublicKey())
	check("other key", body, hdr, "wrong key")
}

// VerifyPreEffect with a test's own verify: its refusal is the verdict,
// and a verified line must still be an inference.requested record for
// exactly the body (the control: the same line and body pass).
func TestVerifyPreEffectOwnCheck(t *testing.T) {
	w, err := audit.Create(filepath.Join(t.TempDir(), "run"), "run-fake")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	started, err := w.Append(audit.RunStarted{PolicySHA256: "p", Backend: "native", BinarySHA256: "b", PublicKey: string(w.PublicKeyPEM())})
	if err != nil {
		t.Fatal(err)
	}
	w.Append(audit.BoundaryConfirmed{Ready: true})
	body := []byte(`{"model":"m"}`)
	sum := sha256.Sum256(body)
	line, err := w.Append(audit.InferenceRequested{RequestID: "r1", Provider: "anthropic", Model: "m", BodySHA256: hex.EncodeToString(sum[:])})
	if err != nil {
		t.Fatal(err)
	}
	enc := func(l []byte) []string { return []string{base64.StdEncoding.EncodeToString(l)} }
	ok := func([]byte) error { return nil }
	if err := VerifyPreEffect(enc(line), body, ok); err != nil {
		t.Fatalf("control: %v", err)
	}
	refuse := func([]byte) error { return errors.New("not in my journal") }
	if err := VerifyPreEffect(enc(line), body, refuse); err == nil || err.Error() != "not in my journal" {
		t.Errorf("own check: got %v", err)
	}
	if err := VerifyPreEffect(enc(started), body, ok); err == nil || !strings.Contains(err.Error(), "want inference.requested") {
		t.Errorf("run.started as the pre-effect: got %v", err)
	}
	if err := VerifyPreEffect(append(enc(line), enc(line)...), body, ok); err == nil || !strings.Contains(err.Error(), "2 Moat-Pre-Effect headers") {
		t.Errorf("two headers: got %v", err)
	}
}

// NoRecord answers as usual and keeps nothing; without it the same
// request is recorded (the control).
func TestNoRecord(t *testing.T) {
	for _, noRecord := range []bool{true, false} {
		s := start(t, Options{NoRecord: noRecord, CheckPreEffect: true})
		resp := post(t, s, "/v1/messages", `{"model":"m"}`)
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || !strings.Contains(string(b), Text) {
			t.Errorf("NoRecord %v: answer %d %s", noRecord, resp.StatusCode, b)
		}
		want := 1
		if noRecord {
			want = 0
		}
		if s.Count() != want || len(s.Requests()) != want {
			t.Errorf("NoRecord %v: %d requests recorded, want %d", noRecord, s.Count(), want)
		}
	}
}
