//go:build moat_test_hooks

package sandbox

import (
	"context"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
)

// TestHostsEnv names the test resolver of a moat_test_hooks binary's
// egress tunnels: "name=addr|addr...;name=addr", each lookup of a name
// answering its next address (the last one again after): a test can make
// a name that rebinds between two lookups. Names not listed do not
// resolve. The policy and the CLI have no such setting.
const TestHostsEnv = "MOAT_TEST_HOSTS"

func init() {
	v, ok := os.LookupEnv(TestHostsEnv)
	if !ok {
		return
	}
	r := &testHosts{answers: map[string][]netip.Addr{}, calls: map[string]int{}}
	for _, e := range strings.Split(v, ";") {
		name, addrs, ok := strings.Cut(e, "=")
		if !ok {
			continue
		}
		for _, a := range strings.Split(addrs, "|") {
			if ip, err := netip.ParseAddr(a); err == nil {
				r.answers[name] = append(r.answers[name], ip)
			}
		}
	}
	testResolver = r
}

type testHosts struct {
	mu      sync.Mutex
	answers map[string][]netip.Addr
	calls   map[string]int
}

func (r *testHosts) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	as := r.answers[host]
	if len(as) == 0 {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	i := min(r.calls[host], len(as)-1)
	r.calls[host]++
	return []netip.Addr{as[i]}, nil
}
