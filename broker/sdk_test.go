package broker

import (
	"context"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"
)

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
	for _, kv := range WorkloadEnv(p, nil) {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
}

// TestSDKs: the official Go SDKs, configured only from WorkloadEnv, work
// through the broker; the provider sees the real credential and never the
// placeholder.
func TestSDKs(t *testing.T) {
	h := newHarness(t, 20)
	sdkEnv(t, h)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	checkProvider := func(t *testing.T, path, header, want string) {
		t.Helper()
		s := h.fp.last()
		if s.path != path {
			t.Errorf("provider saw path %q, want %q", s.path, path)
		}
		if got := s.header.Get(header); got != want {
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
		n := h.fp.count()
		_, err := c.Messages.New(ctx, anthropic.MessageNewParams{
			Model: "claude-not-allowed", MaxTokens: 16,
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))},
		})
		if err == nil || !strings.Contains(err.Error(), "moat: refused") {
			t.Errorf("error %v, want the broker's refusal", err)
		}
		if h.fp.count() != n {
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
	h.fp.mu.Lock()
	defer h.fp.mu.Unlock()
	for _, s := range h.fp.reqs {
		if strings.Contains(strings.Join(s.header.Values("Authorization"), "")+s.header.Get("X-Api-Key"), Placeholder) {
			t.Errorf("provider saw the placeholder")
		}
	}
}
