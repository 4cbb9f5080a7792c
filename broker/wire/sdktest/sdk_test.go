package sdktest

import (
	"context"
	"io"
	"net/http"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	anthoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	oaioption "github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
	"github.com/openai/openai-go/v3/shared"

	"github.com/moat-sandbox/moat/broker/wire"
	"github.com/moat-sandbox/moat/internal/fakeprovider"
	"github.com/moat-sandbox/moat/internal/strictjson"
)

// captured is one request an official SDK sent.
type captured struct {
	path string
	body []byte
}

// recorder is internal/fakeprovider answering every request with an
// empty success (the SDKs then do not retry): only the bodies matter.
type recorder struct {
	srv  *fakeprovider.Server
	seen int // requests already returned by last
}

func newRecorder(t *testing.T) *recorder {
	t.Helper()
	srv, err := fakeprovider.Start(fakeprovider.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	srv.SetRespond(func(w http.ResponseWriter, req *http.Request, _ []byte) {
		if req.Header.Get("Accept") == "text/event-stream" {
			w.Header().Set("Content-Type", "text/event-stream")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{}`)
	})
	return &recorder{srv: srv}
}

// last returns the only request recorded since the previous call.
func (r *recorder) last(t *testing.T) captured {
	t.Helper()
	reqs := r.srv.Requests()[r.seen:]
	if len(reqs) != 1 {
		t.Fatalf("recorded %d requests, want 1", len(reqs))
	}
	r.seen++
	return captured{reqs[0].Path, reqs[0].Body}
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
	out[wire.APIAnthropicMessages] = append(out[wire.APIAnthropicMessages], rec.last(t))
	st := ac.Messages.NewStreaming(ctx, ap)
	for st.Next() {
	}
	st.Close()
	out[wire.APIAnthropicMessages] = append(out[wire.APIAnthropicMessages], rec.last(t))
	ac.Messages.CountTokens(ctx, anthropic.MessageCountTokensParams{
		Model:    "claude-sonnet-4-5",
		Messages: ap.Messages,
		Tools: []anthropic.MessageCountTokensToolUnionParam{{OfTool: &anthropic.ToolParam{
			Name:        "get_weather",
			InputSchema: anthropic.ToolInputSchemaParam{Properties: weatherSchema["properties"]},
		}}},
	})
	out[wire.APIAnthropicMessages] = append(out[wire.APIAnthropicMessages], rec.last(t))

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
	out[wire.APIOpenAIChat] = append(out[wire.APIOpenAIChat], rec.last(t))
	cp.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	cs := oc.Chat.Completions.NewStreaming(ctx, cp)
	for cs.Next() {
	}
	cs.Close()
	out[wire.APIOpenAIChat] = append(out[wire.APIOpenAIChat], rec.last(t))

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
	out[wire.APIOpenAIResponses] = append(out[wire.APIOpenAIResponses], rec.last(t))
	rs := oc.Responses.NewStreaming(ctx, rp)
	for rs.Next() {
	}
	rs.Close()
	out[wire.APIOpenAIResponses] = append(out[wire.APIOpenAIResponses], rec.last(t))
	return out
}

var sdkLimits = wire.Limits{Models: []string{"claude-sonnet-4-5", "gpt-4.1"}, MaxOutputTokens: 4096}

func TestSDKRequestsAdmitted(t *testing.T) {
	for api, reqs := range sdkBodies(t) {
		for i, c := range reqs {
			req, ref := wire.Admit(api, c.path, c.body, sdkLimits)
			if ref != nil {
				t.Errorf("%s #%d %s: refused %s: %s\nbody: %s", api, i, c.path, ref.Code, ref.Message, c.body)
				continue
			}
			again, ref := wire.Admit(api, c.path, req.Canonical, sdkLimits)
			if ref != nil || string(again.Canonical) != string(req.Canonical) {
				t.Errorf("%s #%d: canonical form not stable: %v", api, i, ref)
			}
			t.Logf("%s %s stream=%v max=%d: %s", api, c.path, req.Stream, req.MaxTokens, req.Canonical)
		}
	}
}

// TestSDKMutationsRefused takes the SDKs' own bodies and applies one
// forbidden change at a time: each is refused with its code, while the
// unmutated body (TestSDKRequestsAdmitted) is admitted.
func TestSDKMutationsRefused(t *testing.T) {
	bodies := sdkBodies(t)
	type obj = map[string]any
	msgs := func(m obj, key string) []any { return m[key].([]any) }
	tests := []struct {
		name   string
		api    string
		code   wire.Reason
		mutate func(m obj)
	}{
		{"unknown field", wire.APIAnthropicMessages, "unknown_field", func(m obj) { m["beta_flag"] = true }},
		{"unknown nested field", wire.APIAnthropicMessages, "unknown_field", func(m obj) {
			msgs(m, "tools")[0].(obj)["input_examples"] = []any{}
		}},
		{"model", wire.APIAnthropicMessages, "model_not_allowed", func(m obj) { m["model"] = "claude-opus-4-1" }},
		{"max_tokens", wire.APIAnthropicMessages, "max_tokens_exceeded", func(m obj) { m["max_tokens"] = 64000 }},
		{"URL image in tool_result", wire.APIAnthropicMessages, "url_source", func(m obj) {
			tr := msgs(m, "messages")[2].(obj)["content"].([]any)[0].(obj)
			tr["content"] = append(tr["content"].([]any), obj{"type": "image", "source": obj{"type": "url", "url": "https://example.com/x.png"}})
		}},
		{"URL document", wire.APIAnthropicMessages, "url_source", func(m obj) {
			u := msgs(m, "messages")[0].(obj)
			u["content"] = append(u["content"].([]any), obj{"type": "document", "source": obj{"type": "url", "url": "https://example.com/x.pdf"}})
		}},
		{"server tool", wire.APIAnthropicMessages, "server_tool", func(m obj) {
			m["tools"] = append(msgs(m, "tools"), obj{"type": "web_search_20250305", "name": "web_search", "max_uses": 5})
		}},
		{"mcp servers", wire.APIAnthropicMessages, "mcp_server", func(m obj) {
			m["mcp_servers"] = []any{obj{"type": "url", "url": "https://mcp.example.com/sse", "name": "x"}}
		}},
		{"context management", wire.APIAnthropicMessages, "context_management", func(m obj) { m["context_management"] = obj{"edits": []any{}} }},
		{"container", wire.APIAnthropicMessages, "server_state", func(m obj) { m["container"] = "container_1" }},

		{"unknown field", wire.APIOpenAIChat, "unknown_field", func(m obj) { m["extra_body"] = obj{} }},
		{"model", wire.APIOpenAIChat, "model_not_allowed", func(m obj) { m["model"] = "o3" }},
		{"max_completion_tokens", wire.APIOpenAIChat, "max_tokens_exceeded", func(m obj) { m["max_completion_tokens"] = 100000 }},
		{"image URL", wire.APIOpenAIChat, "url_source", func(m obj) {
			msgs(m, "messages")[1].(obj)["content"] = []any{obj{"type": "image_url", "image_url": obj{"url": "https://example.com/x.png"}}}
		}},
		{"file id", wire.APIOpenAIChat, "file_reference", func(m obj) {
			msgs(m, "messages")[1].(obj)["content"] = []any{obj{"type": "file", "file": obj{"file_id": "file-abc"}}}
		}},
		{"web search", wire.APIOpenAIChat, "server_tool", func(m obj) { m["web_search_options"] = obj{"search_context_size": "low"} }},
		{"store", wire.APIOpenAIChat, "server_state", func(m obj) { m["store"] = true }},

		{"unknown field", wire.APIOpenAIResponses, "unknown_field", func(m obj) { msgs(m, "input")[1].(obj)["secret"] = "x" }},
		{"model", wire.APIOpenAIResponses, "model_not_allowed", func(m obj) { m["model"] = "gpt-5-pro" }},
		{"max_output_tokens", wire.APIOpenAIResponses, "max_tokens_exceeded", func(m obj) { m["max_output_tokens"] = 5000 }},
		{"input_image URL in tool output", wire.APIOpenAIResponses, "url_source", func(m obj) {
			msgs(m, "input")[2].(obj)["output"] = []any{obj{"type": "input_image", "image_url": "https://example.com/x.png"}}
		}},
		{"input_file URL", wire.APIOpenAIResponses, "url_source", func(m obj) {
			msgs(m, "input")[0].(obj)["content"] = []any{obj{"type": "input_file", "file_url": "https://example.com/x.pdf"}}
		}},
		{"input_file id", wire.APIOpenAIResponses, "file_reference", func(m obj) {
			msgs(m, "input")[0].(obj)["content"] = []any{obj{"type": "input_file", "file_id": "file-abc"}}
		}},
		{"web search tool", wire.APIOpenAIResponses, "server_tool", func(m obj) { m["tools"] = append(msgs(m, "tools"), obj{"type": "web_search"}) }},
		{"code interpreter", wire.APIOpenAIResponses, "server_tool", func(m obj) {
			m["tools"] = append(msgs(m, "tools"), obj{"type": "code_interpreter", "container": obj{"type": "auto"}})
		}},
		{"mcp", wire.APIOpenAIResponses, "mcp_server", func(m obj) {
			m["tools"] = append(msgs(m, "tools"), obj{"type": "mcp", "server_label": "x", "server_url": "https://mcp.example.com"})
		}},
		{"previous_response_id", wire.APIOpenAIResponses, "server_state", func(m obj) { m["previous_response_id"] = "resp_1" }},
		{"conversation", wire.APIOpenAIResponses, "server_state", func(m obj) { m["conversation"] = obj{"id": "conv_1"} }},
		{"store", wire.APIOpenAIResponses, "server_state", func(m obj) { m["store"] = true }},
		{"background", wire.APIOpenAIResponses, "server_state", func(m obj) { m["background"] = true }},
		{"prompt", wire.APIOpenAIResponses, "server_state", func(m obj) { m["prompt"] = obj{"id": "pmpt_1"} }},
		{"item reference", wire.APIOpenAIResponses, "server_state", func(m obj) {
			m["input"] = append(msgs(m, "input"), obj{"type": "item_reference", "id": "msg_1"})
		}},
		{"truncation auto", wire.APIOpenAIResponses, "context_management", func(m obj) { m["truncation"] = "auto" }},
		{"compaction item", wire.APIOpenAIResponses, "server_compaction", func(m obj) {
			m["input"] = append(msgs(m, "input"), obj{"type": "compaction", "encrypted_content": "x"})
		}},
	}
	for _, tt := range tests {
		t.Run(tt.api+"/"+tt.name, func(t *testing.T) {
			c := bodies[tt.api][0]
			v, err := strictjson.Decode(c.body)
			if err != nil {
				t.Fatal(err)
			}
			tt.mutate(v.(obj))
			body, err := strictjson.Encode(v)
			if err != nil {
				t.Fatal(err)
			}
			req, ref := wire.Admit(tt.api, c.path, body, sdkLimits)
			if ref == nil {
				t.Fatalf("admitted %s, want %s", req.Canonical, tt.code)
			}
			if ref.Code != tt.code {
				t.Fatalf("got %s (%s), want %s", ref.Code, ref.Message, tt.code)
			}
		})
	}
}
