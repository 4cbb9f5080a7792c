package attrib

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseTCPLine(t *testing.T) {
	le := isLittleEndian()
	v4 := "0100007F:1F90 0100007F:C350"
	v6 := "00000000000000000000000001000000:1F90 0000000000000000FFFF00000100007F:C350"
	if !le {
		v4 = "7F000001:1F90 7F000001:C350"
		v6 = "00000000000000000000000000000001:1F90 00000000000000000000FFFF7F000001:C350"
	}
	for _, tc := range []struct {
		name, line string
		want       tcpRow
		err        bool
	}{
		{"ipv4", "   0: " + v4 + " 01 00000000:00000000 00:00000000 00000000  1000        0 12345 1 0000000000000000 20 4 30 10 -1",
			tcpRow{netip.MustParseAddrPort("127.0.0.1:8080"), netip.MustParseAddrPort("127.0.0.1:50000"), 1, 12345}, false},
		{"ipv6 with mapped remote", "  12: " + v6 + " 06 00000000:00000000 03:00000D2B 00000000     0        0 0 3 0000000000000000",
			tcpRow{netip.MustParseAddrPort("[::1]:8080"), netip.MustParseAddrPort("127.0.0.1:50000"), 6, 0}, false},
		{"short", "0: 0100007F:1F90", tcpRow{}, true},
		{"bad hex", "0: 0100007G:1F90 0100007F:C350 01 0:0 0:0 0 0 0 1", tcpRow{}, true},
		{"bad port", "0: 0100007F:1F9 0100007F:C350 01 0:0 0:0 0 0 0 1", tcpRow{}, true},
		{"odd address", "0: 0100007F00:1F90 0100007F:C350 01 0:0 0:0 0 0 0 1", tcpRow{}, true},
		{"no slot colon", "0 0100007F:1F90 0100007F:C350 01 0:0 0:0 0 0 0 1", tcpRow{}, true},
		{"bad inode", "0: 0100007F:1F90 0100007F:C350 01 0:0 0:0 0 0 0 -1", tcpRow{}, true},
		{"bad state", "0: 0100007F:1F90 0100007F:C350 1 0:0 0:0 0 0 0 1", tcpRow{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseTCPLine(tc.line)
			if (err != nil) != tc.err {
				t.Fatalf("err = %v, want error %v", err, tc.err)
			}
			if got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
	if _, err := parseTCPLine("  sl  local_address rem_address   st tx_queue"); !errors.Is(err, errHeader) {
		t.Errorf("header: got %v, want errHeader", err)
	}
}

func isLittleEndian() bool { return binary.NativeEndian.Uint16([]byte{1, 0}) == 1 }

// FuzzParseTCPLine: no input panics, and every accepted row has valid
// addresses. The corpus in testdata/fuzz runs in plain go test.
func FuzzParseTCPLine(f *testing.F) {
	seeds, _ := filepath.Glob("testdata/*.txt")
	for _, p := range seeds {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		for _, l := range strings.Split(string(b), "\n") {
			f.Add(l)
		}
	}
	f.Fuzz(func(t *testing.T, line string) {
		r, err := parseTCPLine(line)
		if err != nil {
			if r != (tcpRow{}) {
				t.Fatalf("error %v with non-zero row %+v", err, r)
			}
			return
		}
		if !r.Local.Addr().IsValid() || !r.Remote.Addr().IsValid() {
			t.Fatalf("accepted %q with invalid address: %+v", line, r)
		}
	})
}
