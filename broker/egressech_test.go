package broker

import (
	"bufio"
	"crypto/ecdh"
	"crypto/rand"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/policy"
)

// echConfigList is an ECHConfigList (draft-ietf-tls-esni, version
// 0xfe0d) with one X25519/HKDF-SHA256/AES-128-GCM config whose public
// name is publicName: what a CDN publishes in DNS for every site behind
// it.
func echConfigList(t *testing.T, publicName string) []byte {
	t.Helper()
	k, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	u16 := func(b []byte, v int) []byte { return binary.BigEndian.AppendUint16(b, uint16(v)) }
	pub := k.PublicKey().Bytes()
	var c []byte
	c = append(c, 7)      // config_id
	c = u16(c, 0x0020)    // DHKEM(X25519, HKDF-SHA256)
	c = u16(c, len(pub))  // public_key
	c = append(c, pub...) //
	c = u16(c, 4)         // cipher_suites
	c = u16(c, 0x0001)    // HKDF-SHA256
	c = u16(c, 0x0001)    // AES-128-GCM
	c = append(c, 0)      // maximum_name_length
	c = append(c, byte(len(publicName)))
	c = append(c, publicName...) // public_name
	c = u16(c, 0)                // extensions
	cfg := u16(u16(nil, 0xfe0d), len(c))
	cfg = append(cfg, c...)
	return append(u16(nil, len(cfg)), cfg...)
}

// TestEgressECH: a ClientHello with Encrypted Client Hello names the
// granted host only in its outer server name (the CDN's public name); the
// name the server routes to is encrypted, so the SNI check cannot see it.
// Such a ClientHello is refused after the 200 and never reaches the
// upstream; the same client without ECH (the control) gets through.
func TestEgressECH(t *testing.T) {
	eh := newEgressHarness(t, []policy.EgressHost{{Host: "example.com"}}, nil)
	roots := eh.upstream.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	p := strconv.Itoa(eh.port)
	before := eh.accepted.Load()
	c, _, resp := eh.connect(connectHead("example.com:" + p))
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %d", resp.StatusCode)
	}
	tc := tls.Client(c, &tls.Config{ServerName: "evil.test", MinVersion: tls.VersionTLS13, RootCAs: roots,
		EncryptedClientHelloConfigList: echConfigList(t, "example.com")})
	if err := tc.Handshake(); err == nil {
		t.Errorf("the ECH handshake through the tunnel succeeded")
	}
	if o := eh.records("egress.opened"); len(o) != 0 {
		t.Errorf("a tunnel was opened for an ECH ClientHello: %v", o)
	}
	rec := eh.waitRecord("egress.refused", 1)
	if rec["reason"] != ReasonEgressSNI {
		t.Errorf("record %v, want reason %s", rec, ReasonEgressSNI)
	}
	if n := eh.accepted.Load() - before; n != 0 {
		t.Errorf("the upstream accepted %d connections for an ECH ClientHello", n)
	}
	if body, err := eh.get("example.com", "example.com", "/"); err != nil || body != "hello from example.com" {
		t.Fatalf("control: %q, %v", body, err)
	}
}

// TestEgressFatalBeforeDial: a tunnel admitted (answered 200) before the
// run's fatal event is not dialled after it: the ClientHello that arrives
// later is refused (run_failed) and never reaches the host, as a service
// request journaled before a fatal event is not sent. Control: the same
// tunnel before the fatal event gets through.
func TestEgressFatalBeforeDial(t *testing.T) {
	eh := newEgressHarness(t, []policy.EgressHost{{Host: "example.com"}}, nil)
	if body, err := eh.get("example.com", "example.com", "/"); err != nil || body != "hello from example.com" {
		t.Fatalf("control: %q, %v", body, err)
	}
	before := eh.accepted.Load()
	c, _, resp := eh.connect(connectHead("example.com:" + strconv.Itoa(eh.port)))
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %d", resp.StatusCode)
	}
	eh.b.fatal(ReasonCredentialReflect, errors.New("test: a fatal event while the tunnel waits for its ClientHello"))
	roots := eh.upstream.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	if err := tls.Client(c, &tls.Config{ServerName: "example.com", RootCAs: roots}).Handshake(); err == nil {
		t.Errorf("the handshake through the tunnel succeeded after the fatal event")
	}
	rec := eh.waitRecord("egress.refused", 1)
	if rec["reason"] != ReasonEgressRunFailed {
		t.Errorf("record %v, want reason %s", rec, ReasonEgressRunFailed)
	}
	if n := eh.accepted.Load() - before; n != 0 {
		t.Errorf("the host accepted %d connections after the fatal event", n)
	}
	if o := eh.records("egress.opened"); len(o) != 1 {
		t.Errorf("%d tunnels opened, want the control's only", len(o))
	}
}

// TestEgressFatalStopsRelay: bytes of an open tunnel that arrive after the
// run's fatal event are not relayed (not only at the next tick of the
// tunnel's clock, here an hour). Control: the same kept-alive TLS
// connection's first request, before the event, is answered.
func TestEgressFatalStopsRelay(t *testing.T) {
	eh := newEgressHarness(t, []policy.EgressHost{{Host: "example.com"}}, func(_ *policy.Egress, e *Egress) { e.tick = time.Hour })
	c, _, resp := eh.connect(connectHead("example.com:" + strconv.Itoa(eh.port)))
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %d", resp.StatusCode)
	}
	roots := eh.upstream.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	tc := tls.Client(c, &tls.Config{ServerName: "example.com", RootCAs: roots})
	br := bufio.NewReader(tc)
	get := func() (string, error) {
		fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: example.com\r\n\r\n")
		r, err := http.ReadResponse(br, nil)
		if err != nil {
			return "", err
		}
		b, err := io.ReadAll(r.Body)
		return string(b), err
	}
	if body, err := get(); err != nil || body != "hello from example.com" {
		t.Fatalf("control: %q, %v", body, err)
	}
	eh.b.fatal(ReasonCredentialReflect, errors.New("test: a fatal event on an open tunnel"))
	if body, err := get(); err == nil {
		t.Errorf("a request after the fatal event was relayed: %q", body)
	}
	if rec := eh.waitRecord("egress.closed", 1); rec["reason"] != CloseRunEnded {
		t.Errorf("closed %v, want reason %s", rec, CloseRunEnded)
	}
}
