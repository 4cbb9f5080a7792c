package tools

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"syscall"
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

// URLOptions say how URLTransport reaches a url server.
type URLOptions struct {
	// Dial makes each connection. moat passes the run's egress guard
	// (internal/netguard: one resolution, global unicast only, the
	// checked address dialled) for every url whose host is not a
	// loopback address. nil: a dialer that connects to loopback
	// addresses only (the policy's http://127.0.0.1… servers), so that a
	// caller that forgets the guard fails closed.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// RootCAs verify an https server (nil: the system's roots).
	RootCAs *x509.CertPool
}

// URLTransport reaches a url server over MCP streamable HTTP: through
// o.Dial, no proxy from the environment, no redirects (a 3xx answer is
// an error, its Location never dialled), cred (when set) as a bearer
// token, and on each tools/call the call's tool.requested line in
// PreEffectHeader.
func URLTransport(url, cred string, o URLOptions) sdk.Transport {
	dial := o.Dial
	if dial == nil {
		dial = loopbackDial
	}
	tr := &http.Transport{Proxy: nil, DialContext: dial, MaxIdleConns: 4, IdleConnTimeout: time.Minute,
		TLSClientConfig: &tls.Config{RootCAs: o.RootCAs}, TLSHandshakeTimeout: 10 * time.Second, ForceAttemptHTTP2: true}
	return &sdk.StreamableClientTransport{Endpoint: url, DisableStandaloneSSE: true, MaxRetries: -1,
		HTTPClient: &http.Client{Transport: headers{rt: tr, token: cred},
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// ErrRedirect is a url server's redirect, refused.
var ErrRedirect = errors.New("the url server answered a redirect; moat does not follow redirects from tool servers")

// loopbackDial connects to loopback addresses only.
func loopbackDial(ctx context.Context, network, addr string) (net.Conn, error) {
	d := &net.Dialer{Control: func(_, address string, _ syscall.RawConn) error {
		ap, err := netip.ParseAddrPort(address)
		if err != nil || !ap.Addr().Unmap().IsLoopback() {
			return fmt.Errorf("tool server address %s is not a loopback address; a remote url server is dialled only through the egress guard", address)
		}
		return nil
	}}
	return d.DialContext(ctx, network, addr)
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
	res, err := h.rt.RoundTrip(r)
	if err == nil && res.StatusCode >= 300 && res.StatusCode < 400 {
		res.Body.Close()
		return nil, fmt.Errorf("%w (%d to %q)", ErrRedirect, res.StatusCode, res.Header.Get("Location"))
	}
	if err == nil {
		// The SDK reads an application/json answer whole (io.ReadAll)
		// and caps only SSE events and stdio lines: the same cap here.
		res.Body = &cappedBody{rc: res.Body, left: MaxAnswerBytes}
	}
	return res, err
}

// MaxAnswerBytes caps one answer body of a url server, as the SDK caps
// one message of a command server on stdio (sdk.DefaultMaxLineLength).
const MaxAnswerBytes = sdk.DefaultMaxLineLength

// errAnswerTooLarge ends an answer body past MaxAnswerBytes.
var errAnswerTooLarge = fmt.Errorf("the url server's answer is over %d bytes", MaxAnswerBytes)

// cappedBody fails a read past its cap instead of returning more.
type cappedBody struct {
	rc   io.ReadCloser
	left int64
}

func (c *cappedBody) Read(p []byte) (int, error) {
	if c.left <= 0 {
		// One byte more tells a body of exactly the cap from a longer one.
		var b [1]byte
		n, err := c.rc.Read(b[:])
		if n > 0 {
			return 0, errAnswerTooLarge
		}
		return 0, err
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.rc.Read(p)
	c.left -= int64(n)
	return n, err
}

func (c *cappedBody) Close() error { return c.rc.Close() }
