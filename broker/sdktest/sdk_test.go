package sdktest

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/broker"
	"github.com/moat-sandbox/moat/internal/fakeprovider"
	"github.com/moat-sandbox/moat/policy"
)

const (
	testCred   = "sk-test-REALCRED-0123456789abcdef"
	testCredOA = "sk-oa-test-REALCRED-fedcba9876543210"
)

// harness is a broker on 127.0.0.1 with a real journal, in front of the
// fake provider.
type harness struct {
	addr string
	fp   *fakeprovider.Server
	pol  *policy.Policy
}

func newHarness(t *testing.T) *harness {
	w, err := audit.Create(filepath.Join(t.TempDir(), "run"), "run-sdk-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	if _, err := w.Append(audit.RunStarted{PolicySHA256: strings.Repeat("0", 64), Backend: "test", BinarySHA256: strings.Repeat("0", 64), PublicKey: string(w.PublicKeyPEM())}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Append(audit.BoundaryConfirmed{Ready: true, Properties: boundary.Properties{}}); err != nil {
		t.Fatal(err)
	}
	// Every request must carry a Moat-Pre-Effect line signed by the run's
	// key whose body_sha256 is the hash of the body received.
	fp, err := fakeprovider.Start(fakeprovider.Options{CheckPreEffect: true})
	if err != nil {
		t.Fatal(err)
	}
	fp.Pin(w.PublicKey())
	t.Cleanup(func() {
		fp.Close()
		for _, r := range fp.Requests() {
			if r.PreEffectErr != nil {
				t.Errorf("provider: %s: %v", r.Path, r.PreEffectErr)
			}
		}
	})
	pol := &policy.Policy{Version: 1, Audit: policy.Audit{MaxBytes: policy.DefaultAuditMaxBytes}, Inference: policy.Inference{MaxRequests: 20, MaxOutputTokens: 1024, MaxRefusals: policy.DefaultMaxRefusals, Providers: []policy.Provider{
		{Name: "anthropic", API: "anthropic-messages", BaseURL: fp.URL, CredentialEnv: "ANTHROPIC_API_KEY", Models: []string{"claude-test"}},
		{Name: "openai", API: "openai-chat", BaseURL: fp.URL, CredentialEnv: "OPENAI_API_KEY", Models: []string{"gpt-test"}},
		{Name: "openai-r", API: "openai-responses", BaseURL: fp.URL, CredentialEnv: "OPENAI_API_KEY", Models: []string{"gpt-test"}},
	}}}
	b, err := broker.New(broker.Config{Policy: pol, Journal: w,
		Credentials: map[string]string{"anthropic": testCred, "openai": testCredOA, "openai-r": testCredOA}})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go b.Serve(l)
	t.Cleanup(func() { b.Close() })
	return &harness{addr: l.Addr().String(), fp: fp, pol: pol}
}

// sdkEnv configures the process environment from WorkloadEnv only, and
// clears every other variable the SDKs read.
func sdkEnv(t *testing.T, h *harness) {
	for _, k := range []string{"ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_PROFILE", "ANTHROPIC_CUSTOM_HEADERS", "ANTHROPIC_CONFIG_DIR",
		"ANTHROPIC_FEDERATION_RULE_ID", "ANTHROPIC_ORGANIZATION_ID", "ANTHROPIC_IDENTITY_TOKEN", "ANTHROPIC_IDENTITY_TOKEN_FILE",
		"ANTHROPIC_WEBHOOK_SIGNING_KEY", "OPENAI_ORG_ID", "OPENAI_PROJECT_ID", "OPENAI_ADMIN_KEY", "OPENAI_WEBHOOK_SECRET"} {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
	_, port, _ := net.SplitHostPort(h.addr)
	p, _ := strconv.Atoi(port)
	for _, kv := range broker.WorkloadEnv(p, h.pol) {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
}

// TestSDKs: the official Go SDKs, configured only from WorkloadEnv, work
// through the broker; the provider sees the real credential and never the
// placeholder.
func TestSDKs(t *testing.T) {
	h := newHarness(t)
	sdkEnv(t, h)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	checkProvider := func(t *testing.T, path, header, want string) {
		t.Helper()
		s := h.fp.Last()
		if s.Path != path {
			t.Errorf("provider saw path %q, want %q", s.Path, path)
		}
		if got := s.Header.Get(header); got != want {
			t.Errorf("provider saw %s %q, want the real credential", header, got)
		}
	}

	t.Run("anthropic messages", func(t *testing.T) {
		c := anthropic.NewClient()
		msg, err := c.Messages.New(ctx, anthropic.MessageNewParams{
			Model: "claude-test", MaxTokens: 16,
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))},
		})
		if err != nil {
			t.Fatalf("Messages.New: %v", err)
		}
		if len(msg.Content) != 1 || msg.Content[0].Text != "hello from fake" || msg.Usage.OutputTokens != 5 {
			t.Errorf("message %+v, want the fake provider's answer", msg)
		}
		checkProvider(t, "/v1/messages", "X-Api-Key", testCred)
	})
	t.Run("anthropic streaming", func(t *testing.T) {
		c := anthropic.NewClient()
		st := c.Messages.NewStreaming(ctx, anthropic.MessageNewParams{
			Model: "claude-test", MaxTokens: 16,
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))},
		})
		var acc anthropic.Message
		for st.Next() {
			if err := acc.Accumulate(st.Current()); err != nil {
				t.Fatalf("Accumulate: %v", err)
			}
		}
		if err := st.Err(); err != nil {
			t.Fatalf("stream: %v", err)
		}
		if len(acc.Content) != 1 || acc.Content[0].Text != "hello stream" {
			t.Errorf("accumulated %+v, want \"hello stream\"", acc.Content)
		}
		checkProvider(t, "/v1/messages", "X-Api-Key", testCred)
	})
	t.Run("anthropic refusal reaches the SDK", func(t *testing.T) {
		c := anthropic.NewClient()
		n := h.fp.Count()
		_, err := c.Messages.New(ctx, anthropic.MessageNewParams{
			Model: "claude-not-allowed", MaxTokens: 16,
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))},
		})
		if err == nil || !strings.Contains(err.Error(), "moat: refused") {
			t.Errorf("error %v, want the broker's refusal", err)
		}
		if h.fp.Count() != n {
			t.Errorf("refused request reached the provider")
		}
	})
	t.Run("openai chat", func(t *testing.T) {
		c := openai.NewClient()
		cc, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model:    "gpt-test",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
		})
		if err != nil {
			t.Fatalf("Chat.Completions.New: %v", err)
		}
		if len(cc.Choices) != 1 || cc.Choices[0].Message.Content != "hello from fake" {
			t.Errorf("completion %+v, want the fake provider's answer", cc)
		}
		checkProvider(t, "/v1/chat/completions", "Authorization", "Bearer "+testCredOA)
	})
	t.Run("openai responses", func(t *testing.T) {
		c := openai.NewClient()
		r, err := c.Responses.New(ctx, responses.ResponseNewParams{
			Model: "gpt-test",
			Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")},
		})
		if err != nil {
			t.Fatalf("Responses.New: %v", err)
		}
		if r.OutputText() != "hello from fake" {
			t.Errorf("output %q, want the fake provider's answer", r.OutputText())
		}
		checkProvider(t, "/v1/responses", "Authorization", "Bearer "+testCredOA)
	})
	for _, s := range h.fp.Requests() {
		if strings.Contains(strings.Join(s.Header.Values("Authorization"), "")+s.Header.Get("X-Api-Key"), broker.Placeholder) {
			t.Errorf("provider saw the placeholder")
		}
	}
}
