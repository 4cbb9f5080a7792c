package broker

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/moat-sandbox/moat/broker/wire"
	"github.com/moat-sandbox/moat/policy"
)

// Upstream limits.
const (
	// UpstreamHeaderTimeout bounds the wait for a provider's response
	// head (a non-streaming answer may take minutes to generate).
	UpstreamHeaderTimeout = 10 * time.Minute
	// MaxResponseBytes caps a buffered (non-streaming) response after
	// decoding, and one streamed response in total.
	MaxResponseBytes = 64 << 20
	// maxCAFileBytes caps a provider's ca_file.
	maxCAFileBytes = 1 << 20
)

// provider is one upstream with its credential and client.
type provider struct {
	name    string
	api     string
	base    *url.URL
	models  []string
	credEnv string
	cred    string
	pat     *pattern // the reflection guard's automaton for cred, built once
	// The credential's header, canonical name and value, built once.
	credHeader, credValue string
	urls                  map[string]*url.URL // endpoint → upstream URL (url)
	client                *http.Client
	transport             http.RoundTripper // client's
}

func newProvider(pp *policy.Provider, cred string, override *http.Transport) (*provider, error) {
	u, err := url.Parse(strings.TrimSuffix(pp.BaseURL, "/"))
	if err != nil {
		return nil, fmt.Errorf("moat: broker: provider %q: base_url: %w", pp.Name, err)
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.Host == "" {
		return nil, fmt.Errorf("moat: broker: provider %q: base_url %q must be scheme://host[:port][/prefix] without credentials, query or fragment", pp.Name, pp.BaseURL)
	}
	switch u.Scheme {
	case "https":
	case "http":
		if !isLoopbackHost(u.Hostname()) {
			return nil, fmt.Errorf("moat: broker: provider %q: base_url %q: plain http is allowed only to a loopback address; use https", pp.Name, pp.BaseURL)
		}
	default:
		return nil, fmt.Errorf("moat: broker: provider %q: base_url %q: scheme must be https (or http to loopback)", pp.Name, pp.BaseURL)
	}
	if cred != "" {
		if err := checkCredential(pp.Name, cred); err != nil {
			return nil, err
		}
	}
	p := &provider{name: pp.Name, api: pp.API, base: u, models: pp.Models, credEnv: pp.CredentialEnv, cred: cred}
	if cred != "" {
		p.pat = newPattern(cred)
	}
	tr := override
	if tr == nil {
		tr, err = defaultTransport(pp, u.Scheme == "http")
		if err != nil {
			return nil, err
		}
	}
	switch pp.API {
	case wire.APIAnthropicMessages:
		p.credHeader, p.credValue = "X-Api-Key", cred
	default:
		p.credHeader, p.credValue = "Authorization", "Bearer "+cred
	}
	p.urls = map[string]*url.URL{}
	for _, ep := range wire.Endpoints(pp.API) {
		if p.urls[ep], err = url.Parse(p.url(ep)); err != nil {
			return nil, fmt.Errorf("moat: broker: provider %q: base_url %q with endpoint %s: %w", pp.Name, pp.BaseURL, ep, err)
		}
	}
	p.transport = tr
	p.client = &http.Client{
		Transport: tr,
		// Redirects are never followed: the 3xx comes back to forward,
		// which fails the request without touching the target.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return p, nil
}

func isLoopbackHost(h string) bool {
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// defaultTransport builds a provider's transport: system roots plus
// ca_file, no proxy, no transparent decompression (the broker decodes and
// scans itself), and for plain http a dialer that connects only to
// loopback addresses, whatever a name resolves to.
func defaultTransport(pp *policy.Provider, plain bool) (*http.Transport, error) {
	roots, err := x509.SystemCertPool()
	if err != nil || roots == nil {
		roots = x509.NewCertPool()
	}
	if pp.CAFile != "" {
		pem, err := readCapped(pp.CAFile, maxCAFileBytes)
		if err != nil {
			return nil, fmt.Errorf("moat: broker: provider %q: ca_file: %w", pp.Name, err)
		}
		if !roots.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("moat: broker: provider %q: ca_file %q holds no PEM certificate", pp.Name, pp.CAFile)
		}
	}
	d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	if plain {
		d.Control = loopbackOnly
	}
	return &http.Transport{
		Proxy:                 nil,
		DialContext:           d.DialContext,
		TLSClientConfig:       &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: UpstreamHeaderTimeout,
		ForceAttemptHTTP2:     true,
		MaxIdleConnsPerHost:   32,
		IdleConnTimeout:       90 * time.Second,
		DisableCompression:    true,
	}, nil
}

// loopbackOnly is the dial guard of plain-http providers: whatever the
// name resolved to, the socket connects only to a loopback address.
func loopbackOnly(network, address string, _ syscall.RawConn) error {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return err
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("moat: refused: plain http to non-loopback address %s", address)
	}
	return nil
}

func readCapped(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, limit)
	}
	return b, nil
}

// url is the upstream URL: base_url (with any path prefix) + the endpoint.
func (p *provider) url(endpoint string) string {
	u := *p.base
	u.Path = strings.TrimSuffix(u.Path, "/") + endpoint
	u.RawPath = ""
	return u.String()
}

// upstreamClient is the HTTP client of a service or package grant
// (egress.services, egress.packages): dial is the guarded dialer, roots
// the trusted CAs, timeout bounds a whole exchange. No proxy from the
// environment, no transparent decompression (the broker decodes and scans
// itself), and redirects come back to the caller unfollowed.
func upstreamClient(dial func(ctx context.Context, network, addr string) (net.Conn, error), roots *x509.CertPool, timeout time.Duration) *http.Client {
	return &http.Client{
		Transport: &http.Transport{
			Proxy:                 nil,
			DialContext:           dial,
			TLSClientConfig:       &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
			TLSHandshakeTimeout:   10 * time.Second,
			ResponseHeaderTimeout: UpstreamHeaderTimeout,
			ForceAttemptHTTP2:     true,
			MaxIdleConnsPerHost:   8,
			IdleConnTimeout:       90 * time.Second,
			DisableCompression:    true,
		},
		// Redirects are never followed: the 3xx comes back to the caller.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Timeout:       timeout,
	}
}
