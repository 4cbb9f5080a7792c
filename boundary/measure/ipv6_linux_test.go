package measure

import (
	"net"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/boundary/seccomp"
	"github.com/moat-sandbox/moat/internal/testenv"
)

// hostHasIPv6 reports whether a non-loopback interface of this host has
// an IPv6 address.
func hostHasIPv6(t *testing.T) bool {
	ifs, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	for _, ifc := range ifs {
		if ifc.Flags&net.FlagLoopback != 0 || ifc.Flags&net.FlagUp == 0 {
			continue
		}
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() == nil {
				return true
			}
		}
	}
	return false
}

// TestProbeIPv6Usable (red team, issue 20): the probe reports an IPv6
// address on a non-loopback interface as usable (the violation a Pod with
// a link-local address has), and reports it blocked on a thread behind
// moat's filter with Options.IPv4Only, as the kubernetes stage installs
// it; the control is the same probe on a thread behind the filter
// without IPv4Only, which still finds it usable.
func TestProbeIPv6Usable(t *testing.T) {
	testenv.Need(t, hostHasIPv6(t), "this host has no IPv6 address besides loopback")
	if out, d := probeIPv6Usable(); out != OutcomeSucceeded {
		t.Fatalf("unfiltered: %s (%s), want succeeded", out, d)
	}
	run := func(opts seccomp.Options) (string, string) {
		type res struct{ out, d string }
		c := make(chan res)
		go func() {
			// The filter binds this thread only (no TSYNC); the thread
			// exits with the goroutine, locked.
			runtime.LockOSThread()
			prog, err := seccomp.Build(opts)
			if err == nil {
				err = seccomp.Install(prog)
			}
			if err != nil {
				c <- res{OutcomeError, err.Error()}
				return
			}
			o, d := probeIPv6Usable()
			c <- res{o, d}
		}()
		r := <-c
		return r.out, r.d
	}
	if out, d := run(seccomp.Options{AllowUnixSockets: true}); out != OutcomeSucceeded {
		t.Errorf("behind the filter without IPv4Only: %s (%s), want succeeded", out, d)
	}
	out, d := run(seccomp.Options{AllowUnixSockets: true, IPv4Only: true})
	if out != OutcomeFailed || !strings.Contains(d, "operation not permitted") {
		t.Errorf("behind the filter with IPv4Only: %s (%s), want failed with EPERM", out, d)
	}
}

// TestBuildPlanPodIPv6: a Pod's plan has the IPv6 probe as an egress
// violation; the loopback plan (no BrokerHost) does not need it, since
// its interface check refuses any non-loopback interface.
func TestBuildPlanPodIPv6(t *testing.T) {
	for _, tt := range []struct {
		host string
		want bool
	}{{"10.244.0.1", true}, {"", false}} {
		cfg := Config{BrokerPort: 4000, BrokerHost: tt.host}
		if err := cfg.validate(4000); err != nil {
			t.Fatal(err)
		}
		pl, err := buildPlan(cfg, "00")
		if err != nil {
			t.Fatal(err)
		}
		if got := slices.Contains(planIDs(pl), "net/ipv6-usable"); got != tt.want {
			t.Errorf("BrokerHost %q: net/ipv6-usable in plan %v, want %v", tt.host, got, tt.want)
		}
	}
}
