package wire

import "strings"

// The openai-responses allowlist: POST /v1/responses. Written from OpenAI's
// API reference ("Create a model response") and the request types of
// github.com/openai/openai-go/v3/responses (ResponseNewParams and the *Param
// types it contains). The Responses API can keep and reuse state at the
// provider; moat admits only self-contained requests: previous_response_id,
// conversation, prompt (a stored prompt), background: true, store: true and
// item_reference items are refused, and "store": false is written when the
// request does not say (see the package doc). Built-in tools and the items
// they produce, MCP, compaction and truncation "auto" are refused.

// openaiResponsesSchema builds the tree of /v1/responses: once, on first use
// (apis), not in the start-up of every moat process.
func openaiResponsesSchema() *node {
	// Input content parts. Images and files are inline only.
	respInputText := obj(fields{"text": str()}, "text")

	respInputImage := obj(fields{
		"image_url": inlineURL(), // data: URLs only
		"detail":    enum("auto", "low", "high", "original"),
		"file_id":   deny(denyFileReference.code, denyFileReference.msg),
	})

	respInputFile := obj(fields{
		"file_data": str(),
		"filename":  str(),
		"detail":    str(),
		"file_url":  deny(denyURLSource.code, denyURLSource.msg),
		"file_id":   deny(denyFileReference.code, denyFileReference.msg),
	})

	// Annotations on earlier output text all point at provider-side things
	// (web pages it fetched, files it holds); only an empty list is forwarded.
	respAnnotation := tagged("type", "", map[string]*node{}, func(tag string) *denial {
		if tag == "url_citation" {
			return &denyServerTool
		}
		return &denyFileReference // file_citation, container_file_citation, file_path
	})

	// Parts of a message item: input parts (user, system, developer) and output
	// parts (an earlier assistant turn).
	respMessagePart := tagged("type", "", map[string]*node{
		"input_text":  respInputText,
		"input_image": respInputImage,
		"input_file":  respInputFile,
		"output_text": obj(fields{
			"text":        str(),
			"annotations": arr(respAnnotation),
			"logprobs":    arr(anyObject()),
		}, "text"),
		"refusal": obj(fields{"refusal": str()}, "refusal"),
	}, nil)

	// The output of a client tool call: a string or input parts.
	respToolOutput := oneOf(str(), arr(tagged("type", "", map[string]*node{
		"input_text":  respInputText,
		"input_image": respInputImage,
		"input_file":  respInputFile,
	}, nil)))

	// Who called a function: the model directly; a "program" caller is a
	// provider-hosted tool.
	respCaller := tagged("type", "", map[string]*node{"direct": obj(fields{})},
		func(string) *denial { return &denyServerTool })

	// Input items. An item without "type" is a message (EasyInputMessage).
	respItem := tagged("type", "message", map[string]*node{
		"message": obj(fields{
			"role":    enum("user", "assistant", "system", "developer"),
			"content": oneOf(str(), arr(respMessagePart)),
			"id":      str(),
			"status":  str(),
			"phase":   str(),
		}, "role", "content"),
		"function_call": obj(fields{
			"call_id":   str(),
			"name":      str(),
			"arguments": str(),
			"id":        str(),
			"status":    str(),
			"caller":    respCaller,
		}, "call_id", "name", "arguments"),
		"function_call_output": obj(fields{
			"call_id": str(),
			"output":  respToolOutput,
			"id":      str(),
			"status":  str(),
			"caller":  respCaller,
		}, "call_id", "output"),
		"custom_tool_call": obj(fields{
			"call_id": str(),
			"name":    str(),
			"input":   str(),
			"id":      str(),
			"caller":  respCaller,
		}, "call_id", "name", "input"),
		"custom_tool_call_output": obj(fields{
			"call_id": str(),
			"output":  respToolOutput,
			"id":      str(),
			"caller":  respCaller,
		}, "call_id", "output"),
		// Reasoning from an earlier turn. With store false it travels as
		// encrypted_content, which the client holds.
		"reasoning": obj(fields{
			"id":                str(),
			"summary":           arr(tagged("type", "", map[string]*node{"summary_text": obj(fields{"text": str()}, "text")}, nil)),
			"content":           arr(tagged("type", "", map[string]*node{"reasoning_text": obj(fields{"text": str()}, "text")}, nil)),
			"encrypted_content": str(),
			"status":            str(),
		}, "summary"),
	}, respItemDenial)

	// Format of a custom tool's input. Unlike chat, the grammar is not nested.
	respCustomToolFormat := tagged("type", "", map[string]*node{
		"text":    obj(fields{}),
		"grammar": obj(fields{"definition": str(), "syntax": enum("lark", "regex")}, "definition", "syntax"),
	}, nil)

	// Tools: function and custom tools, which the client runs. Every built-in
	// tool (web_search*, file_search, code_interpreter, computer*,
	// image_generation, local_shell, shell, apply_patch, tool_search, …) is
	// refused, and mcp as a remote MCP server.
	respTool := tagged("type", "", map[string]*node{
		"function": obj(fields{
			"name":        str(),
			"description": str(),
			"parameters":  anyObject(),
			"strict":      boolean(),
		}, "name"),
		"custom": obj(fields{
			"name":        str(),
			"description": str(),
			"format":      respCustomToolFormat,
		}, "name"),
	}, respToolDenial)

	respNamedTool := tagged("type", "", map[string]*node{
		"function": obj(fields{"name": str()}, "name"),
		"custom":   obj(fields{"name": str()}, "name"),
	}, respToolDenial)

	respToolChoice := oneOf(
		enum("none", "auto", "required"),
		tagged("type", "", map[string]*node{
			"function": obj(fields{"name": str()}, "name"),
			"custom":   obj(fields{"name": str()}, "name"),
			"allowed_tools": obj(fields{
				"mode":  enum("auto", "required"),
				"tools": arr(respNamedTool),
			}, "mode", "tools"),
		}, respToolDenial), // hosted tool choices (file_search, web_search_preview, …, mcp)
	)

	openaiResponses := obj(fields{
		"model":        str(),
		"input":        oneOf(str(), arr(respItem)),
		"instructions": str(),
		// Output limit: see reserveTokens.
		"max_output_tokens": integer(),
		"max_tool_calls":    integer(),
		// Sampling and output shaping.
		"temperature":  num(),
		"top_p":        num(),
		"top_logprobs": integer(),
		"reasoning": obj(fields{
			"effort":           str(),
			"summary":          str(),
			"generate_summary": str(),
		}),
		"text": obj(fields{
			"format": tagged("type", "", map[string]*node{
				"text":        obj(fields{}),
				"json_object": obj(fields{}),
				"json_schema": obj(fields{
					"name":        str(),
					"schema":      anyObject(),
					"description": str(),
					"strict":      boolean(),
				}, "name", "schema"),
			}, nil),
			"verbosity": enum("low", "medium", "high"),
		}),
		// Extra output that stays with the client.
		"include": arr(enum("reasoning.encrypted_content", "message.output_text.logprobs")),
		// Tools.
		"tools":               arr(respTool),
		"tool_choice":         respToolChoice,
		"parallel_tool_calls": boolean(),
		// Streaming.
		"stream":         boolean(),
		"stream_options": obj(fields{"include_obfuscation": boolean()}),
		// Bookkeeping that does not change what the provider does for us.
		"user":                   str(),
		"safety_identifier":      str(),
		"prompt_cache_key":       str(),
		"prompt_cache_retention": str(),
		"metadata":               anyObject(),
		"service_tier":           str(),
		// State and context held by the provider: refused.
		"store":                boolean().denying(map[string]denial{"true": denyServerState}),
		"background":           boolean().denying(map[string]denial{"true": denyServerState}),
		"truncation":           enum("disabled").denying(map[string]denial{"auto": denyContextManagement}),
		"previous_response_id": deny(denyServerState.code, denyServerState.msg),
		"conversation":         deny(denyServerState.code, denyServerState.msg),
		"prompt":               deny(denyServerState.code, "stored prompts are not allowed (moat cannot see their content); send the instructions and input in the request instead"),
		"context_management":   deny(denyContextManagement.code, denyContextManagement.msg),
	}, "model")
	return openaiResponses
}

func respItemDenial(tag string) *denial {
	switch {
	case tag == "item_reference":
		return &denyServerState
	case strings.HasPrefix(tag, "compaction"): // compaction, compaction_trigger
		return &denyCompaction
	case strings.HasPrefix(tag, "mcp_"): // mcp_call, mcp_list_tools, mcp_approval_request, mcp_approval_response
		return &denyMCPServer
	case strings.HasSuffix(tag, "_call"), strings.HasSuffix(tag, "_call_output"), // web_search_call, file_search_call, computer_call(_output), code_interpreter_call, image_generation_call, local_shell_call(_output), shell_call(_output), apply_patch_call(_output)
		strings.HasPrefix(tag, "tool_search_"), strings.HasPrefix(tag, "program"):
		return &denyServerTool
	}
	return nil
}

func respToolDenial(tag string) *denial {
	if tag == "mcp" {
		return &denyMCPServer
	}
	return &denyServerTool
}
