//go:build linux

package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/internal/testenv"
)

// egressTunnelScript runs inside the sandbox: curl through the egress
// port (HTTPS_PROXY, set by moat) to the test's TLS server, then each
// attack followed by the granted request again (its control).
const egressTunnelScript = `
set -u
echo "proxy $HTTPS_PROXY $https_proxy $npm_config_https_proxy $PIP_PROXY"
echo "no_proxy $NO_PROXY $no_proxy"
echo "http_proxy [${HTTP_PROXY:-}${http_proxy:-}]"
c() { curl -s -m 20 --cacert "$WS/ca.pem" "$@"; }
st() { c -o /dev/null -w '%{http_connect} %{http_code}' "$@"; }
ok() { echo "control $(c "https://egress.test:$P/hello")"; }
echo "granted $(c "https://egress.test:$P/hello")"
echo "rebind-first $(c "https://rebind.test:$P/hello")"
echo "rebind-second $(st "https://rebind.test:$P/hello")"; ok
echo "ungranted $(st "https://evil.test:$P/")"; ok
echo "sni-mismatch $(st --connect-to "evil.test:$P:egress.test:$P" "https://evil.test:$P/")"; ok
echo "ip-literal $(st "https://127.0.0.2:$P/")"; ok
echo "mapped-literal $(st "https://[::ffff:127.0.0.2]:$P/")"; ok
echo "nat64-literal $(st "https://[64:ff9b::7f00:2]:$P/")"; ok
echo "loopback $(st "https://loop.test:$P/")"; ok
echo "private $(st "https://private.test:$P/")"; ok
echo "cgnat $(st "https://cgnat.test:$P/")"; ok
echo "metadata $(st "https://metadata.test:$P/")"; ok
BP=${MOAT_BROKER_URL##*:}
echo "broker-own $(st --noproxy '' "https://127.0.0.1:$BP/")"; ok
EP=${HTTPS_PROXY##*:}
echo "smuggle $(bash -c 'exec 3<>/dev/tcp/127.0.0.1/'$EP'; printf "CONNECT egress.test:'$P' HTTP/1.1\r\nHost: egress.test:'$P'\r\n\r\n\026\003\001\000\005hello" >&3; head -c 12 <&3')"; ok
echo "pipelined $(bash -c 'exec 3<>/dev/tcp/127.0.0.1/'$EP'; printf "CONNECT egress.test:'$P' HTTP/1.1\r\n\r\nCONNECT evil.test:443 HTTP/1.1\r\n\r\n" >&3; head -c 12 <&3')"; ok
echo "inference-connect $(curl -s -o /dev/null -w '%{http_connect}' -x "$MOAT_BROKER_URL" --cacert "$WS/ca.pem" "https://egress.test:$P/hello")"; ok
`

// TestEgressTunnelCurl: curl inside a native sandbox reaches a local TLS
// server (on 127.0.0.2, which the moat_test_hooks binary's guard counts
// as global; names come from its test resolver) through the egress port,
// TLS end to end with the test CA; in the same run every attack is
// refused and never reaches the server, each followed by its control. The
// journal holds egress.opened before egress.closed for each tunnel and an
// egress.refused with its reason for each attack.
func TestEgressTunnelCurl(t *testing.T) { egressTunnelCurl(t, "native") }

// TestRootEgressTunnelCurlGVisor: the same through gVisor's egress port.
func TestRootEgressTunnelCurlGVisor(t *testing.T) {
	testenv.NeedRoot(t)
	_, err := exec.LookPath("runsc")
	testenv.Need(t, err == nil, "runsc is not installed")
	egressTunnelCurl(t, "gvisor")
}

func egressTunnelCurl(t *testing.T, backend string) {
	for _, tool := range []string{"curl", "bash"} {
		_, err := exec.LookPath(tool)
		testenv.Need(t, err == nil, tool+" is not installed")
	}
	bin := hooksBin(t)
	e := newEnv(t)
	up := listenUpstream(t)
	up.serve(func(w http.ResponseWriter, r *http.Request) {
		up.see(r.TLS.ServerName + " " + r.Host) // the SNI and host name the server saw
		fmt.Fprintf(w, "hello %s", r.TLS.ServerName)
	})
	port := up.port
	writeFile(t, filepath.Join(e.workspace, "ca.pem"), up.caPEM)
	pol := e.policy(fmt.Sprintf(`egress:
  hosts:
    - {host: egress.test, port: %[1]s}
    - {host: rebind.test, port: %[1]s}
    - {host: loop.test, port: %[1]s}
    - {host: private.test, port: %[1]s}
    - {host: cgnat.test, port: %[1]s}
    - {host: metadata.test, port: %[1]s}
    - {host: "[::ffff:127.0.0.2]", port: %[1]s}
    - {host: "[64:ff9b::7f00:2]", port: %[1]s}
`, port))
	setPolicyEnv(t, pol, fmt.Sprintf("PATH: /usr/bin:/bin, WS: %s, P: \"%s\"", e.workspace, port))
	r := e.runHooks(t.Context(), bin, []string{
		"MOAT_TEST_HOSTS=egress.test=127.0.0.2;rebind.test=127.0.0.2|127.0.0.1;loop.test=127.0.0.1;private.test=10.0.0.1;cgnat.test=100.64.0.1;metadata.test=169.254.169.254",
		"HTTPS_PROXY=", "https_proxy=", "NO_PROXY=", "no_proxy="},
		"run", "--backend", backend, "--policy", pol, "--", "/bin/sh", "-c", egressTunnelScript)
	for _, want := range []string{
		"granted hello egress.test\n", "rebind-first hello rebind.test\n",
		"rebind-second 403 000\n", "ungranted 403 000\n", "sni-mismatch 200 000\n", "ip-literal 403 000\n",
		"mapped-literal 403 000\n", "nat64-literal 403 000\n", "loopback 403 000\n", "private 403 000\n",
		"cgnat 403 000\n", "metadata 403 000\n", "broker-own 403 000\n",
		"http_proxy []\n",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("missing %q in the workload's output", want)
		}
	}
	if n := strings.Count(r.stdout, "control hello egress.test\n"); n != 14 {
		t.Errorf("%d controls succeeded, want 14", n)
	}
	if strings.Contains(r.stdout, "inference-connect 200") {
		t.Errorf("the inference port accepted CONNECT")
	}
	if !strings.Contains(r.stdout, "no_proxy 127.0.0.1,localhost,::1 127.0.0.1,localhost,::1\n") || !strings.Contains(r.stdout, "proxy http://127.0.0.1:") {
		t.Errorf("proxy environment wrong")
	}
	if r.code != 0 {
		t.Errorf("exit %d", r.code)
	}
	// The server saw only the granted names, each with its own SNI.
	seen := up.saw()
	for _, s := range seen {
		if s != "egress.test egress.test:"+port && s != "rebind.test rebind.test:"+port {
			t.Errorf("the server saw %q", s)
		}
	}
	if len(seen) != 16 {
		t.Errorf("the server saw %d requests, want 16 (granted, rebind's first, 14 controls)", len(seen))
	}
	// The journal: each tunnel opened before it closed, each attack
	// refused with its reason.
	journals, _ := filepath.Glob(filepath.Join(e.auditDir, "*", "journal.jsonl"))
	if len(journals) != 1 {
		t.Fatalf("journals %v\n%s", journals, r)
	}
	b, err := os.ReadFile(journals[0])
	if err != nil {
		t.Fatal(err)
	}
	ps, err := audit.Payloads(b)
	if err != nil {
		t.Fatal(err)
	}
	opened := map[string]bool{}
	var reasons []string
	closed := 0
	for _, p := range ps {
		var m map[string]any
		json.Unmarshal(p, &m)
		switch m["type"] {
		case audit.TypeEgressOpened:
			opened[m["tunnel_id"].(string)] = true
			if m["address"] != "127.0.0.2" || m["sni"] != m["host"] {
				t.Errorf("opened %v", m)
			}
			// Native attributes each tunnel to the process that opened
			// it; gVisor is endpoint-only.
			at, _ := m["attribution"].(map[string]any)
			if backend == "native" && (at["status"] != "resolved" || !strings.HasSuffix(fmt.Sprint(at["executable"]), "/curl")) {
				t.Errorf("opened without curl's attribution: %v", at)
			}
		case audit.TypeEgressClosed:
			if !opened[m["tunnel_id"].(string)] {
				t.Errorf("closed before opened: %v", m)
			}
			closed++
		case audit.TypeEgressRefused:
			reasons = append(reasons, m["reason"].(string))
		}
	}
	if len(opened) != 16 || closed != 16 {
		t.Errorf("opened %d, closed %d tunnels, want 16 each (the SNI mismatch opens none)", len(opened), closed)
	}
	for _, want := range []string{"address_loopback", "egress_not_granted", "egress_sni_mismatch", "address_embeds_ipv4", "address_private", "address_cgnat", "address_metadata"} {
		if !slices.Contains(reasons, want) {
			t.Errorf("no refusal %s in %v", want, reasons)
		}
	}
	// The smuggled bytes and the pipelined CONNECT are refused either
	// before the 200 (when they arrive with the head: the broker tests
	// make that case deterministic) or after it (they are not a
	// ClientHello); bash writes them in pieces, so either may happen.
	if n := strings.Count(strings.Join(reasons, " "), "egress_bad_request") + strings.Count(strings.Join(reasons, " "), "egress_tls_required"); n != 2 {
		t.Errorf("%d smuggling refusals, want 2 (data before the 200, pipelined): %v", n, reasons)
	}
	for _, k := range []string{"smuggle", "pipelined"} {
		if !strings.Contains(r.stdout, k+" HTTP/1.1 403\n") && !strings.Contains(r.stdout, k+" HTTP/1.1 200\n") {
			t.Errorf("%s: no answer", k)
		}
	}
	if t.Failed() {
		t.Logf("%s", r)
	}
}

// egressTestCerts makes a CA and a server certificate for the test's
// names.
func egressTestCerts(t *testing.T) (string, tls.Certificate) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "moat egress test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "egress.test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		DNSNames: []string{"egress.test", "rebind.test", "evil.test"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.2")},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})),
		tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}
