package wire

import "strings"

// The anthropic-messages allowlist: POST /v1/messages and
// /v1/messages/count_tokens. Written from Anthropic's Messages API reference
// ("Create a Message", "Count tokens in a Message") and the request types of
// github.com/anthropics/anthropic-sdk-go/v2 (MessageNewParams,
// MessageCountTokensParams and the *Param types they contain). Only the
// non-beta Messages API is admitted: beta-only fields (mcp_servers,
// container, context_management, …) are refused by name where they give
// the provider a reach moat cannot see, and as unknown fields otherwise.

// anthropicSchemas builds the trees of both endpoints: once, on first use
// (apis), not in the start-up of every moat process.
func anthropicSchemas() (*node, *node) {
	// cache_control on blocks, tools and the request: {"type":"ephemeral","ttl":"5m"|"1h"}.
	anthCacheControl := obj(fields{
		"type": enum("ephemeral"),
		"ttl":  enum("5m", "1h"),
	}, "type")

	// Citations that a text block carries back from an earlier response. Only
	// citations of documents the client sent itself are forwarded.
	anthCitation := tagged("type", "", map[string]*node{
		"char_location": obj(fields{
			"cited_text": str(), "document_index": integer(), "document_title": str(),
			"start_char_index": integer(), "end_char_index": integer(),
		}),
		"page_location": obj(fields{
			"cited_text": str(), "document_index": integer(), "document_title": str(),
			"start_page_number": integer(), "end_page_number": integer(),
		}),
		"content_block_location": obj(fields{
			"cited_text": str(), "document_index": integer(), "document_title": str(),
			"start_block_index": integer(), "end_block_index": integer(),
		}),
		"search_result_location": obj(fields{
			"cited_text": str(), "search_result_index": integer(), "source": str(), "title": str(),
			"start_block_index": integer(), "end_block_index": integer(),
		}),
	}, func(tag string) *denial {
		if tag == "web_search_result_location" { // produced by the web search server tool
			return &denyServerTool
		}
		return nil
	})

	// {"type":"text","text":…}
	anthText := obj(fields{
		"text":          str(),
		"cache_control": anthCacheControl,
		"citations":     arr(anthCitation),
	}, "text")

	// {"type":"image","source":{…}}: inline base64 only.
	anthImage := obj(fields{
		"source": tagged("type", "", map[string]*node{
			"base64": obj(fields{
				"media_type": enum("image/jpeg", "image/png", "image/gif", "image/webp"),
				"data":       str(),
			}, "media_type", "data"),
		}, func(tag string) *denial {
			switch tag {
			case "url":
				return &denyURLSource
			case "file":
				return &denyFileReference
			}
			return nil
		}),
		"cache_control": anthCacheControl,
	}, "source")

	// {"type":"document","source":{…}}: inline PDF, plain text or content blocks.
	anthDocument := obj(fields{
		"source": tagged("type", "", map[string]*node{
			"base64": obj(fields{"media_type": enum("application/pdf"), "data": str()}, "media_type", "data"),
			"text":   obj(fields{"media_type": enum("text/plain"), "data": str()}, "media_type", "data"),
			"content": obj(fields{
				"content": oneOf(str(), arr(tagged("type", "", map[string]*node{
					"text":  anthText,
					"image": anthImage,
				}, nil))),
			}, "content"),
		}, func(tag string) *denial {
			switch tag {
			case "url":
				return &denyURLSource
			case "file":
				return &denyFileReference
			}
			return nil
		}),
		"title":         str(),
		"context":       str(),
		"citations":     obj(fields{"enabled": boolean()}),
		"cache_control": anthCacheControl,
	}, "source")

	// {"type":"search_result",…}: search results the client found itself.
	anthSearchResult := obj(fields{
		"source":        str(),
		"title":         str(),
		"content":       arr(tagged("type", "", map[string]*node{"text": anthText}, nil)),
		"citations":     obj(fields{"enabled": boolean()}),
		"cache_control": anthCacheControl,
	}, "source", "title", "content")

	// What a tool_result may contain. The same inline-only rules apply.
	anthToolResultContent := tagged("type", "", map[string]*node{
		"text":          anthText,
		"image":         anthImage,
		"document":      anthDocument,
		"search_result": anthSearchResult,
	}, func(tag string) *denial {
		if tag == "tool_reference" { // produced by the tool search server tool
			return &denyServerTool
		}
		return nil
	})

	// Content blocks of a message.
	anthContentBlock := tagged("type", "", map[string]*node{
		"text":          anthText,
		"image":         anthImage,
		"document":      anthDocument,
		"search_result": anthSearchResult,
		// Extended thinking from an earlier assistant turn, passed back verbatim.
		"thinking":          obj(fields{"thinking": str(), "signature": str()}, "thinking", "signature"),
		"redacted_thinking": obj(fields{"data": str()}, "data"),
		// A client tool call from an earlier assistant turn. caller "direct" is
		// the model itself; other callers are server tools.
		"tool_use": obj(fields{
			"id":            str(),
			"name":          str(),
			"input":         anyObject(),
			"cache_control": anthCacheControl,
			"caller": tagged("type", "", map[string]*node{"direct": obj(fields{})},
				func(string) *denial { return &denyServerTool }),
		}, "id", "name", "input"),
		// The client's answer to a tool_use.
		"tool_result": obj(fields{
			"tool_use_id":   str(),
			"content":       oneOf(str(), arr(anthToolResultContent)),
			"is_error":      boolean(),
			"cache_control": anthCacheControl,
		}, "tool_use_id"),
	}, anthBlockDenial)

	anthMessage := obj(fields{
		"role":    enum("user", "assistant"),
		"content": oneOf(str(), arr(anthContentBlock)),
	}, "role", "content")

	// Tools: only custom (client) tools. A tool without "type" is custom; every
	// other type (web_search_…, web_fetch_…, code_execution_…, computer_…,
	// bash_…, text_editor_…, memory_…, tool_search_…) is a tool whose schema or
	// execution belongs to the provider, and is refused.
	anthTool := tagged("type", "custom", map[string]*node{
		"custom": obj(fields{
			"name":                  str(),
			"description":           str(),
			"input_schema":          anyObject(), // a JSON Schema; the provider validates it
			"cache_control":         anthCacheControl,
			"strict":                boolean(),
			"eager_input_streaming": boolean(),
		}, "name", "input_schema"),
	}, func(tag string) *denial {
		if strings.HasPrefix(tag, "mcp") { // mcp_toolset
			return &denyMCPServer
		}
		return &denyServerTool
	})

	anthToolChoice := tagged("type", "", map[string]*node{
		"auto": obj(fields{"disable_parallel_tool_use": boolean()}),
		"any":  obj(fields{"disable_parallel_tool_use": boolean()}),
		"tool": obj(fields{"name": str(), "disable_parallel_tool_use": boolean()}, "name"),
		"none": obj(fields{}),
	}, nil)

	anthThinking := tagged("type", "", map[string]*node{
		"enabled":  obj(fields{"budget_tokens": integer(), "display": enum("summarized", "omitted")}, "budget_tokens"),
		"disabled": obj(fields{}),
		"adaptive": obj(fields{"display": enum("summarized", "omitted")}),
	}, nil)

	anthOutputConfig := obj(fields{
		"effort": str(),
		"format": tagged("type", "", map[string]*node{
			"json_schema": obj(fields{"schema": anyObject()}, "schema"),
		}, nil),
	})

	// Fields shared by /v1/messages and /v1/messages/count_tokens.
	anthCommon := func() fields {
		return fields{
			"model":         str(),
			"messages":      arr(anthMessage),
			"system":        oneOf(str(), arr(tagged("type", "", map[string]*node{"text": anthText}, nil))),
			"tools":         arr(anthTool),
			"tool_choice":   anthToolChoice,
			"thinking":      anthThinking,
			"output_config": anthOutputConfig,
			"cache_control": anthCacheControl,
			// Refused by name: reach or state that moat cannot see.
			"mcp_servers":        deny(denyMCPServer.code, denyMCPServer.msg),
			"container":          deny(denyServerState.code, denyServerState.msg),
			"context_management": deny(denyContextManagement.code, denyContextManagement.msg),
		}
	}

	anthropicMessages := func() *node {
		f := anthCommon()
		f["max_tokens"] = integer()
		f["stream"] = boolean()
		f["metadata"] = obj(fields{"user_id": str()})
		f["stop_sequences"] = arr(str())
		f["temperature"] = num()
		f["top_p"] = num()
		f["top_k"] = integer()
		f["service_tier"] = enum("auto", "standard_only")
		f["inference_geo"] = str()
		return obj(f, "model", "messages")
	}()

	anthropicCountTokens := obj(anthCommon(), "model", "messages")
	return anthropicMessages, anthropicCountTokens
}

func anthBlockDenial(tag string) *denial {
	switch {
	case strings.HasPrefix(tag, "mcp_"): // mcp_tool_use, mcp_tool_result
		return &denyMCPServer
	case tag == "server_tool_use", strings.HasSuffix(tag, "_tool_result"): // web_search_tool_result, code_execution_tool_result, …
		return &denyServerTool
	case tag == "container_upload":
		return &denyServerState
	case tag == "compaction":
		return &denyCompaction
	}
	return nil
}
