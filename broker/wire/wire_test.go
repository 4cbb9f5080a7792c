package wire

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

var testLimits = Limits{Models: []string{"claude-sonnet-4-5", "gpt-4.1"}, MaxOutputTokens: 4096}

// Raw bodies are built from these envelopes so that each table row shows
// only the part under test.

// anthUser wraps content blocks in a one-message anthropic request.
func anthUser(blocks string) string {
	return `{"model":"claude-sonnet-4-5","max_tokens":100,"messages":[{"role":"user","content":[` + blocks + `]}]}`
}

// anthTop adds top-level members to a minimal anthropic request.
func anthTop(members string) string {
	return `{"model":"claude-sonnet-4-5","max_tokens":100,"messages":[{"role":"user","content":"hi"}]` + members + `}`
}

func chatUser(parts string) string {
	return `{"model":"gpt-4.1","messages":[{"role":"user","content":[` + parts + `]}]}`
}

func chatTop(members string) string {
	return `{"model":"gpt-4.1","messages":[{"role":"user","content":"hi"}]` + members + `}`
}

func respInput(items string) string {
	return `{"model":"gpt-4.1","input":[` + items + `]}`
}

func respTop(members string) string {
	return `{"model":"gpt-4.1","input":"hi"` + members + `}`
}

type ruleCase struct {
	name     string
	api      string
	bad      string // refused with code, naming path
	code     Reason
	path     string // a substring the message must contain (the JSON path)
	good     string // the closest variant that is admitted
	endpoint string // default: the API's main endpoint
}

var (
	imgB64 = `{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}}`
	imgURL = `{"type":"image","source":{"type":"url","url":"https://example.com/a.png"}}`
	pdfB64 = `{"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"JVBERi0="}}`
)

var ruleCases = []ruleCase{
	// anthropic-messages
	{"unknown top-level field", APIAnthropicMessages, anthTop(`,"foo":1`), "unknown_field", `foo`, anthTop(`,"temperature":1`), ""},
	{"unknown nested field", APIAnthropicMessages, anthUser(`{"type":"text","text":"a","foo":1}`), "unknown_field", `messages[0].content[0].foo`, anthUser(`{"type":"text","text":"a"}`), ""},
	{"unknown field in source", APIAnthropicMessages, anthUser(`{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AA==","url":"https://example.com/x"}}`), "unknown_field", `messages[0].content[0].source.url`, anthUser(imgB64), ""},
	{"unknown block type", APIAnthropicMessages, anthUser(`{"type":"video","data":"x"}`), "unknown_type", `messages[0].content[0].type`, anthUser(`{"type":"text","text":"x"}`), ""},
	{"wrong JSON type", APIAnthropicMessages, anthTop(`,"temperature":"hot"`), "invalid_value", `temperature`, anthTop(`,"temperature":0.5`), ""},
	{"bad role", APIAnthropicMessages, `{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"role":"system","content":"x"}]}`, "invalid_value", `messages[0].role`, `{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"role":"user","content":"x"}]}`, ""},
	{"missing messages", APIAnthropicMessages, `{"model":"claude-sonnet-4-5","max_tokens":10}`, "missing_field", `messages`, `{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[]}`, ""},
	{"model not allowed", APIAnthropicMessages, `{"model":"claude-opus-4","max_tokens":10,"messages":[]}`, "model_not_allowed", `claude-opus-4`, `{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[]}`, ""},
	{"max_tokens above policy", APIAnthropicMessages, `{"model":"claude-sonnet-4-5","max_tokens":4097,"messages":[]}`, "max_tokens_exceeded", `max_tokens`, `{"model":"claude-sonnet-4-5","max_tokens":4096,"messages":[]}`, ""},
	{"max_tokens as exponent", APIAnthropicMessages, `{"model":"claude-sonnet-4-5","max_tokens":1e5,"messages":[]}`, "max_tokens_exceeded", `max_tokens`, `{"model":"claude-sonnet-4-5","max_tokens":4e3,"messages":[]}`, ""},
	{"max_tokens fractional", APIAnthropicMessages, `{"model":"claude-sonnet-4-5","max_tokens":10.5,"messages":[]}`, "invalid_value", `max_tokens`, `{"model":"claude-sonnet-4-5","max_tokens":10.0,"messages":[]}`, ""},
	{"max_tokens zero", APIAnthropicMessages, `{"model":"claude-sonnet-4-5","max_tokens":0,"messages":[]}`, "invalid_value", `max_tokens`, `{"model":"claude-sonnet-4-5","max_tokens":1,"messages":[]}`, ""},
	{"image from URL", APIAnthropicMessages, anthUser(imgURL), "url_source", `messages[0].content[0].source`, anthUser(imgB64), ""},
	{"image from file", APIAnthropicMessages, anthUser(`{"type":"image","source":{"type":"file","file_id":"file_01"}}`), "file_reference", `messages[0].content[0].source`, anthUser(imgB64), ""},
	{"document from URL", APIAnthropicMessages, anthUser(`{"type":"document","source":{"type":"url","url":"https://example.com/a.pdf"}}`), "url_source", `messages[0].content[0].source`, anthUser(pdfB64), ""},
	{"document from file", APIAnthropicMessages, anthUser(`{"type":"document","source":{"type":"file","file_id":"file_01"}}`), "file_reference", `messages[0].content[0].source`, anthUser(pdfB64), ""},
	{"URL image inside tool_result", APIAnthropicMessages, anthUser(`{"type":"tool_result","tool_use_id":"t1","content":[` + imgURL + `]}`), "url_source", `messages[0].content[0].content[0].source`, anthUser(`{"type":"tool_result","tool_use_id":"t1","content":[` + imgB64 + `]}`), ""},
	{"URL image inside document content", APIAnthropicMessages, anthUser(`{"type":"document","source":{"type":"content","content":[` + imgURL + `]}}`), "url_source", `messages[0].content[0].source.content[0].source`, anthUser(`{"type":"document","source":{"type":"content","content":[` + imgB64 + `]}}`), ""},
	{"web search tool", APIAnthropicMessages, anthTop(`,"tools":[{"type":"web_search_20250305","name":"web_search"}]`), "server_tool", `tools[0].type`, anthTop(`,"tools":[{"type":"custom","name":"web_search","input_schema":{"type":"object"}}]`), ""},
	{"code execution tool", APIAnthropicMessages, anthTop(`,"tools":[{"type":"code_execution_20250825","name":"code_execution"}]`), "server_tool", `tools[0].type`, anthTop(`,"tools":[{"name":"run","input_schema":{"type":"object"}}]`), ""},
	{"computer tool", APIAnthropicMessages, anthTop(`,"tools":[{"type":"computer_20250124","name":"computer","display_width_px":1024,"display_height_px":768}]`), "server_tool", `tools[0].type`, anthTop(`,"tools":[{"name":"computer","input_schema":{"type":"object"}}]`), ""},
	{"bash tool", APIAnthropicMessages, anthTop(`,"tools":[{"type":"bash_20250124","name":"bash"}]`), "server_tool", `tools[0].type`, anthTop(`,"tools":[{"name":"bash","input_schema":{"type":"object"}}]`), ""},
	{"text editor tool", APIAnthropicMessages, anthTop(`,"tools":[{"type":"text_editor_20250728","name":"str_replace_based_edit_tool"}]`), "server_tool", `tools[0].type`, anthTop(`,"tools":[{"name":"edit","input_schema":{"type":"object"}}]`), ""},
	{"web fetch tool", APIAnthropicMessages, anthTop(`,"tools":[{"type":"web_fetch_20250910","name":"web_fetch"}]`), "server_tool", `tools[0].type`, anthTop(`,"tools":[{"name":"fetch","input_schema":{"type":"object"}}]`), ""},
	{"server_tool_use block", APIAnthropicMessages, `{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"role":"assistant","content":[{"type":"server_tool_use","id":"srvtoolu_1","name":"web_search","input":{}}]}]}`, "server_tool", `messages[0].content[0].type`, `{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"toolu_1","name":"web_search","input":{}}]}]}`, ""},
	{"web search result block", APIAnthropicMessages, anthUser(`{"type":"web_search_tool_result","tool_use_id":"srvtoolu_1","content":[]}`), "server_tool", `messages[0].content[0].type`, anthUser(`{"type":"tool_result","tool_use_id":"toolu_1","content":[]}`), ""},
	{"tool_use called by code execution", APIAnthropicMessages, `{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"n","input":{},"caller":{"type":"code_execution_20250825","tool_id":"x"}}]}]}`, "server_tool", `messages[0].content[0].caller.type`, `{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"n","input":{},"caller":{"type":"direct"}}]}]}`, ""},
	{"web search citation", APIAnthropicMessages, anthUser(`{"type":"text","text":"x","citations":[{"type":"web_search_result_location","url":"https://example.com","title":"t","encrypted_index":"e","cited_text":"c"}]}`), "server_tool", `messages[0].content[0].citations[0].type`, anthUser(`{"type":"text","text":"x","citations":[{"type":"char_location","cited_text":"c","document_index":0,"document_title":"d","start_char_index":0,"end_char_index":1}]}`), ""},
	{"MCP servers", APIAnthropicMessages, anthTop(`,"mcp_servers":[{"type":"url","url":"https://mcp.example.com","name":"x"}]`), "mcp_server", `mcp_servers`, anthTop(``), ""},
	{"MCP servers null", APIAnthropicMessages, anthTop(`,"mcp_servers":null`), "mcp_server", `mcp_servers`, anthTop(``), ""},
	{"container null", APIAnthropicMessages, anthTop(`,"container":null`), "server_state", `container`, anthTop(`,"metadata":null`), ""},
	{"context management null", APIAnthropicMessages, anthTop(`,"context_management":null`), "context_management", `context_management`, anthTop(`,"service_tier":null`), ""},
	{"MCP toolset", APIAnthropicMessages, anthTop(`,"tools":[{"type":"mcp_toolset","mcp_server_name":"x"}]`), "mcp_server", `tools[0].type`, anthTop(`,"tools":[]`), ""},
	{"context management", APIAnthropicMessages, anthTop(`,"context_management":{"edits":[{"type":"clear_tool_uses_20250919"}]}`), "context_management", `context_management`, anthTop(``), ""},
	{"compaction block", APIAnthropicMessages, `{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"role":"assistant","content":[{"type":"compaction","content":"summary"}]}]}`, "server_compaction", `messages[0].content[0].type`, `{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"role":"assistant","content":[{"type":"text","text":"summary"}]}]}`, ""},
	{"container", APIAnthropicMessages, anthTop(`,"container":"container_01"`), "server_state", `container`, anthTop(``), ""},
	{"container upload block", APIAnthropicMessages, anthUser(`{"type":"container_upload","file_id":"file_01"}`), "server_state", `messages[0].content[0].type`, anthUser(`{"type":"text","text":"x"}`), ""},
	{"count_tokens has no max_tokens", APIAnthropicMessages, `{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[]}`, "unknown_field", `max_tokens`, `{"model":"claude-sonnet-4-5","messages":[]}`, "/v1/messages/count_tokens"},
	{"count_tokens with server tool", APIAnthropicMessages, `{"model":"claude-sonnet-4-5","messages":[],"tools":[{"type":"web_search_20250305","name":"web_search"}]}`, "server_tool", `tools[0].type`, `{"model":"claude-sonnet-4-5","messages":[]}`, "/v1/messages/count_tokens"},
	{"batches endpoint", APIAnthropicMessages, `{"requests":[]}`, "wrong_endpoint", `/v1/messages/batches`, `{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[]}`, "/v1/messages/batches"},
	{"duplicate key via escape", APIAnthropicMessages, `{"model":"claude-sonnet-4-5","m\u006fdel":"evil","max_tokens":10,"messages":[]}`, "invalid_json", `duplicate`, `{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[]}`, ""},
	{"trailing data", APIAnthropicMessages, `{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[]}{"model":"x"}`, "invalid_json", `after top-level value`, `{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[]}` + "\n", ""},
	{"invalid UTF-8", APIAnthropicMessages, anthUser("{\"type\":\"text\",\"text\":\"\xff\"}"), "invalid_json", `UTF-8`, anthUser(`{"type":"text","text":"\u00ff"}`), ""},
	{"lone surrogate", APIAnthropicMessages, anthUser(`{"type":"text","text":"\udead"}`), "invalid_json", `surrogate`, anthUser(`{"type":"text","text":"\ud83d\ude00"}`), ""},
	{"deep nesting in tool input", APIAnthropicMessages, `{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"n","input":{"x":` + strings.Repeat("[", 200) + strings.Repeat("]", 200) + `}}]}]}`, "invalid_json", `nesting too deep`, `{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"n","input":{"x":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}}]}]}`, ""},
	{"number out of range", APIAnthropicMessages, anthTop(`,"temperature":1e400`), "invalid_json", `out of range`, anthTop(`,"temperature":1e0`), ""},
	{"odd member name quoted in path", APIAnthropicMessages, anthTop(`,"max tokens":1`), "unknown_field", `["max tokens"]`, `{"model":"claude-sonnet-4-5","max_tokens":1,"messages":[]}`, ""},
	{"not an object", APIAnthropicMessages, `[{"model":"claude-sonnet-4-5"}]`, "invalid_json", `object`, `{"model":"claude-sonnet-4-5","messages":[]}`, ""},

	// openai-chat
	{"chat unknown nested field", APIOpenAIChat, chatTop(`,"tools":[{"type":"function","function":{"name":"f","parameters":{},"foo":1}}]`), "unknown_field", `tools[0].function.foo`, chatTop(`,"tools":[{"type":"function","function":{"name":"f","parameters":{}}}]`), ""},
	{"chat image from URL", APIOpenAIChat, chatUser(`{"type":"image_url","image_url":{"url":"https://example.com/a.png"}}`), "url_source", `messages[0].content[0].image_url.url`, chatUser(`{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo="}}`), ""},
	{"chat image from http URL, upper case", APIOpenAIChat, chatUser(`{"type":"image_url","image_url":{"url":"HTTP://example.com/a.png"}}`), "url_source", `messages[0].content[0].image_url.url`, chatUser(`{"type":"image_url","image_url":{"url":"DATA:image/png;base64,iVBORw0KGgo="}}`), ""},
	{"chat file by id", APIOpenAIChat, chatUser(`{"type":"file","file":{"file_id":"file-01"}}`), "file_reference", `messages[0].content[0].file.file_id`, chatUser(`{"type":"file","file":{"file_data":"data:application/pdf;base64,JVBERi0=","filename":"a.pdf"}}`), ""},
	{"chat web search", APIOpenAIChat, chatTop(`,"web_search_options":{}`), "server_tool", `web_search_options`, chatTop(``), ""},
	{"chat hosted tool type", APIOpenAIChat, chatTop(`,"tools":[{"type":"web_search"}]`), "server_tool", `tools[0].type`, chatTop(`,"tools":[{"type":"custom","custom":{"name":"search"}}]`), ""},
	{"chat store", APIOpenAIChat, chatTop(`,"store":true`), "server_state", `store`, chatTop(`,"store":false`), ""},
	{"chat assistant audio reference", APIOpenAIChat, `{"model":"gpt-4.1","messages":[{"role":"assistant","audio":{"id":"audio_01"}}]}`, "server_state", `messages[0].audio`, `{"model":"gpt-4.1","messages":[{"role":"assistant","content":"x"}]}`, ""},
	{"chat max_completion_tokens above policy", APIOpenAIChat, chatTop(`,"max_completion_tokens":5000`), "max_tokens_exceeded", `max_completion_tokens`, chatTop(`,"max_completion_tokens":4000`), ""},
	{"chat max_tokens above policy", APIOpenAIChat, chatTop(`,"max_tokens":5000`), "max_tokens_exceeded", `max_tokens`, chatTop(`,"max_tokens":4000`), ""},
	{"chat both token limits", APIOpenAIChat, chatTop(`,"max_tokens":10,"max_completion_tokens":10`), "invalid_value", `ambiguous`, chatTop(`,"max_tokens":null,"max_completion_tokens":10`), ""},
	{"chat n", APIOpenAIChat, chatTop(`,"n":2`), "invalid_value", `n`, chatTop(`,"n":1`), ""},
	{"chat model", APIOpenAIChat, `{"model":"gpt-5","messages":[]}`, "model_not_allowed", `gpt-5`, `{"model":"gpt-4.1","messages":[]}`, ""},
	{"chat responses endpoint", APIOpenAIChat, chatTop(``), "wrong_endpoint", `/v1/responses`, chatTop(``), "/v1/responses"},
	{"chat unknown role", APIOpenAIChat, `{"model":"gpt-4.1","messages":[{"role":"root","content":"x"}]}`, "unknown_type", `messages[0].role`, `{"model":"gpt-4.1","messages":[{"role":"developer","content":"x"}]}`, ""},

	// openai-responses
	{"responses previous_response_id", APIOpenAIResponses, respTop(`,"previous_response_id":"resp_01"`), "server_state", `previous_response_id`, respTop(``), ""},
	{"responses previous_response_id null", APIOpenAIResponses, respTop(`,"previous_response_id":null`), "server_state", `previous_response_id`, respTop(`,"instructions":null`), ""},
	{"responses conversation null", APIOpenAIResponses, respTop(`,"conversation":null`), "server_state", `conversation`, respTop(``), ""},
	{"chat web search null", APIOpenAIChat, chatTop(`,"web_search_options":null`), "server_tool", `web_search_options`, chatTop(`,"temperature":null`), ""},
	{"chat file id null", APIOpenAIChat, chatUser(`{"type":"file","file":{"file_data":"data:text/plain;base64,eA==","file_id":null}}`), "file_reference", `messages[0].content[0].file.file_id`, chatUser(`{"type":"file","file":{"file_data":"data:text/plain;base64,eA==","filename":null}}`), ""},
	{"responses conversation", APIOpenAIResponses, respTop(`,"conversation":"conv_01"`), "server_state", `conversation`, respTop(``), ""},
	{"responses store", APIOpenAIResponses, respTop(`,"store":true`), "server_state", `store`, respTop(`,"store":false`), ""},
	{"responses background", APIOpenAIResponses, respTop(`,"background":true`), "server_state", `background`, respTop(`,"background":false`), ""},
	{"responses stored prompt", APIOpenAIResponses, respTop(`,"prompt":{"id":"pmpt_01"}`), "server_state", `prompt`, respTop(`,"instructions":"x"`), ""},
	{"responses item reference", APIOpenAIResponses, respInput(`{"type":"item_reference","id":"msg_01"}`), "server_state", `input[0].type`, respInput(`{"type":"message","role":"user","content":"x"}`), ""},
	{"responses truncation auto", APIOpenAIResponses, respTop(`,"truncation":"auto"`), "context_management", `truncation`, respTop(`,"truncation":"disabled"`), ""},
	{"responses context management", APIOpenAIResponses, respTop(`,"context_management":[{"type":"compaction","compact_threshold":1000}]`), "context_management", `context_management`, respTop(``), ""},
	{"responses compaction item", APIOpenAIResponses, respInput(`{"type":"compaction","encrypted_content":"x"}`), "server_compaction", `input[0].type`, respInput(`{"role":"user","content":"x"}`), ""},
	{"responses web search", APIOpenAIResponses, respTop(`,"tools":[{"type":"web_search"}]`), "server_tool", `tools[0].type`, respTop(`,"tools":[{"type":"function","name":"web_search","parameters":{}}]`), ""},
	{"responses web search preview", APIOpenAIResponses, respTop(`,"tools":[{"type":"web_search_preview"}]`), "server_tool", `tools[0].type`, respTop(`,"tools":[]`), ""},
	{"responses file search", APIOpenAIResponses, respTop(`,"tools":[{"type":"file_search","vector_store_ids":["vs_1"]}]`), "server_tool", `tools[0].type`, respTop(`,"tools":[]`), ""},
	{"responses code interpreter", APIOpenAIResponses, respTop(`,"tools":[{"type":"code_interpreter","container":{"type":"auto"}}]`), "server_tool", `tools[0].type`, respTop(`,"tools":[]`), ""},
	{"responses computer use", APIOpenAIResponses, respTop(`,"tools":[{"type":"computer_use_preview","display_width":1024,"display_height":768,"environment":"linux"}]`), "server_tool", `tools[0].type`, respTop(`,"tools":[]`), ""},
	{"responses image generation", APIOpenAIResponses, respTop(`,"tools":[{"type":"image_generation"}]`), "server_tool", `tools[0].type`, respTop(`,"tools":[]`), ""},
	{"responses local shell", APIOpenAIResponses, respTop(`,"tools":[{"type":"local_shell"}]`), "server_tool", `tools[0].type`, respTop(`,"tools":[{"type":"custom","name":"shell","format":{"type":"text"}}]`), ""},
	{"responses mcp tool", APIOpenAIResponses, respTop(`,"tools":[{"type":"mcp","server_label":"x","server_url":"https://mcp.example.com"}]`), "mcp_server", `tools[0].type`, respTop(`,"tools":[]`), ""},
	{"responses hosted tool choice", APIOpenAIResponses, respTop(`,"tool_choice":{"type":"file_search"}`), "server_tool", `tool_choice.type`, respTop(`,"tool_choice":"auto"`), ""},
	{"responses web search call item", APIOpenAIResponses, respInput(`{"type":"web_search_call","id":"ws_1","status":"completed","action":{}}`), "server_tool", `input[0].type`, respInput(`{"type":"function_call","call_id":"c","name":"search","arguments":"{}"}`), ""},
	{"responses mcp call item", APIOpenAIResponses, respInput(`{"type":"mcp_call","id":"mcp_1","server_label":"x","name":"n","arguments":"{}"}`), "mcp_server", `input[0].type`, respInput(`{"type":"function_call","call_id":"c","name":"n","arguments":"{}"}`), ""},
	{"responses image from URL", APIOpenAIResponses, respInput(`{"role":"user","content":[{"type":"input_image","image_url":"https://example.com/a.png","detail":"auto"}]}`), "url_source", `input[0].content[0].image_url`, respInput(`{"role":"user","content":[{"type":"input_image","image_url":"data:image/png;base64,iVBORw0KGgo=","detail":"auto"}]}`), ""},
	{"responses image by file id", APIOpenAIResponses, respInput(`{"role":"user","content":[{"type":"input_image","file_id":"file-1","detail":"auto"}]}`), "file_reference", `input[0].content[0].file_id`, respInput(`{"role":"user","content":[{"type":"input_image","image_url":"data:image/png;base64,AA==","detail":"auto"}]}`), ""},
	{"responses file from URL", APIOpenAIResponses, respInput(`{"role":"user","content":[{"type":"input_file","file_url":"https://example.com/a.pdf"}]}`), "url_source", `input[0].content[0].file_url`, respInput(`{"role":"user","content":[{"type":"input_file","file_data":"data:application/pdf;base64,JVBERi0=","filename":"a.pdf"}]}`), ""},
	{"responses file by id", APIOpenAIResponses, respInput(`{"role":"user","content":[{"type":"input_file","file_id":"file-1"}]}`), "file_reference", `input[0].content[0].file_id`, respInput(`{"role":"user","content":[{"type":"input_file","file_data":"data:text/plain;base64,eA==","filename":"a.txt"}]}`), ""},
	{"responses URL image inside tool output", APIOpenAIResponses, respInput(`{"type":"function_call_output","call_id":"c","output":[{"type":"input_image","image_url":"https://example.com/a.png"}]}`), "url_source", `input[0].output[0].image_url`, respInput(`{"type":"function_call_output","call_id":"c","output":[{"type":"input_image","image_url":"data:image/png;base64,AA=="}]}`), ""},
	{"responses url citation", APIOpenAIResponses, respInput(`{"type":"message","role":"assistant","content":[{"type":"output_text","text":"x","annotations":[{"type":"url_citation","url":"https://example.com","start_index":0,"end_index":1,"title":"t"}]}]}`), "server_tool", `input[0].content[0].annotations[0].type`, respInput(`{"type":"message","role":"assistant","content":[{"type":"output_text","text":"x","annotations":[]}]}`), ""},
	{"responses max_output_tokens", APIOpenAIResponses, respTop(`,"max_output_tokens":4097`), "max_tokens_exceeded", `max_output_tokens`, respTop(`,"max_output_tokens":4096`), ""},
	{"responses include of server tool output", APIOpenAIResponses, respTop(`,"include":["file_search_call.results"]`), "invalid_value", `include[0]`, respTop(`,"include":["reasoning.encrypted_content"]`), ""},
	{"responses unknown nested", APIOpenAIResponses, respInput(`{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"x","extra":1}]}`), "unknown_field", `input[0].summary[0].extra`, respInput(`{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"x"}],"encrypted_content":"gAAA"}`), ""},
}

func TestRules(t *testing.T) {
	for _, tc := range ruleCases {
		t.Run(tc.api+"/"+tc.name, func(t *testing.T) {
			ep := tc.endpoint
			if ep == "" {
				ep = Endpoints(tc.api)[0]
			}
			req, ref := Admit(tc.api, ep, []byte(tc.bad), testLimits)
			switch {
			case ref == nil:
				t.Errorf("admitted %s\nwant refusal %s", req.Canonical, tc.code)
			case ref.Code != tc.code:
				t.Errorf("got code %s (%s), want %s", ref.Code, ref.Message, tc.code)
			case !strings.Contains(ref.Message, tc.path):
				t.Errorf("message %q does not name %q", ref.Message, tc.path)
			case strings.Contains(ref.Message, "refused:") || !strings.HasPrefix(ref.Error(), "moat: refused: ") || strings.Count(ref.Error(), "moat: ") != 1:
				t.Errorf("message %q / error %q: want the prefix \"moat: refused: \" once, in Error only", ref.Message, ref.Error())
			}
			goodEP := ep
			if tc.code == "wrong_endpoint" {
				goodEP = Endpoints(tc.api)[0]
			}
			if _, ref := Admit(tc.api, goodEP, []byte(tc.good), testLimits); ref != nil {
				t.Errorf("valid variant refused: %s: %s\nbody: %s", ref.Code, ref.Message, tc.good)
			}
		})
	}
}

func TestEndpoints(t *testing.T) {
	for api, want := range map[string]string{
		APIAnthropicMessages: "/v1/messages,/v1/messages/count_tokens",
		APIOpenAIChat:        "/v1/chat/completions",
		APIOpenAIResponses:   "/v1/responses",
		"gemini":             "",
	} {
		if got := strings.Join(Endpoints(api), ","); got != want {
			t.Errorf("Endpoints(%q) = %q, want %q", api, got, want)
		}
	}
	if _, ref := Admit("gemini", "/v1/messages", []byte(`{}`), testLimits); ref == nil || ref.Code != "wrong_endpoint" {
		t.Errorf("unknown API admitted: %v", ref)
	}
}

func TestZeroLimitsDeny(t *testing.T) {
	body := []byte(`{"model":"claude-sonnet-4-5","max_tokens":1,"messages":[]}`)
	if _, ref := Admit(APIAnthropicMessages, "/v1/messages", body, Limits{}); ref == nil || ref.Code != "model_not_allowed" {
		t.Errorf("zero Limits: got %v, want model_not_allowed", ref)
	}
	lim := Limits{Models: []string{"claude-sonnet-4-5"}}
	if _, ref := Admit(APIAnthropicMessages, "/v1/messages", body, lim); ref == nil || ref.Code != "max_tokens_exceeded" {
		t.Errorf("MaxOutputTokens 0: got %v, want max_tokens_exceeded", ref)
	}
	lim.MaxOutputTokens = 1
	if _, ref := Admit(APIAnthropicMessages, "/v1/messages", body, lim); ref != nil {
		t.Errorf("MaxOutputTokens 1, max_tokens 1: refused %v", ref)
	}
}

// TestCanonicalOutput checks the exact bytes forwarded, including the
// output limit and store written by the broker.
func TestCanonicalOutput(t *testing.T) {
	tests := []struct {
		name, api, endpoint, in, want string
		maxTokens                     int
		stream                        bool
	}{
		{"anthropic key order, numbers, escapes", APIAnthropicMessages, "/v1/messages",
			`{ "stream" : true, "temperature": 1.0E0, "model":"claude-sonnet-4-5", "max_tokens": 1.0e2,
			   "messages":[{"role":"user","content":"caf\u00e9 \ud83d\ude00 \u2028"}], "\u0073ystem":"s"}`,
			`{"max_tokens":100,"messages":[{"content":"café 😀 ` + "\u2028" + `","role":"user"}],"model":"claude-sonnet-4-5","stream":true,"system":"s","temperature":1}`,
			100, true},
		{"anthropic default max_tokens", APIAnthropicMessages, "/v1/messages",
			`{"model":"claude-sonnet-4-5","messages":[]}`,
			`{"max_tokens":4096,"messages":[],"model":"claude-sonnet-4-5"}`, 4096, false},
		{"anthropic null max_tokens", APIAnthropicMessages, "/v1/messages",
			`{"model":"claude-sonnet-4-5","max_tokens":null,"messages":[]}`,
			`{"max_tokens":4096,"messages":[],"model":"claude-sonnet-4-5"}`, 4096, false},
		{"count_tokens reserves nothing", APIAnthropicMessages, "/v1/messages/count_tokens",
			`{"model":"claude-sonnet-4-5","messages":[]}`,
			`{"messages":[],"model":"claude-sonnet-4-5"}`, 0, false},
		{"chat default max_completion_tokens", APIOpenAIChat, "/v1/chat/completions",
			`{"model":"gpt-4.1","messages":[],"stream":true}`,
			`{"max_completion_tokens":4096,"messages":[],"model":"gpt-4.1","stream":true}`, 4096, true},
		{"chat null max_tokens replaced", APIOpenAIChat, "/v1/chat/completions",
			`{"model":"gpt-4.1","messages":[],"max_tokens":null}`,
			`{"max_completion_tokens":4096,"messages":[],"model":"gpt-4.1"}`, 4096, false},
		{"chat legacy max_tokens kept", APIOpenAIChat, "/v1/chat/completions",
			`{"model":"gpt-4.1","messages":[],"max_tokens":50}`,
			`{"max_tokens":50,"messages":[],"model":"gpt-4.1"}`, 50, false},
		{"responses store false and max_output_tokens written", APIOpenAIResponses, "/v1/responses",
			`{"model":"gpt-4.1","input":"hi"}`,
			`{"input":"hi","max_output_tokens":4096,"model":"gpt-4.1","store":false}`, 4096, false},
		{"anthropic null stream removed", APIAnthropicMessages, "/v1/messages",
			`{"model":"claude-sonnet-4-5","max_tokens":5,"messages":[],"stream":null}`,
			`{"max_tokens":5,"messages":[],"model":"claude-sonnet-4-5"}`, 5, false},
		{"chat null stream removed", APIOpenAIChat, "/v1/chat/completions",
			`{"model":"gpt-4.1","messages":[],"max_tokens":5,"stream":null}`,
			`{"max_tokens":5,"messages":[],"model":"gpt-4.1"}`, 5, false},
		{"responses null stream removed", APIOpenAIResponses, "/v1/responses",
			`{"model":"gpt-4.1","input":"hi","stream":null,"store":false,"max_output_tokens":7}`,
			`{"input":"hi","max_output_tokens":7,"model":"gpt-4.1","store":false}`, 7, false},
		{"responses null store forced false", APIOpenAIResponses, "/v1/responses",
			`{"model":"gpt-4.1","input":"hi","store":null,"max_output_tokens":7}`,
			`{"input":"hi","max_output_tokens":7,"model":"gpt-4.1","store":false}`, 7, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, ref := Admit(tt.api, tt.endpoint, []byte(tt.in), testLimits)
			if ref != nil {
				t.Fatalf("refused: %s", ref.Message)
			}
			if string(req.Canonical) != tt.want {
				t.Errorf("Canonical = %s\nwant        %s", req.Canonical, tt.want)
			}
			if req.MaxTokens != tt.maxTokens || req.Stream != tt.stream {
				t.Errorf("MaxTokens, Stream = %d, %v; want %d, %v", req.MaxTokens, req.Stream, tt.maxTokens, tt.stream)
			}
			again, ref := Admit(tt.api, tt.endpoint, req.Canonical, testLimits)
			if ref != nil || string(again.Canonical) != string(req.Canonical) {
				t.Errorf("canonical form not a fixed point: %v", ref)
			}
		})
	}
}

func TestRefusalError(t *testing.T) {
	_, ref := Admit(APIAnthropicMessages, "/v1/messages", []byte(`{"model":"x","max_tokens":1,"messages":[]}`), testLimits)
	if ref == nil {
		t.Fatal("admitted")
	}
	var err error = ref
	want := `moat: refused: model: model "x" is not allowed by policy (allowed: claude-sonnet-4-5, gpt-4.1)`
	if err.Error() != want {
		t.Errorf("Error() = %q, want %q", err.Error(), want)
	}
}

// TestRefusalQuotesBounded: a refusal quotes at most MaxQuotedBytes of a
// client-supplied value, plus its length and sha256, wherever the value
// appears (model, enum value, tag, member name, a parser's error).
func TestRefusalQuotesBounded(t *testing.T) {
	long := strings.Repeat("é", 2<<20) // 4 MiB, two-byte runes: the cut must not split one
	sum := sha256.Sum256([]byte(long))
	digest := fmt.Sprintf("(%d bytes, sha256 %s)", len(long), hex.EncodeToString(sum[:]))
	tests := []struct {
		name, api, body string
		code            Reason
	}{
		{"model", APIAnthropicMessages, `{"model":"` + long + `","max_tokens":1,"messages":[]}`, "model_not_allowed"},
		{"enum value", APIAnthropicMessages, anthTop(`,"service_tier":"` + long + `"`), "invalid_value"},
		{"tag", APIAnthropicMessages, anthUser(`{"type":"` + long + `"}`), "unknown_type"},
		{"member name", APIAnthropicMessages, anthTop(`,"` + long + `":1`), "unknown_field"},
		{"duplicate member name", APIAnthropicMessages, `{"` + long + `":1,"` + long + `":2}`, "invalid_json"},
		{"path", APIOpenAIChat, `{"model":"gpt-4.1","messages":[],"` + long + `":1}`, "unknown_field"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, ref := Admit(tt.api, Endpoints(tt.api)[0], []byte(tt.body), testLimits)
			if ref == nil || ref.Code != tt.code {
				t.Fatalf("got %v, want refusal %s", ref, tt.code)
			}
			if len(ref.Message) > 2*MaxQuotedBytes+512 {
				t.Errorf("message is %d bytes, want at most %d", len(ref.Message), 2*MaxQuotedBytes+512)
			}
			if !utf8.ValidString(ref.Message) {
				t.Errorf("message is not valid UTF-8")
			}
			if tt.code != "invalid_json" && !strings.Contains(ref.Message, digest) {
				t.Errorf("message %q does not give the value's length and sha256 %s", ref.Message, digest)
			}
			if !strings.Contains(ref.Message, strings.Repeat("é", 8)) {
				t.Errorf("message %q does not quote a prefix of the value", ref.Message)
			}
		})
	}
	// Positive control: a short value is quoted whole, without a digest.
	_, ref := Admit(APIAnthropicMessages, "/v1/messages", []byte(`{"model":"short-model","max_tokens":1,"messages":[]}`), testLimits)
	if ref == nil || !strings.Contains(ref.Message, `"short-model"`) || strings.Contains(ref.Message, "sha256") {
		t.Errorf("short model: got %v, want the whole name quoted and no digest", ref)
	}
}

func TestQuoteBoundary(t *testing.T) {
	for _, n := range []int{0, 1, MaxQuotedBytes - 1, MaxQuotedBytes, MaxQuotedBytes + 1, 3 * MaxQuotedBytes} {
		for _, r := range []string{"a", "é", "😀", "\xff"} {
			s := strings.Repeat(r, n/len(r)+1)[:n]
			q := Quote(s)
			b := Bound(s)
			if len(q) > 4*MaxQuotedBytes+120 || len(b) > 3*MaxQuotedBytes+120 || !utf8.ValidString(q) || !utf8.ValidString(b) {
				t.Errorf("n=%d r=%q: Quote %d bytes, Bound %d bytes (valid %v %v)", n, r, len(q), len(b), utf8.ValidString(q), utf8.ValidString(b))
			}
			if n <= MaxQuotedBytes && q != strconv.Quote(s) {
				t.Errorf("n=%d r=%q: Quote = %s, want %s", n, r, q, strconv.Quote(s))
			}
		}
	}
}
