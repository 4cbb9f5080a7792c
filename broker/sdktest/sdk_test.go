package sdktest

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/broker"
	"github.com/moat-sandbox/moat/policy"
)

const (
	testCred   = "sk-test-REALCRED-0123456789abcdef"
	testCredOA = "sk-oa-test-REALCRED-fedcba9876543210"
)

// seen is one request as the fake provider observed it.
type seen struct {
	path   string
	header http.Header
}

// provider is a fake provider on 127.0.0.1. Every request must carry a
// Moat-Pre-Effect line signed by the run's key whose body_sha256 is the
// hash of the body received.
type provider struct {
	t   *testing.T
	srv *httptest.Server

	mu   sync.Mutex
	reqs []seen
	w    *audit.Writer
}

func (p *provider) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	line, err := base64.StdEncoding.DecodeString(r.Header.Get("Moat-Pre-Effect"))
	if err != nil {
		p.t.Errorf("provider: bad Moat-Pre-Effect: %v", err)
	}
	e, err := audit.VerifyLine(line, p.w.PublicKey())
	if err != nil {
		p.t.Errorf("provider: Moat-Pre-Effect does not verify: %v", err)
	} else if rec, ok := e.Record.(audit.InferenceRequested); !ok {
		p.t.Errorf("provider: pre-effect record is %T, want inference.requested", e.Record)
	} else if sum := sha256.Sum256(body); rec.BodySHA256 != hex.EncodeToString(sum[:]) {
		p.t.Errorf("provider: body_sha256 %s is not the hash of the body received", rec.BodySHA256)
	}
	p.mu.Lock()
	p.reqs = append(p.reqs, seen{path: r.URL.Path, header: r.Header.Clone()})
	p.mu.Unlock()
	respond(w, r, body)
}

func (p *provider) last() seen {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.reqs) == 0 {
		return seen{}
	}
	return p.reqs[len(p.reqs)-1]
}

func (p *provider) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.reqs)
}

// respond answers like the real APIs do, enough for the SDKs.
func respond(w http.ResponseWriter, r *http.Request, body []byte) {
	var req struct {
		Model  string `json:"model"`
		Stream bool   `json:"stream"`
	}
	json.Unmarshal(body, &req)
	switch {
	case r.URL.Path == "/v1/messages" && req.Stream:
		w.Header().Set("Content-Type", "text/event-stream")
		for _, ev := range []string{
			`event: message_start` + "\n" + `data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"` + req.Model + `","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":11,"output_tokens":1}}}` + "\n\n",
			`event: content_block_start` + "\n" + `data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}` + "\n\n",
			`event: content_block_delta` + "\n" + `data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hello "}}` + "\n\n",
			`event: content_block_delta` + "\n" + `data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"stream"}}` + "\n\n",
			`event: content_block_stop` + "\n" + `data: {"type":"content_block_stop","index":0}` + "\n\n",
			`event: message_delta` + "\n" + `data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":12}}` + "\n\n",
			`event: message_stop` + "\n" + `data: {"type":"message_stop"}` + "\n\n",
		} {
			io.WriteString(w, ev)
			w.(http.Flusher).Flush()
		}
	case r.URL.Path == "/v1/messages":
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"msg_1","type":"message","role":"assistant","model":%q,"content":[{"type":"text","text":"hello from fake"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":3,"output_tokens":5}}`, req.Model)
	case r.URL.Path == "/v1/chat/completions":
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":"hello from fake"},"finish_reason":"stop","logprobs":null}],"usage":{"prompt_tokens":4,"completion_tokens":6,"total_tokens":10}}`, req.Model)
	case r.URL.Path == "/v1/responses":
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"resp_1","object":"response","created_at":1700000000,"status":"completed","model":%q,"output":[{"type":"message","id":"msg_1","status":"completed","role":"assistant","content":[{"type":"output_text","text":"hello from fake","annotations":[]}]}],"usage":{"input_tokens":7,"output_tokens":8,"total_tokens":15,"input_tokens_details":{"cached_tokens":0},"output_tokens_details":{"reasoning_tokens":0}}}`, req.Model)
	default:
		http.Error(w, "no such path", 404)
	}
}

// harness is a broker on 127.0.0.1 with a real journal, in front of the
// fake provider.
type harness struct {
	addr string
	fp   *provider
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
	fp := &provider{t: t, w: w}
	fp.srv = httptest.NewServer(http.HandlerFunc(fp.serve))
	t.Cleanup(fp.srv.Close)
	pol := &policy.Policy{Version: 1, Audit: policy.Audit{MaxBytes: policy.DefaultAuditMaxBytes}, Inference: policy.Inference{MaxRequests: 20, MaxOutputTokens: 1024, MaxRefusals: policy.DefaultMaxRefusals, Providers: []policy.Provider{
		{Name: "anthropic", API: "anthropic-messages", BaseURL: fp.srv.URL, CredentialEnv: "ANTHROPIC_API_KEY", Models: []string{"claude-test"}},
		{Name: "openai", API: "openai-chat", BaseURL: fp.srv.URL, CredentialEnv: "OPENAI_API_KEY", Models: []string{"gpt-test"}},
		{Name: "openai-r", API: "openai-responses", BaseURL: fp.srv.URL, CredentialEnv: "OPENAI_API_KEY", Models: []string{"gpt-test"}},
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
		if strings.Contains(strings.Join(s.header.Values("Authorization"), "")+s.header.Get("X-Api-Key"), broker.Placeholder) {
			t.Errorf("provider saw the placeholder")
		}
	}
}
