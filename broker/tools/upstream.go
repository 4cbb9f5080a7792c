package tools

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// Session is a connected tool server: an MCP client session of the
// official SDK.
type Session struct {
	cs *sdk.ClientSession
}

// clientVersion is what the broker asks servers for: the newest version
// of the initialize handshake (the SDK's stateless 2026 protocol would
// add per-request _meta of its own to each call).
const clientVersion = "2025-11-25"

// Connect starts an MCP session with a server over t (the SDK's stdio,
// command or streamable HTTP transports): initialize and initialized.
func Connect(ctx context.Context, name string, t sdk.Transport) (*Session, error) {
	c := sdk.NewClient(&sdk.Implementation{Name: "moat", Version: "1"}, nil)
	cs, err := c.Connect(ctx, t, &sdk.ClientSessionOptions{ProtocolVersion: clientVersion})
	if err != nil {
		return nil, fmt.Errorf("moat: tool server %q: initialize: %w", name, err)
	}
	return &Session{cs: cs}, nil
}

// ListTools lists every tool of the server, all pages.
func (s *Session) ListTools(ctx context.Context) ([]*sdk.Tool, error) {
	var out []*sdk.Tool
	for t, err := range s.cs.Tools(ctx, nil) {
		if err != nil {
			return nil, err
		}
		out = append(out, t)
		if len(out) > maxListedTools {
			return nil, fmt.Errorf("the server lists more than %d tools", maxListedTools)
		}
	}
	return out, nil
}

// maxListedTools caps what a server may list.
const maxListedTools = 4096

// CallTool sends args (canonical JSON of an object) as params.arguments:
// the SDK writes a json.RawMessage as it is.
func (s *Session) CallTool(ctx context.Context, tool string, args []byte) (*sdk.CallToolResult, error) {
	return s.cs.CallTool(ctx, &sdk.CallToolParams{Name: tool, Arguments: json.RawMessage(args)})
}

// Close ends the session (for a command server, closes its stdin).
func (s *Session) Close() error { return s.cs.Close() }

// PreEffectHeader carries a call's tool.requested line, base64, to a url
// server, as the inference broker sends inference.requested to a
// provider: a server holding the run's pinned key can check what it is
// asked against the signed, durable record.
const PreEffectHeader = "Moat-Pre-Effect"

type preEffectKey struct{}

// URLTransport reaches a url server over MCP streamable HTTP: no proxy
// from the environment, no redirects, cred (when set) as a bearer token,
// and on each tools/call the call's tool.requested line in
// PreEffectHeader. (The policy admits loopback urls only, until the
// egress guard exists.)
func URLTransport(url, cred string) sdk.Transport {
	tr := &http.Transport{Proxy: nil, MaxIdleConns: 4, IdleConnTimeout: time.Minute}
	return &sdk.StreamableClientTransport{Endpoint: url, DisableStandaloneSSE: true, MaxRetries: -1,
		HTTPClient: &http.Client{Transport: headers{rt: tr, token: cred},
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// headers adds the bearer token and the pre-effect record.
type headers struct {
	rt    http.RoundTripper
	token string
}

func (h headers) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if h.token != "" {
		r.Header.Set("Authorization", "Bearer "+h.token)
	}
	if line, ok := r.Context().Value(preEffectKey{}).([]byte); ok {
		r.Header.Set(PreEffectHeader, base64.StdEncoding.EncodeToString(line))
	}
	return h.rt.RoundTrip(r)
}
