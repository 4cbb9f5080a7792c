package measure

import (
	"os"
	"strings"
	"testing"
)

func TestParseRoutes(t *testing.T) {
	read := func(name string) []byte {
		b, err := os.ReadFile("testdata/" + name)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	// A fresh network namespace with loopback up: nothing leads out (the
	// IPv6 default entries there are RTF_REJECT).
	if got := parseRouteV4(read("route-netns.txt")); len(got) != 0 {
		t.Errorf("netns IPv4 routes: got %v, want none", got)
	}
	if got := parseRouteV6(read("ipv6_route-netns.txt")); len(got) != 0 {
		t.Errorf("netns IPv6 routes: got %v, want none", got)
	}
	// The host, captured when these tests were written: eth0 with a
	// default route in both families.
	if got := strings.Join(parseRouteV4(read("route-host.txt")), "; "); !strings.Contains(got, "dev eth0") {
		t.Errorf("host IPv4 routes: got %q, want routes through eth0", got)
	}
	if got := strings.Join(parseRouteV6(read("ipv6_route-host.txt")), "; "); !strings.Contains(got, "dev eth0") {
		t.Errorf("host IPv6 routes: got %q, want routes through eth0", got)
	}
	// Crafted rows.
	for _, tc := range []struct {
		name string
		v4   bool
		in   string
		want int
	}{
		{"v4 default via lo", true, "Iface\tDestination\nlo\t00000000\t00000000\t0001\t0\t0\t0\t00000000\t0\t0\t0\n", 1},
		{"v4 reject", true, "Iface\tDestination\neth0\t00000000\t00000000\t0201\t0\t0\t0\t00000000\t0\t0\t0\n", 0},
		{"v4 bad flags", true, "Iface\tDestination\neth0\t00000000\t00000000\tzz\t0\t0\t0\t00000000\t0\t0\t0\n", 1},
		{"v6 default via lo, not reject", false, strings.Repeat("0", 32) + " 00 " + strings.Repeat("0", 32) + " 00 " + strings.Repeat("0", 32) + " 00000000 00000001 00000000 00000001 lo\n", 1},
		{"short lines", false, "a b c\n\n", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			if tc.v4 {
				got = parseRouteV4([]byte(tc.in))
			} else {
				got = parseRouteV6([]byte(tc.in))
			}
			if len(got) != tc.want {
				t.Errorf("got %v, want %d routes out", got, tc.want)
			}
		})
	}
}

// FuzzParseRoutes: no input to the /proc route parsers panics.
func FuzzParseRoutes(f *testing.F) {
	addSeeds(f, "testdata/*route*.txt")
	f.Fuzz(func(t *testing.T, b []byte) {
		parseRouteV4(b)
		parseRouteV6(b)
	})
}
