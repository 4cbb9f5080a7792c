//go:build linux

package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/moat-sandbox/moat/internal/testenv"
)

// TestToolsURLThroughGuard: a remote (https, non-loopback) url tool server
// is dialled through the run's egress guard. The server, the SDK's
// streamable HTTP with one tool, add, listens on 127.0.0.2, the one
// address the moat_test_hooks binary's guard counts as global, and is
// named mcp.test by its test resolver; a trap listens on 127.0.0.1 at
// the same port. Control: the workload's SDK client calls add through
// the broker and gets its result. Then a url naming a private address
// and one that rebinds to 127.0.0.1 after its first lookup each refuse
// their run, by the guard's reason, and the trap hears nothing. The
// workload runs on native, and on gVisor as root.
func TestToolsURLThroughGuard(t *testing.T) {
	for _, backend := range ttyBackends(t) {
		t.Run(backend, func(t *testing.T) { testToolsURLThroughGuard(t, backend) })
	}
}

func testToolsURLThroughGuard(t *testing.T, backend string) {
	bin := hooksBin(t)
	e := newEnv(t)
	caPEM, srvCert := egressTestCerts(t)
	var ln, trap net.Listener
	var err error
	var port string
	for try := 0; try < 20; try++ {
		ln, err = net.Listen("tcp", "127.0.0.2:0")
		testenv.Need(t, err == nil, "cannot listen on 127.0.0.2")
		port = strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
		if trap, err = net.Listen("tcp", "127.0.0.1:"+port); err == nil {
			break
		}
		ln.Close()
	}
	if err != nil {
		t.Fatalf("no port free on both 127.0.0.2 and 127.0.0.1: %v", err)
	}
	defer trap.Close()
	var trapHits atomic.Int32
	go func() {
		for {
			c, err := trap.Accept()
			if err != nil {
				return
			}
			trapHits.Add(1)
			c.Close()
		}
	}()
	s := sdk.NewServer(&sdk.Implementation{Name: "remote-calc", Version: "1"}, nil)
	sdk.AddTool(s, &sdk.Tool{Name: "add"}, func(_ context.Context, _ *sdk.CallToolRequest, in struct {
		A float64 `json:"a"`
		B float64 `json:"b"`
	}) (*sdk.CallToolResult, any, error) {
		return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: fmt.Sprint(in.A + in.B)}}}, nil, nil
	})
	// A remote server: the SDK's protection of loopback servers against
	// rebound Host names does not apply.
	inner := sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return s }, &sdk.StreamableHTTPOptions{DisableLocalhostProtection: true})
	var mu sync.Mutex
	var seen []string
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.TLS.ServerName)
		mu.Unlock()
		inner.ServeHTTP(w, r)
	}), TLSConfig: &tls.Config{Certificates: []tls.Certificate{srvCert}}}
	// Every request on a connection of its own: each is dialled, and each
	// dial resolves the name again.
	srv.SetKeepAlivesEnabled(false)
	go srv.ServeTLS(ln, "", "")
	defer srv.Close()
	ca := filepath.Join(e.dir, "ca.pem")
	writeFile(t, ca, caPEM)

	run := func(host string) result {
		pol := e.policy(fmt.Sprintf(`tools:
  mcp:
    - name: calc
      url: https://%s:%s/mcp
      tools: [add]
`, host, port))
		cmd := exec.Command(bin, "run", "--backend", backend, "--policy", pol, "--", e.probe, helperArg, "mcp=add")
		cmd.Dir = e.dir
		cmd.Env = append(os.Environ(), "MOAT_STATE_DIR="+e.stateDir, "SSL_CERT_FILE="+ca, "MOAT_TEST_GLOBAL_ADDR=127.0.0.2",
			"MOAT_TEST_HOSTS=egress.test=127.0.0.2;private.test=10.0.0.1;rebind.test=127.0.0.2|127.0.0.1",
			"HTTPS_PROXY=", "https_proxy=", "NO_PROXY=", "no_proxy=")
		var so, se strings.Builder
		cmd.Stdout, cmd.Stderr = &so, &se
		cmd.Run()
		return result{so.String(), se.String(), cmd.ProcessState.ExitCode()}
	}

	if r := run("egress.test"); r.code != 0 || !strings.Contains(r.stdout, "mcp-result add 5\n") {
		t.Fatalf("the remote server at the test-global address (control): %s", r)
	}
	mu.Lock()
	n := len(seen)
	for _, sni := range seen {
		if sni != "egress.test" {
			t.Errorf("the server saw SNI %q", sni)
		}
	}
	mu.Unlock()
	if n == 0 {
		t.Fatal("the server saw nothing")
	}
	for _, c := range []struct{ host, reason string }{{"private.test", "address_private"}, {"rebind.test", "address_loopback"}} {
		r := run(c.host)
		// The guard refuses at whichever dial meets the bad address: at
		// the server's start (the run is refused) or, for the rebinding
		// name, possibly at the call (the call fails with the reason).
		refusedRun := r.code != 0 && strings.Contains(r.stderr, c.reason)
		failedCall := strings.Contains(r.stdout, "mcp=add err") && strings.Contains(r.stdout, c.reason)
		if strings.Contains(r.stdout, "mcp-result") || !(refusedRun || failedCall) {
			t.Errorf("%s: want the run refused or the call failed by the guard (%s): %s", c.host, c.reason, r)
		}
	}
	mu.Lock()
	for _, sni := range seen[n:] {
		if sni != "rebind.test" {
			t.Errorf("after the control the server saw SNI %q (only rebind.test's first lookup may reach it)", sni)
		}
	}
	if len(seen) == n {
		t.Errorf("rebind.test's first lookup (the test-global address) never reached the server: its refusal was not at a second dial")
	}
	mu.Unlock()
	if h := trapHits.Load(); h != 0 {
		t.Errorf("the trap on 127.0.0.1 heard %d connection(s)", h)
	}
}

// TestTestGlobalOnlyInHooksBuild: the test-only settings are inert in
// the binary a user runs. A CONNECT to a granted IP literal, 127.0.0.2,
// with MOAT_TEST_GLOBAL_ADDR=127.0.0.2 in moat's environment, is
// admitted (200) by the moat_test_hooks build (the control: the setting
// works where it exists) and refused 403 by the guard's loopback reason
// in the plain build, whatever its environment says.
func TestTestGlobalOnlyInHooksBuild(t *testing.T) {
	_, err := exec.LookPath("bash")
	testenv.Need(t, err == nil, "bash is not installed")
	hooks := hooksBin(t)
	e := newEnv(t)
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	testenv.Need(t, err == nil, "cannot listen on 127.0.0.2")
	defer ln.Close()
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	pol := e.policy(fmt.Sprintf("egress:\n  hosts:\n    - {host: 127.0.0.2, port: %s}\n", port))
	script := `EP=${HTTPS_PROXY##*:}; exec 3<>/dev/tcp/127.0.0.1/$EP; printf 'CONNECT 127.0.0.2:` + port + ` HTTP/1.1\r\nHost: 127.0.0.2:` + port + `\r\n\r\n' >&3; echo "status $(head -c 12 <&3)"`
	run := func(bin string) result {
		cmd := exec.Command(bin, "run", "--policy", pol, "--", "/bin/bash", "-c", script)
		cmd.Dir = e.dir
		cmd.Env = append(os.Environ(), "MOAT_STATE_DIR="+e.stateDir, "MOAT_TEST_GLOBAL_ADDR=127.0.0.2", "MOAT_TEST_HOSTS=x.test=127.0.0.2",
			"HTTPS_PROXY=", "https_proxy=", "NO_PROXY=", "no_proxy=")
		var so, se strings.Builder
		cmd.Stdout, cmd.Stderr = &so, &se
		cmd.Run()
		return result{so.String(), se.String(), cmd.ProcessState.ExitCode()}
	}
	if r := run(hooks); !strings.Contains(r.stdout, "status HTTP/1.1 200") {
		t.Fatalf("the hooks build with the test-global address (control): %s", r)
	}
	// (moat dials once the ClientHello has come; the script sends none.)
	if r := run(moatBin(t)); !strings.Contains(r.stdout, "status HTTP/1.1 403") || !strings.Contains(r.stderr, "address_loopback") {
		t.Errorf("the plain build took MOAT_TEST_GLOBAL_ADDR: %s", r)
	}
}
