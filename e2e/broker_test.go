//go:build linux

package e2e

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/fakeprovider"
)

const e2eSecond = time.Second

const (
	anthropicCred = "sk-ant-e2e-real-credential-0123456789"
	openaiCred    = "sk-openai-e2e-real-credential-9876543210"
)

// provider is the fake model provider on the host's loopback
// (internal/fakeprovider): it speaks the three APIs, records what reached
// it, and checks each request's Moat-Pre-Effect line against the run key
// once it is pinned.
type provider = fakeprovider.Server

func newProvider(t *testing.T, tls bool) *provider {
	t.Helper()
	p, err := fakeprovider.Start(fakeprovider.Options{TLS: tls, CheckPreEffect: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// brokerPolicy grants the usual system paths and names the providers.
func (e *env) brokerPolicy(p, ptls *provider) string {
	ca := filepath.Join(e.dir, "provider-ca.pem")
	pemCert := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ptls.Certificate().Raw})
	if err := os.WriteFile(ca, pemCert, 0o644); err != nil {
		e.t.Fatal(err)
	}
	return e.policy(fmt.Sprintf(`inference:
  max_requests: 64
  max_output_tokens: 1024
  providers:
    - name: anthropic
      api: anthropic-messages
      base_url: http://127.0.0.1:%d
      credential_env: E2E_ANTHROPIC_KEY
      models: [claude-e2e]
    - name: anthropic-tls
      api: anthropic-messages
      base_url: https://127.0.0.1:%d
      credential_env: E2E_ANTHROPIC_KEY
      models: [claude-e2e-tls]
      ca_file: %s
    - name: openai
      api: openai-chat
      base_url: http://127.0.0.1:%d
      credential_env: E2E_OPENAI_KEY
      models: [gpt-e2e]
    - name: openai-responses
      api: openai-responses
      base_url: http://127.0.0.1:%d
      credential_env: E2E_OPENAI_KEY
      models: [gpt-e2e]
`, p.Port(), ptls.Port(), ca, p.Port(), p.Port()))
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
		if err := p.PinPEM(info.PublicKeyPEM); err != nil {
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
	if !strings.Contains(line(t, r, "sdk-anthropic-stream=claude-e2e"), fakeprovider.StreamText) {
		t.Errorf("stream: %s", r)
	}
	if !strings.Contains(line(t, r, "sdk-openai-responses=gpt-e2e"), fakeprovider.Text) {
		t.Errorf("responses: %s", r)
	}
	all := append(p.Requests(), ptls.Requests()...)
	if len(all) != 5 {
		t.Errorf("providers saw %d requests, want 5 (the refused one never arrives)", len(all))
	}
	for _, s := range all {
		if s.PreEffectErr != nil {
			t.Errorf("%s: pre-effect: %v", s.Path, s.PreEffectErr)
		}
		creds := s.Header.Get("X-Api-Key") + s.Header.Get("Authorization")
		if strings.Contains(creds, "placeholder") || (!strings.Contains(creds, anthropicCred) && !strings.Contains(creds, openaiCred)) {
			t.Errorf("%s: provider saw credentials %q, want the real one only", s.Path, creds)
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
