package wire

import (
	"bytes"
	"fmt"
	"strconv"
)

// The refusals shared by every API. Each message says why moat refuses and
// what the client can do instead.
var (
	denyURLSource = denial{ReasonURLSource,
		"content fetched by the provider from a URL is not allowed (moat cannot see what would be fetched); send the content inline instead (base64 data, a data: URL, or text)"}
	denyFileReference = denial{ReasonFileReference,
		"references to files stored at the provider are not allowed (moat cannot see their content); send the content inline instead (base64 data or a data: URL)"}
	denyServerTool = denial{ReasonServerTool,
		"provider-hosted tools, and the blocks and items they produce, are not allowed (they act outside the sandbox where moat cannot see); define a custom/function tool that the client runs instead"}
	denyMCPServer = denial{ReasonMCPServer,
		"remote MCP servers are not allowed (the provider would connect to them outside moat); remove them and expose the capability as a client-side tool instead"}
	denyCompaction = denial{ReasonServerCompaction,
		"server-side compaction is not allowed (the provider would rewrite the conversation where moat cannot see); remove it and manage the context on the client"}
	denyContextManagement = denial{ReasonContextManagement,
		"server-side context management is not allowed (the provider would change the conversation where moat cannot see); remove it and manage the context on the client"}
	denyServerState = denial{ReasonServerState,
		"state held by the provider is not allowed (moat cannot see it); send the whole conversation in the request instead, with store false"}
)

// inlineURL is a string that must be a data: URL, never a URL the provider
// would fetch.
func inlineURL() *node {
	return str().with(func(v []byte) *denial {
		// v is a canonical JSON string (kString checked first): "data:"
		// is never escaped there, so its first five bytes are the text's.
		if len(v) >= 7 && bytes.EqualFold(v[1:6], []byte("data:")) {
			return nil
		}
		return &denyURLSource
	})
}

// exactlyOne is an integer that must be 1 when present.
func exactlyOne(why string) *node {
	return integer().with(func(v []byte) *denial {
		if n, err := strconv.ParseInt(string(v), 10, 64); err != nil || n != 1 {
			return &denial{ReasonInvalidValue, fmt.Sprintf("must be 1, got %s (%s)", v, why)}
		}
		return nil
	})
}
