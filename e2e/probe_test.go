//go:build linux

package e2e

import (
	"fmt"
	"os"

	"github.com/moat-sandbox/moat/internal/probekit"
	"github.com/moat-sandbox/moat/internal/reexec"
)

// helperArg makes the test binary act as an in-sandbox probe: each further
// argument is one action "kind=arg" of internal/probekit, or one of the
// e2e probe's own below, and the probe prints one line per action,
// "kind=arg ok [detail]" or "kind=arg err <reason>". The tests judge these
// lines together with what host-side receivers observed.
const helperArg = reexec.Prefix + "test-e2e-probe"

func helperMain(actions []string) int { return probekit.Main(os.Stdout, sdkActions, actions) }

// sdkActions are the e2e probe's own actions: calls through the model
// SDKs and the MCP client, which stay in this test binary (the SDKs must
// not enter the moat binary). An SDK call's detail is the answer's text,
// quoted.
var sdkActions = map[string]probekit.Action{
	"mcp":                  func(arg string) (string, error) { return "", mcpProbe(arg) }, // tools_test.go
	"sdk-anthropic":        sdkAction("sdk-anthropic"),
	"sdk-anthropic-stream": sdkAction("sdk-anthropic-stream"),
	"sdk-openai-chat":      sdkAction("sdk-openai-chat"),
	"sdk-openai-responses": sdkAction("sdk-openai-responses"),
}

func sdkAction(kind string) probekit.Action {
	return func(model string) (string, error) {
		out, err := sdkCall(kind, model) // sdk_test.go
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("%q", out), nil
	}
}
