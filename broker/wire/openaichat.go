package wire

// The openai-chat allowlist: POST /v1/chat/completions. Written from
// OpenAI's API reference ("Create chat completion") and the request types of
// github.com/openai/openai-go/v3 (ChatCompletionNewParams and the *Param
// types it contains). Refused by name: web_search_options (a provider-hosted
// tool), store: true (the completion is kept at the provider), assistant audio
// references (provider-held audio), file_id parts
// (provider-held files) and image URLs that are not data: URLs.

// openaiChatSchema builds the tree of /v1/chat/completions: once, on first
// use (apis), not in the start-up of every moat process.
func openaiChatSchema() *node {
	// {"type":"text","text":…}
	chatTextPart := obj(fields{"text": str()}, "text")

	// Content that may only be text: a string or text parts.
	chatTextContent := oneOf(str(), arr(tagged("type", "", map[string]*node{"text": chatTextPart}, nil)))

	// Parts of a user message.
	chatUserPart := tagged("type", "", map[string]*node{
		"text": chatTextPart,
		// Images: data: URLs only; an http(s) URL would be fetched by the provider.
		"image_url": obj(fields{
			"image_url": obj(fields{
				"url":    inlineURL(),
				"detail": enum("auto", "low", "high"),
			}, "url"),
		}, "image_url"),
		"input_audio": obj(fields{
			"input_audio": obj(fields{"data": str(), "format": enum("wav", "mp3")}, "data", "format"),
		}, "input_audio"),
		// Files: inline file_data only; file_id names a file stored at OpenAI.
		"file": obj(fields{
			"file": obj(fields{
				"file_data": str(),
				"filename":  str(),
				"file_id":   deny(denyFileReference.code, denyFileReference.msg),
			}),
		}, "file"),
	}, nil)

	// A tool call from an earlier assistant turn.
	chatToolCall := tagged("type", "", map[string]*node{
		"function": obj(fields{
			"id":       str(),
			"function": obj(fields{"name": str(), "arguments": str()}, "name", "arguments"),
		}, "id", "function"),
		"custom": obj(fields{
			"id":     str(),
			"custom": obj(fields{"name": str(), "input": str()}, "name", "input"),
		}, "id", "custom"),
	}, nil)

	// Messages, discriminated by role.
	chatMessage := tagged("role", "", map[string]*node{
		"developer": obj(fields{"content": chatTextContent, "name": str()}, "content"),
		"system":    obj(fields{"content": chatTextContent, "name": str()}, "content"),
		"user":      obj(fields{"content": oneOf(str(), arr(chatUserPart)), "name": str()}, "content"),
		"assistant": obj(fields{
			"content": oneOf(str(), arr(tagged("type", "", map[string]*node{
				"text":    chatTextPart,
				"refusal": obj(fields{"refusal": str()}, "refusal"),
			}, nil))),
			"refusal":       str(),
			"name":          str(),
			"tool_calls":    arr(chatToolCall),
			"function_call": obj(fields{"name": str(), "arguments": str()}, "name", "arguments"),
			"audio":         deny(denyServerState.code, denyServerState.msg), // {"id":…}: audio held by OpenAI
		}),
		"tool":     obj(fields{"content": chatTextContent, "tool_call_id": str()}, "content", "tool_call_id"),
		"function": obj(fields{"content": str(), "name": str()}, "name"), // deprecated, still accepted by the API
	}, nil)

	// A function definition: {"name","description","parameters","strict"}.
	chatFunctionDef := obj(fields{
		"name":        str(),
		"description": str(),
		"parameters":  anyObject(), // a JSON Schema; the provider validates it
		"strict":      boolean(),
	}, "name")

	// Format of a custom tool's input.
	customToolFormat := tagged("type", "", map[string]*node{
		"text": obj(fields{}),
		"grammar": obj(fields{
			"grammar": obj(fields{"definition": str(), "syntax": enum("lark", "regex")}, "definition", "syntax"),
		}, "grammar"),
	}, nil)

	// Tools: function and custom tools, which the client runs.
	chatTool := tagged("type", "", map[string]*node{
		"function": obj(fields{"function": chatFunctionDef}, "function"),
		"custom": obj(fields{
			"custom": obj(fields{"name": str(), "description": str(), "format": customToolFormat}, "name"),
		}, "custom"),
	}, func(string) *denial { return &denyServerTool })

	chatToolChoice := oneOf(
		enum("none", "auto", "required"),
		tagged("type", "", map[string]*node{
			"function": obj(fields{"function": obj(fields{"name": str()}, "name")}, "function"),
			"custom":   obj(fields{"custom": obj(fields{"name": str()}, "name")}, "custom"),
			"allowed_tools": obj(fields{
				"allowed_tools": obj(fields{
					"mode": enum("auto", "required"),
					"tools": arr(tagged("type", "", map[string]*node{
						"function": obj(fields{"function": obj(fields{"name": str()}, "name")}, "function"),
						"custom":   obj(fields{"custom": obj(fields{"name": str()}, "name")}, "custom"),
					}, nil)),
				}, "mode", "tools"),
			}, "allowed_tools"),
		}, nil),
	)

	// response_format, shared with the Responses API's text.format in spirit.
	chatResponseFormat := tagged("type", "", map[string]*node{
		"text":        obj(fields{}),
		"json_object": obj(fields{}),
		"json_schema": obj(fields{
			"json_schema": obj(fields{
				"name":        str(),
				"description": str(),
				"schema":      anyObject(),
				"strict":      boolean(),
			}, "name"),
		}, "json_schema"),
	}, nil)

	openaiChat := obj(fields{
		"model":    str(),
		"messages": arr(chatMessage),
		// Output limits: see reserveTokens. n multiplies output, so only 1.
		"max_completion_tokens": integer(),
		"max_tokens":            integer(),
		"n":                     exactlyOne("each choice is generated and billed separately; request one choice per call"),
		// Sampling and output shaping.
		"temperature":       num(),
		"top_p":             num(),
		"frequency_penalty": num(),
		"presence_penalty":  num(),
		"seed":              integer(),
		"logprobs":          boolean(),
		"top_logprobs":      integer(),
		"logit_bias":        anyObject(), // token id → bias
		"stop":              oneOf(str(), arr(str())),
		"reasoning_effort":  str(),
		"verbosity":         enum("low", "medium", "high"),
		"response_format":   chatResponseFormat,
		"modalities":        arr(enum("text")), // audio output is not forwarded
		"prediction": obj(fields{
			"type":    enum("content"),
			"content": chatTextContent,
		}, "type", "content"),
		// Tools.
		"tools":               arr(chatTool),
		"tool_choice":         chatToolChoice,
		"parallel_tool_calls": boolean(),
		"functions":           arr(chatFunctionDef), // deprecated form of tools
		"function_call": oneOf(enum("none", "auto"),
			obj(fields{"name": str()}, "name")), // deprecated form of tool_choice
		// Streaming.
		"stream": boolean(),
		"stream_options": obj(fields{
			"include_usage":       boolean(),
			"include_obfuscation": boolean(),
		}),
		// Bookkeeping that does not change what the provider does for us.
		"user":                   str(),
		"safety_identifier":      str(),
		"prompt_cache_key":       str(),
		"prompt_cache_retention": str(),
		"metadata":               anyObject(),
		"service_tier":           str(),
		// Refused by name.
		"store":              boolean().denying(map[string]denial{"true": denyServerState}),
		"web_search_options": deny(denyServerTool.code, denyServerTool.msg),
	}, "model", "messages")
	return openaiChat
}
