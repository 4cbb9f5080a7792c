package broker

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/netguard"
)

// FuzzConnect: readConnect never panics; what it accepts is one whole
// head with nothing after it, a CONNECT to a canonical host and a port
// in range, whose authority, written back, parses to the same target.
func FuzzConnect(f *testing.F) {
	for _, s := range []string{
		"CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\n\r\n",
		"CONNECT [2606:4700::1111]:443 HTTP/1.1\r\n\r\n",
		"CONNECT PyPI.org:443 HTTP/1.0\r\nUser-Agent: x\r\nProxy-Connection: keep-alive\r\n\r\n",
		"CONNECT pypi.org:443 HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\n\r\n",
		"CONNECT a:443 HTTP/1.1\r\n\r\nCONNECT b:443 HTTP/1.1\r\n\r\n",
		"CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\nHost: evil:443\r\n\r\n",
		"CONNECT pypi.org:443 HTTP/1.1\r\n Host: x\r\n\r\n",
		"CONNECT pypi.org:0443 HTTP/1.1\r\n\r\n",
		"CONNECT u@pypi.org:443 HTTP/1.1\r\n\r\n",
		"CONNECT 127.1:443 HTTP/1.1\r\n\r\n",
		"CONNECT ::1:443 HTTP/1.1\r\n\r\n",
		"GET http://pypi.org/ HTTP/1.1\r\n\r\n",
		"CONNECT pypi.org:443 HTTP/1.1\nHost: pypi.org\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		br := bufio.NewReaderSize(bytes.NewReader(data), 4096)
		req, err := readConnect(br)
		if err != nil {
			return
		}
		head := string(data)
		end := strings.Index(head, "\r\n\r\n")
		if end < 0 || !strings.HasPrefix(head, "CONNECT ") {
			t.Fatalf("accepted %q", data)
		}
		if req.port < 1 || req.port > 65535 || req.host.Wildcard {
			t.Fatalf("accepted %q as %+v", data, req)
		}
		again, err := parseAuthority(req.host.String() + ":" + strconv.Itoa(req.port))
		if err != nil || again.host != req.host || again.port != req.port {
			t.Fatalf("%q: %s:%d does not parse back: %v", data, req.host, req.port, err)
		}
		if c, err := netguard.ParseTarget(req.host.String()); err != nil || c != req.host {
			t.Fatalf("%q: host %s is not canonical", data, req.host)
		}
	})
}

// FuzzClientHello: readClientHello never panics and reads only what its
// records hold; a real ClientHello gives its server name.
func FuzzClientHello(f *testing.F) {
	f.Add(clientHello(f, "pypi.org"))
	f.Add(clientHello(f, ""))
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"))
	f.Add([]byte{0x16, 3, 1, 0, 4, 1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		raw, sni, err := readClientHello(bufio.NewReader(bytes.NewReader(data)))
		if err != nil {
			return
		}
		if !bytes.HasPrefix(data, raw) || len(raw) > maxClientHello {
			t.Fatalf("raw %d bytes is not a prefix of the input", len(raw))
		}
		if sni != "" && !bytes.Contains(raw, []byte(sni)) {
			t.Fatalf("server name %q is not in the records", sni)
		}
	})
}

// clientHello is what crypto/tls sends first for serverName.
func clientHello(t testing.TB, serverName string) []byte {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	go func() {
		tls.Client(a, &tls.Config{ServerName: serverName, InsecureSkipVerify: serverName == ""}).Handshake()
	}()
	b.SetReadDeadline(time.Now().Add(5 * time.Second))
	raw, sni, err := readClientHello(bufio.NewReader(b))
	if err != nil || sni != serverName {
		t.Fatalf("ClientHello for %q: sni %q, %v", serverName, sni, err)
	}
	return raw
}
