package evidence

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"debug/buildinfo"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/moat-sandbox/moat/evidence/probe"
)

// The controller's side of the egress case (issue 13). Its registry is a
// TLS server on 127.0.0.2 (a certificate from a CA made for the case,
// for the granted names), and its trap a raw receiver on 127.0.0.1 at
// the same port. moat's SSRF guard refuses both addresses, as it must:
// the case runs the moat_test_hooks build of moat (Options.HooksBinary),
// whose guard is told through its environment that 127.0.0.2 is global
// and whose tunnels resolve names through a test resolver (see doc.go for
// why the binary under test has no such option and what that costs).

// Test addresses of the egress case.
const (
	egressRegistryAddr = "127.0.0.2" // the one address the hooks binary counts as global
	egressTrapAddr     = "127.0.0.1" // the rebinding name's second answer, the loopback name's
	egressPrivateAddr  = "10.0.0.1"  // never dialled: the guard refuses it before any dial
	// Environment of the hooks binary (sandbox.TestGlobalAddrEnv and
	// sandbox.TestHostsEnv in a moat_test_hooks build).
	envTestGlobal = "MOAT_TEST_GLOBAL_ADDR"
	envTestHosts  = "MOAT_TEST_HOSTS"
	// hooksTag is the build tag of a moat_test_hooks binary.
	hooksTag = "moat_test_hooks"
)

// Egress listener names and event kinds (EgressEvent).
const (
	EgressRegistry = "registry"
	EgressTrap     = "trap"
	// Registry events: a TLS ClientHello (its SNI) and a request.
	EgressKindHello   = "hello"
	EgressKindRequest = "request"
)

// EgressEvent is one thing the egress case's registry or trap received.
type EgressEvent struct {
	N        int    `json:"n"`
	Time     string `json:"time"`
	Listener string `json:"listener"` // registry | trap
	Kind     string `json:"kind"`     // hello | request (registry); control | hit (trap)
	SNI      string `json:"sni,omitempty"`
	Host     string `json:"host,omitempty"` // the request's Host
	Path     string `json:"path,omitempty"`
	Bytes    int    `json:"bytes,omitempty"` // a trap delivery's size
	SHA256   string `json:"sha256,omitempty"`
}

// egressRun is the egress case's live state.
type egressRun struct {
	port  string
	body  string // what the registry serves: a fresh value
	caPEM []byte
	nonce []byte // the trap's control payload
	log   *eventLog

	mu       sync.Mutex
	n        int
	controls bool
	closers  []io.Closer
}

// hooksBuilt reports whether the binary at path was built with the
// moat_test_hooks tag.
func hooksBuilt(path string) (bool, error) {
	bi, err := buildinfo.ReadFile(path)
	if err != nil {
		return false, err
	}
	for _, kv := range bi.Settings {
		if kv.Key == "-tags" && strings.Contains(","+kv.Value+",", ","+hooksTag+",") {
			return true, nil
		}
	}
	return false, nil
}

// sameSource: the hooks binary must come from the binary under test's
// source revision when both record one ("" when they agree or either
// does not say).
func sameSource(tested, hooks string) string {
	if tested == "" || hooks == "" || tested == hooks {
		return ""
	}
	return fmt.Sprintf("built from revision %s, the binary under test from %s; build both from the same source", hooks, tested)
}

// setupEgress prepares the egress case before moat starts: the hooks
// binary's check, the CA, the registry and the trap. False: a
// precondition is missing (recorded), and moat is not run.
func (r *caseRun) setupEgress() (bool, error) {
	if !r.c.Egress {
		return true, nil
	}
	hb := r.s.HooksBinary
	if hb == "" {
		r.host.Missing = append(r.host.Missing, "precondition: the egress case needs moat built with -tags "+hooksTag+
			" (--hooks-binary or MOAT_HOOKS_BIN); the binary under test has no test-global address or test resolver, by design")
		return false, nil
	}
	ok, err := hooksBuilt(hb)
	if err != nil || !ok {
		r.host.Missing = append(r.host.Missing, fmt.Sprintf("precondition: %s is not a moat binary built with -tags %s (%v)", hb, hooksTag, err))
		return false, nil
	}
	if msg := sameSource(sourceInfo(r.s.Binary, "").Embedded, sourceInfo(hb, "").Embedded); msg != "" {
		r.host.Missing = append(r.host.Missing, "precondition: "+hb+": "+msg)
		return false, nil
	}
	sum, err := FileSHA256(hb)
	if err != nil {
		return false, err
	}
	e := &egressRun{body: "moat-evidence-registry-" + randHex(12), nonce: newNonce()}
	if e.log, err = openEventLog(filepath.Join(r.dir, FileEgressEvents)); err != nil {
		return false, err
	}
	r.egress = e
	caPEM, cert, err := egressCerts()
	if err != nil {
		return false, err
	}
	e.caPEM = caPEM
	if err := e.listen(cert); err != nil {
		return false, err
	}
	r.host.Values = map[string]string{ValueEgressBody: e.body, ValueEgressPort: e.port, ValueHooksSHA: sum}
	if err := os.WriteFile(filepath.Join(r.workspace, probe.EgressCA), caPEM, 0o644); err != nil {
		return false, err
	}
	if err := e.control(); err != nil {
		return false, fmt.Errorf("positive control to the egress trap: %w", err)
	}
	return true, nil
}

// listen starts the registry on 127.0.0.2 and the trap on 127.0.0.1 at
// the same port (a few tries: the port may be taken on 127.0.0.1).
func (e *egressRun) listen(cert tls.Certificate) error {
	var reg, trap net.Listener
	var err error
	for try := 0; try < 20; try++ {
		if reg, err = net.Listen("tcp", egressRegistryAddr+":0"); err != nil {
			return fmt.Errorf("egress registry on %s: %w", egressRegistryAddr, err)
		}
		port := strconv.Itoa(reg.Addr().(*net.TCPAddr).Port)
		if trap, err = net.Listen("tcp", net.JoinHostPort(egressTrapAddr, port)); err == nil {
			e.port = port
			break
		}
		reg.Close()
	}
	if err != nil {
		return fmt.Errorf("egress trap: %w", err)
	}
	e.closers = append(e.closers, trap)
	go func() {
		for {
			c, err := trap.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetReadDeadline(time.Now().Add(receiverReadTimeout))
				data, _ := io.ReadAll(io.LimitReader(c, MaxReceiverRead))
				kind := "hit"
				if bytes.Equal(data, e.nonce) {
					kind = "control"
					e.mu.Lock()
					e.controls = true
					e.mu.Unlock()
				}
				e.record(EgressEvent{Listener: EgressTrap, Kind: kind, Bytes: len(data), SHA256: sha256Hex(data)})
			}()
		}
	}()
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, q *http.Request) {
			e.record(EgressEvent{Listener: EgressRegistry, Kind: EgressKindRequest, SNI: q.TLS.ServerName, Host: q.Host, Path: q.URL.Path})
			io.WriteString(w, e.body+"\n")
		}),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			e.record(EgressEvent{Listener: EgressRegistry, Kind: EgressKindHello, SNI: h.ServerName})
			return nil, nil
		}},
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          log.New(io.Discard, "", 0),
	}
	e.closers = append(e.closers, srv)
	go srv.ServeTLS(reg, "", "")
	return nil
}

func (e *egressRun) record(ev EgressEvent) {
	e.mu.Lock()
	e.n++
	ev.N = e.n
	e.mu.Unlock()
	ev.Time = time.Now().UTC().Format(time.RFC3339Nano)
	e.log.append(ev)
}

// control delivers the trap's positive control from the host and waits
// until it is recorded.
func (e *egressRun) control() error {
	c, err := net.DialTimeout("tcp", net.JoinHostPort(egressTrapAddr, e.port), controlTimeout)
	if err != nil {
		return err
	}
	_, err = c.Write(e.nonce)
	c.Close()
	if err != nil {
		return err
	}
	for deadline := time.Now().Add(controlTimeout); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		e.mu.Lock()
		ok := e.controls
		e.mu.Unlock()
		if ok {
			return nil
		}
	}
	return errors.New("not observed")
}

func (e *egressRun) close() {
	for _, c := range e.closers {
		c.Close()
	}
	e.log.close()
}

// egressEnv is the hooks binary's test environment: 127.0.0.2 counts as
// global, and the names resolve as the case needs.
func (e *egressRun) env() []string {
	hosts := []string{
		probe.EgressGranted + "=" + egressRegistryAddr,
		probe.EgressRebind + "=" + egressRegistryAddr + "|" + egressTrapAddr,
		probe.EgressUngranted + "=" + egressRegistryAddr,
		probe.EgressPrivate + "=" + egressPrivateAddr,
		probe.EgressLoopback + "=" + egressTrapAddr,
	}
	return []string{envTestGlobal + "=" + egressRegistryAddr, envTestHosts + "=" + strings.Join(hosts, ";")}
}

// egressPolicy is the case policy's egress section: every name but the
// ungranted one is granted at the registry's port.
func (r *caseRun) egressPolicy() string {
	if r.egress == nil {
		return ""
	}
	var b strings.Builder
	b.WriteString("egress:\n  hosts:\n")
	for _, h := range []string{probe.EgressGranted, probe.EgressRebind, probe.EgressPrivate, probe.EgressLoopback} {
		fmt.Fprintf(&b, "    - {host: %s, port: %s}\n", h, r.egress.port)
	}
	return b.String()
}

// egressCerts makes a CA and a server certificate for the granted names
// (and the ungranted one, so that only moat can refuse it).
func egressCerts() ([]byte, tls.Certificate, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	now := time.Now()
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "moat evidence egress CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: probe.EgressGranted},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		DNSNames:    []string{probe.EgressGranted, probe.EgressRebind, probe.EgressUngranted},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}
