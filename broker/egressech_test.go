package broker

import (
	"crypto/ecdh"
	"crypto/rand"
	"crypto/tls"
	"encoding/binary"
	"net/http"
	"strconv"
	"testing"

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
