package wire

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	anthoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	oaioption "github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
	"github.com/openai/openai-go/v3/shared"
)

// captured is one request an official SDK sent.
type captured struct {
	path string
	body []byte
}

// recorder is a fake provider on 127.0.0.1 that records request bodies and
// answers with an empty success, so that the SDKs do not retry.
type recorder struct {
	mu   sync.Mutex
	reqs []captured
	srv  *httptest.Server
}

func newRecorder(t *testing.T) *recorder {
	t.Helper()
	r := &recorder{}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, err := io.ReadAll(req.Body)
		if err != nil {
			t.Errorf("reading request body: %v", err)
		}
		r.mu.Lock()
		r.reqs = append(r.reqs, captured{req.URL.Path, b})
		r.mu.Unlock()
		if req.Header.Get("Accept") == "text/event-stream" {
			w.Header().Set("Content-Type", "text/event-stream")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{}`)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

// last returns the only request recorded since the previous call.
func (r *recorder) last(t *testing.T) captured {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.reqs) != 1 {
		t.Fatalf("recorded %d requests, want 1", len(r.reqs))
	}
	c := r.reqs[0]
	r.reqs = nil
	return c
}

var weatherSchema = map[string]any{
	"type":       "object",
	"properties": map[string]any{"city": map[string]any{"type": "string", "description": "City name"}},
	"required":   []string{"city"},
}

// sdkBodies returns the exact bodies the official SDKs send for ordinary
// requests, by API.
func sdkBodies(t *testing.T) map[string][]captured {
	t.Helper()
	ctx := context.Background()
	rec := newRecorder(t)
	out := map[string][]captured{}

	// anthropic-sdk-go: system, a custom tool, tool_choice, a tool_use /
	// tool_result round; once plain, once streaming; and count_tokens.
	ac := anthropic.NewClient(anthoption.WithBaseURL(rec.srv.URL), anthoption.WithAPIKey("placeholder"), anthoption.WithMaxRetries(0))
	ap := anthropic.MessageNewParams{
		Model:     "claude-sonnet-4-5",
		MaxTokens: 1024,
		System:    []anthropic.TextBlockParam{{Text: "You are a careful assistant."}},
		Messages: []anthropic.MessageParam{
			anthropic.NewUserMessage(anthropic.NewTextBlock("What is the weather in Paris?")),
			anthropic.NewAssistantMessage(
				anthropic.NewTextBlock("Let me check."),
				anthropic.NewToolUseBlock("toolu_01", map[string]any{"city": "Paris"}, "get_weather")),
			anthropic.NewUserMessage(anthropic.NewToolResultBlock("toolu_01", "sunny, 21°C", false)),
		},
		Tools: []anthropic.ToolUnionParam{{OfTool: &anthropic.ToolParam{
			Name:        "get_weather",
			Description: anthropic.String("Current weather for a city"),
			InputSchema: anthropic.ToolInputSchemaParam{
				Properties: weatherSchema["properties"],
				Required:   []string{"city"},
			},
		}}},
		ToolChoice: anthropic.ToolChoiceUnionParam{OfAuto: &anthropic.ToolChoiceAutoParam{}},
	}
	ac.Messages.New(ctx, ap)
	out[APIAnthropicMessages] = append(out[APIAnthropicMessages], rec.last(t))
	st := ac.Messages.NewStreaming(ctx, ap)
	for st.Next() {
	}
	st.Close()
	out[APIAnthropicMessages] = append(out[APIAnthropicMessages], rec.last(t))
	ac.Messages.CountTokens(ctx, anthropic.MessageCountTokensParams{
		Model:    "claude-sonnet-4-5",
		Messages: ap.Messages,
		Tools: []anthropic.MessageCountTokensToolUnionParam{{OfTool: &anthropic.ToolParam{
			Name:        "get_weather",
			InputSchema: anthropic.ToolInputSchemaParam{Properties: weatherSchema["properties"]},
		}}},
	})
	out[APIAnthropicMessages] = append(out[APIAnthropicMessages], rec.last(t))

	// openai-go chat completions: a function tool, a tool call round, once
	// plain and once streaming with stream_options.
	oc := openai.NewClient(oaioption.WithBaseURL(rec.srv.URL+"/v1"), oaioption.WithAPIKey("placeholder"), oaioption.WithMaxRetries(0))
	cp := openai.ChatCompletionNewParams{
		Model: "gpt-4.1",
		Messages: []openai.ChatCompletionMessageParamUnion{
			openai.SystemMessage("You are a careful assistant."),
			openai.UserMessage("What is the weather in Paris?"),
			{OfAssistant: &openai.ChatCompletionAssistantMessageParam{
				ToolCalls: []openai.ChatCompletionMessageToolCallUnionParam{{OfFunction: &openai.ChatCompletionMessageFunctionToolCallParam{
					ID:       "call_01",
					Function: openai.ChatCompletionMessageFunctionToolCallFunctionParam{Name: "get_weather", Arguments: `{"city":"Paris"}`},
				}}},
			}},
			openai.ToolMessage("sunny, 21°C", "call_01"),
		},
		Tools: []openai.ChatCompletionToolUnionParam{openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
			Name:        "get_weather",
			Description: openai.String("Current weather for a city"),
			Parameters:  weatherSchema,
		})},
		MaxCompletionTokens: openai.Int(1024),
		Temperature:         openai.Float(0.2),
	}
	oc.Chat.Completions.New(ctx, cp)
	out[APIOpenAIChat] = append(out[APIOpenAIChat], rec.last(t))
	cp.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	cs := oc.Chat.Completions.NewStreaming(ctx, cp)
	for cs.Next() {
	}
	cs.Close()
	out[APIOpenAIChat] = append(out[APIOpenAIChat], rec.last(t))

	// openai-go responses: instructions, input items (message, function
	// call, function call output), a function tool; plain and streaming.
	rp := responses.ResponseNewParams{
		Model:        "gpt-4.1",
		Instructions: openai.String("You are a careful assistant."),
		Input: responses.ResponseNewParamsInputUnion{OfInputItemList: responses.ResponseInputParam{
			{OfMessage: &responses.EasyInputMessageParam{
				Role:    responses.EasyInputMessageRoleUser,
				Content: responses.EasyInputMessageContentUnionParam{OfString: openai.String("What is the weather in Paris?")},
			}},
			responses.ResponseInputItemParamOfFunctionCall(`{"city":"Paris"}`, "call_01", "get_weather"),
			{OfFunctionCallOutput: &responses.ResponseInputItemFunctionCallOutputParam{
				CallID: openai.String("call_01"),
				Output: responses.ResponseInputItemFunctionCallOutputOutputUnionParam{OfString: openai.String("sunny, 21°C")},
			}},
		}},
		Tools:           []responses.ToolUnionParam{responses.ToolParamOfFunction("get_weather", weatherSchema, true)},
		MaxOutputTokens: openai.Int(1024),
	}
	oc.Responses.New(ctx, rp)
	out[APIOpenAIResponses] = append(out[APIOpenAIResponses], rec.last(t))
	rs := oc.Responses.NewStreaming(ctx, rp)
	for rs.Next() {
	}
	rs.Close()
	out[APIOpenAIResponses] = append(out[APIOpenAIResponses], rec.last(t))
	return out
}

var sdkLimits = Limits{Models: []string{"claude-sonnet-4-5", "gpt-4.1"}, MaxOutputTokens: 4096}

func TestSDKRequestsAdmitted(t *testing.T) {
	for api, reqs := range sdkBodies(t) {
		for i, c := range reqs {
			req, ref := Admit(api, c.path, c.body, sdkLimits)
			if ref != nil {
				t.Errorf("%s #%d %s: refused %s: %s\nbody: %s", api, i, c.path, ref.Code, ref.Message, c.body)
				continue
			}
			again, ref := Admit(api, c.path, req.Canonical, sdkLimits)
			if ref != nil || string(again.Canonical) != string(req.Canonical) {
				t.Errorf("%s #%d: canonical form not stable: %v", api, i, ref)
			}
			t.Logf("%s %s stream=%v max=%d: %s", api, c.path, req.Stream, req.MaxTokens, req.Canonical)
		}
	}
}
