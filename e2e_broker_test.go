//go:build linux

package moat_test

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/audit"
)

const e2eSecond = time.Second

const (
	anthropicCred = "sk-ant-e2e-real-credential-0123456789"
	openaiCred    = "sk-openai-e2e-real-credential-9876543210"
)

// provider is a fake model provider on the host's loopback that speaks the
// three APIs, records what reached it, and checks each request's
// Moat-Pre-Effect line against the run key once it is pinned.
type provider struct {
	srv  *httptest.Server
	mu   sync.Mutex
	reqs []seen
	pub  ed25519.PublicKey
}

type seen struct {
	path, query string
	header      http.Header
	body        []byte
	preEffect   error // nil when the pre-effect line verified and matched the body
}

func newProvider(t *testing.T, tls bool) *provider {
	p := &provider{}
	h := http.HandlerFunc(p.serve)
	if tls {
		p.srv = httptest.NewTLSServer(h)
	} else {
		p.srv = httptest.NewServer(h)
	}
	t.Cleanup(p.srv.Close)
	return p
}

func (p *provider) pin(pemText string) error {
	b, _ := pem.Decode([]byte(pemText))
	if b == nil {
		return fmt.Errorf("no PEM")
	}
	pub, err := audit.ParsePublicKeyPEM([]byte(pemText))
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.pub = pub
	p.mu.Unlock()
	return nil
}

func (p *provider) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	s := seen{path: r.URL.Path, query: r.URL.RawQuery, header: r.Header.Clone(), body: body}
	s.preEffect = p.checkPreEffect(r.Header.Get("Moat-Pre-Effect"), body)
	p.mu.Lock()
	p.reqs = append(p.reqs, s)
	p.mu.Unlock()
	var req struct {
		Model  string `json:"model"`
		Stream bool   `json:"stream"`
	}
	json.Unmarshal(body, &req)
	fl, _ := w.(http.Flusher)
	switch {
	case r.URL.Path == "/v1/messages" && req.Stream:
		w.Header().Set("Content-Type", "text/event-stream")
		evs := []string{"message_start", "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop", "message_delta", "message_stop"}
		datas := []string{
			`{"type":"message_start","message":{"id":"msg_e2e","type":"message","role":"assistant","model":"` + req.Model + `","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":2,"output_tokens":1}}}`,
			`{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
			`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"streamed "}}`,
			`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"answer"}}`,
			`{"type":"content_block_stop","index":0}`,
			`{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":3}}`,
			`{"type":"message_stop"}`,
		}
		for i := range evs {
			fmt.Fprintf(w, "event: %s\ndata: %s\n\n", evs[i], datas[i])
			if fl != nil {
				fl.Flush()
			}
		}
	case r.URL.Path == "/v1/messages":
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"msg_e2e","type":"message","role":"assistant","model":%q,"content":[{"type":"text","text":"provider answer"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":2,"output_tokens":2}}`, req.Model)
	case r.URL.Path == "/v1/chat/completions":
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"chatcmpl-e2e","object":"chat.completion","created":1700000000,"model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":"provider answer"},"finish_reason":"stop","logprobs":null}],"usage":{"prompt_tokens":2,"completion_tokens":2,"total_tokens":4}}`, req.Model)
	case r.URL.Path == "/v1/responses":
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"resp_e2e","object":"response","created_at":1700000000,"status":"completed","model":%q,"output":[{"type":"message","id":"msg_e2e","status":"completed","role":"assistant","content":[{"type":"output_text","text":"provider answer","annotations":[]}]}],"usage":{"input_tokens":2,"output_tokens":2,"total_tokens":4,"input_tokens_details":{"cached_tokens":0},"output_tokens_details":{"reasoning_tokens":0}}}`, req.Model)
	default:
		http.Error(w, "no such endpoint", 404)
	}
}

// checkPreEffect verifies the Moat-Pre-Effect line against the pinned run
// key and checks that it covers exactly the bytes that arrived.
func (p *provider) checkPreEffect(h string, body []byte) error {
	p.mu.Lock()
	pub := p.pub
	p.mu.Unlock()
	if pub == nil {
		return fmt.Errorf("no run key pinned yet")
	}
	line, err := base64.StdEncoding.DecodeString(h)
	if err != nil {
		return fmt.Errorf("Moat-Pre-Effect: %v", err)
	}
	e, err := audit.VerifyLine(line, pub)
	if err != nil {
		return err
	}
	rec, ok := e.Record.(audit.InferenceRequested)
	if !ok {
		return fmt.Errorf("pre-effect record is %T", e.Record)
	}
	if want := sha256hex(body); rec.BodySHA256 != want {
		return fmt.Errorf("body_sha256 %s, but the body received hashes to %s", rec.BodySHA256, want)
	}
	return nil
}

func (p *provider) seen() []seen {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]seen(nil), p.reqs...)
}

func (p *provider) port() string {
	_, port, _ := net.SplitHostPort(p.srv.Listener.Addr().String())
	return port
}

// brokerPolicy grants the usual system paths and names the providers.
func (e *env) brokerPolicy(p, ptls *provider) string {
	ca := filepath.Join(e.dir, "provider-ca.pem")
	pemCert := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ptls.srv.Certificate().Raw})
	if err := os.WriteFile(ca, pemCert, 0o644); err != nil {
		e.t.Fatal(err)
	}
	return e.policy(fmt.Sprintf(`inference:
  max_requests: 64
  max_output_tokens: 1024
  providers:
    - name: anthropic
      api: anthropic-messages
      base_url: http://127.0.0.1:%s
      credential_env: E2E_ANTHROPIC_KEY
      models: [claude-e2e]
    - name: anthropic-tls
      api: anthropic-messages
      base_url: https://127.0.0.1:%s
      credential_env: E2E_ANTHROPIC_KEY
      models: [claude-e2e-tls]
      ca_file: %s
    - name: openai
      api: openai-chat
      base_url: http://127.0.0.1:%s
      credential_env: E2E_OPENAI_KEY
      models: [gpt-e2e]
    - name: openai-responses
      api: openai-responses
      base_url: http://127.0.0.1:%s
      credential_env: E2E_OPENAI_KEY
      models: [gpt-e2e]
`, p.port(), ptls.port(), ca, p.port(), p.port()))
}

// runWithProvider runs the probe with actions, pinning the run key in the
// providers as soon as --run-info appears (before the first request).
func (e *env) runWithProvider(pol string, ps []*provider, actions ...string) (result, string) {
	e.t.Helper()
	ri := filepath.Join(e.dir, fmt.Sprintf("run-%d.json", len(actions)))
	os.Remove(ri)
	args := append([]string{"run", "--policy", pol, "--run-info", ri, "--", e.probe, helperArg, "wait-file=" + e.workspace + "/pinned"}, actions...)
	cmd := e.command(args...)
	cmd.Env = append(cmd.Env, "E2E_ANTHROPIC_KEY="+anthropicCred, "E2E_OPENAI_KEY="+openaiCred)
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	waitFor(e.t, "run info", 60*e2eSecond, func() bool { _, err := os.Stat(ri); return err == nil })
	var info struct {
		Journal      string `json:"journal"`
		PublicKeyPEM string `json:"public_key_pem"`
	}
	b, _ := os.ReadFile(ri)
	if err := json.Unmarshal(b, &info); err != nil {
		e.t.Fatalf("run info: %v", err)
	}
	for _, p := range ps {
		if err := p.pin(info.PublicKeyPEM); err != nil {
			e.t.Fatal(err)
		}
	}
	os.WriteFile(e.workspace+"/pinned", nil, 0o644)
	os.Chmod(e.workspace+"/pinned", 0o644)
	cmd.Wait()
	return result{so.String(), se.String(), cmd.ProcessState.ExitCode()}, info.Journal
}

// Unmodified official SDKs, configured only by the environment moat sets,
// work through the broker from inside a sandbox; the provider sees the real
// credential, never the placeholder, and a verified pre-effect record for
// every request; the journal verifies complete.
func TestRunSDKsThroughBroker(t *testing.T) {
	e := newEnv(t)
	p, ptls := newProvider(t, false), newProvider(t, true)
	pol := e.brokerPolicy(p, ptls)
	actions := []string{"sdk-anthropic=claude-e2e", "sdk-anthropic=claude-e2e-tls", "sdk-anthropic-stream=claude-e2e",
		"sdk-openai-chat=gpt-e2e", "sdk-openai-responses=gpt-e2e", "sdk-anthropic=claude-not-allowed", "env="}
	r, journal := e.runWithProvider(pol, []*provider{p, ptls}, actions...)
	if r.code != 0 {
		t.Fatalf("%s", r)
	}
	wantOK(t, r, "sdk-anthropic=claude-e2e")
	wantOK(t, r, "sdk-anthropic=claude-e2e-tls")
	wantOK(t, r, "sdk-anthropic-stream=claude-e2e")
	wantOK(t, r, "sdk-openai-chat=gpt-e2e")
	wantOK(t, r, "sdk-openai-responses=gpt-e2e")
	wantErr(t, r, "sdk-anthropic=claude-not-allowed", "not allowed")
	if !strings.Contains(line(t, r, "answer sdk-anthropic-stream=claude-e2e"), "streamed answer") {
		t.Errorf("stream: %s", r)
	}
	if !strings.Contains(line(t, r, "answer sdk-openai-responses=gpt-e2e"), "provider answer") {
		t.Errorf("responses: %s", r)
	}
	all := append(p.seen(), ptls.seen()...)
	if len(all) != 5 {
		t.Errorf("providers saw %d requests, want 5 (the refused one never arrives)", len(all))
	}
	for _, s := range all {
		if s.preEffect != nil {
			t.Errorf("%s: pre-effect: %v", s.path, s.preEffect)
		}
		creds := s.header.Get("X-Api-Key") + s.header.Get("Authorization")
		if strings.Contains(creds, "placeholder") || (!strings.Contains(creds, anthropicCred) && !strings.Contains(creds, openaiCred)) {
			t.Errorf("%s: provider saw credentials %q, want the real one only", s.path, creds)
		}
	}
	v := e.moat("audit", "verify", journal, "--pubkey", filepath.Join(filepath.Dir(journal), "pubkey.pem"))
	if v.code != 0 || !strings.Contains(v.stdout, "complete") {
		t.Errorf("journal: %s", v)
	}
	// The real credentials never entered the sandbox; the placeholders did.
	envLine := line(t, r, "env=")
	if strings.Contains(r.stdout, anthropicCred) || strings.Contains(r.stdout, openaiCred) {
		t.Errorf("a real credential is visible inside")
	}
	if !strings.Contains(r.stdout, "ANTHROPIC_API_KEY=") || !strings.Contains(r.stdout, "OPENAI_BASE_URL=http://127.0.0.1:") {
		t.Errorf("moat did not set the SDK variables inside: %s", envLine)
	}
}

func sha256hex(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}
