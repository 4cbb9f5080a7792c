package tools

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/moat-sandbox/moat/internal/netguard"
)

// guardHosts is a test resolver: each name answers its addresses one per
// lookup (the last one again after), so that a name can rebind.
type guardHosts struct {
	mu      sync.Mutex
	answers map[string][]string
	calls   map[string]int
}

func (r *guardHosts) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	as := r.answers[host]
	if len(as) == 0 {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	i := min(r.calls[host], len(as)-1)
	r.calls[host]++
	return []netip.Addr{netip.MustParseAddr(as[i])}, nil
}

// guardFixture: an https MCP server (the SDK's, calc's tools) on
// 127.0.0.1, which the test's guard counts as global; a trap listening
// on 127.0.0.2 at the same port; and a redirecting https server.
type guardFixture struct {
	port     string
	pool     *x509.CertPool
	requests atomic.Int32 // what the MCP server received
	trapHits atomic.Int32
	redirHit atomic.Int32 // requests at the redirect's target
	guard    *netguard.Guard
}

func newGuardFixture(t *testing.T) *guardFixture {
	t.Helper()
	f := &guardFixture{}
	caPEM, cert := guardCerts(t, "mcp.test", "rebind.test", "private.test", "redirect.test")
	f.pool = x509.NewCertPool()
	f.pool.AppendCertsFromPEM(caPEM)
	var ln, trap net.Listener
	var err error
	for try := 0; try < 20; try++ {
		if ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		f.port = strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
		if trap, err = net.Listen("tcp", "127.0.0.2:"+f.port); err == nil {
			break
		}
		ln.Close()
	}
	if err != nil {
		t.Skipf("no port free on both 127.0.0.1 and 127.0.0.2: %v", err)
	}
	t.Cleanup(func() { trap.Close() })
	go func() {
		for {
			c, err := trap.Accept()
			if err != nil {
				return
			}
			f.trapHits.Add(1)
			c.Close()
		}
	}()
	s := testServer(&observer{})
	// The server stands for a remote one on a global address: the SDK's
	// protection of servers on loopback against rebound Host names does
	// not apply to it.
	inner := sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return s }, &sdk.StreamableHTTPOptions{DisableLocalhostProtection: true})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.requests.Add(1)
		switch {
		case r.TLS.ServerName == "redirect.test":
			http.Redirect(w, r, "https://mcp.test:"+f.port+"/elsewhere", http.StatusTemporaryRedirect)
		case r.URL.Path == "/elsewhere":
			f.redirHit.Add(1)
			http.Error(w, "followed", http.StatusTeapot)
		default:
			// Each request on its own connection: each is dialled, and
			// each dial resolves the name again.
			w.Header().Set("Connection", "close")
			inner.ServeHTTP(w, r)
		}
	}), TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}, ErrorLog: nil, ReadHeaderTimeout: 5 * time.Second}
	srv.SetKeepAlivesEnabled(false)
	go srv.ServeTLS(ln, "", "")
	t.Cleanup(func() { srv.Close() })
	res := &guardHosts{calls: map[string]int{}, answers: map[string][]string{
		"mcp.test":      {"127.0.0.1"},
		"redirect.test": {"127.0.0.1"},
		"rebind.test":   {"127.0.0.1", "127.0.0.2"},
		"private.test":  {"10.0.0.1"},
	}}
	f.guard = netguard.New(netguard.WithTestGlobal(netip.MustParseAddr("127.0.0.1")), netguard.WithResolver(res))
	return f
}

func (f *guardFixture) transport(host string) sdk.Transport {
	return URLTransport("https://"+host+":"+f.port+"/mcp", "", URLOptions{Dial: f.guard.DialContext, RootCAs: f.pool})
}

// TestURLServerThroughGuard: a remote url server is dialled through the
// egress guard. Control: an https server at the guard's one test-global
// address is reached by name and answers a call. In the same setup a
// name resolving to a private address is refused before any dial; a name
// that rebinds to another loopback address after its first lookup is
// refused at the next dial and the trap there hears nothing; a server's
// redirect is an error, its target never asked; and without the guard
// (the default dial), a name resolving to a non-loopback address is
// refused.
func TestURLServerThroughGuard(t *testing.T) {
	f := newGuardFixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	up, err := Connect(ctx, "remote", f.transport("mcp.test"))
	if err != nil {
		t.Fatalf("the test-global server (positive control): %v", err)
	}
	res, err := up.CallTool(ctx, "add", []byte(`{"a":1,"b":2}`))
	if err != nil || len(res.Content) == 0 || res.Content[0].(*sdk.TextContent).Text != "3" {
		t.Fatalf("add through the guard: %v %v", res, err)
	}
	up.Close()
	before := f.requests.Load()

	// A private address: refused by the guard, nothing dialled.
	_, err = Connect(ctx, "private", f.transport("private.test"))
	if netguard.ReasonOf(err) != netguard.ReasonPrivate && (err == nil || !strings.Contains(err.Error(), netguard.ReasonPrivate)) {
		t.Errorf("private.test: got %v, want the guard's %s", err, netguard.ReasonPrivate)
	}
	if f.requests.Load() != before {
		t.Errorf("private.test reached the server")
	}

	// A rebinding name: the first connection is the global address; the
	// next dial resolves again and is refused, the trap hears nothing.
	up, err = Connect(ctx, "rebind", f.transport("rebind.test"))
	if err == nil {
		_, err = up.CallTool(ctx, "add", []byte(`{"a":1,"b":2}`))
		up.Close()
	}
	if err == nil || !strings.Contains(err.Error(), netguard.ReasonLoopback) {
		t.Errorf("rebind.test: got %v, want the guard's %s at its second dial", err, netguard.ReasonLoopback)
	}
	if f.requests.Load() == before {
		t.Errorf("rebind.test's first lookup (the global address) never reached the server")
	}
	if n := f.trapHits.Load(); n != 0 {
		t.Errorf("the trap at the rebound address heard %d connection(s)", n)
	}

	// A redirect: an error; its target is never asked.
	_, err = Connect(ctx, "redirect", f.transport("redirect.test"))
	if err == nil || !errors.Is(err, ErrRedirect) && !strings.Contains(err.Error(), "redirect") {
		t.Errorf("redirect.test: got %v, want the redirect refused", err)
	}
	if n := f.redirHit.Load(); n != 0 {
		t.Errorf("the redirect's target was asked %d time(s)", n)
	}

	// Without the guard, the default dial connects to loopback only: the
	// control is the loopback server itself, by address.
	up, err = Connect(ctx, "loop", URLTransport("https://127.0.0.1:"+f.port+"/mcp", "", URLOptions{RootCAs: f.pool}))
	if err != nil {
		t.Fatalf("the default dial to a loopback address (control): %v", err)
	}
	up.Close()
	_, err = Connect(ctx, "remote", URLTransport("https://192.0.2.1:"+f.port+"/mcp", "", URLOptions{RootCAs: f.pool}))
	if err == nil || !strings.Contains(err.Error(), "not a loopback address") {
		t.Errorf("the default dial to 192.0.2.1: got %v, want refused before connecting", err)
	}
}

// guardCerts makes a CA and a server certificate for names and 127.0.0.1.
func guardCerts(t *testing.T, names ...string) ([]byte, tls.Certificate) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "moat tools test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: names[0]},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), DNSNames: names,
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("192.0.2.1")},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}
