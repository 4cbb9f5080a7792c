package measure

import (
	"slices"
	"testing"
)

// TestBuildPlanPodNetwork: with the broker at a host address (a Pod's
// sandbox), the broker control targets that address, the interface and
// route checks give way to connections to that host at the receivers'
// and other ports, and the plan names the host for the helper's guard;
// the same Config without BrokerHost keeps the loopback plan (control).
func TestBuildPlanPodNetwork(t *testing.T) {
	cfg := Config{BrokerPort: 4000, BrokerHost: "10.244.0.1", hostTCPPorts: []int{5001}, hostUDPPorts: []int{5002}}
	if err := cfg.validate(4000); err != nil {
		t.Fatal(err)
	}
	pl, err := buildPlan(cfg, "00")
	if err != nil {
		t.Fatal(err)
	}
	ids := planIDs(pl)
	if pl.Host != "10.244.0.1" {
		t.Errorf("plan host %q", pl.Host)
	}
	for _, want := range []string{
		"net/tcp-broker:10.244.0.1:4000",
		"net/tcp:10.244.0.1:5001", "net/tcp:10.244.0.1:3999", "net/tcp:10.244.0.1:4001", "net/tcp:10.244.0.1:10250", "net/tcp:10.244.0.1:443",
		"net/dns-udp:10.244.0.1:53", "net/dns-udp:10.244.0.1:5002",
		"net/tcp:127.0.0.1:3999", "net/dns-udp:127.0.0.1:53", "net/dns-resolv.conf",
	} {
		if !slices.Contains(ids, want) {
			t.Errorf("pod plan lacks %s", want)
		}
	}
	for _, not := range []string{"net/tcp-broker:127.0.0.1:4000", "net/non-loopback-interface", "net/route-out", "net/tcp:10.244.0.1:4000"} {
		if slices.Contains(ids, not) {
			t.Errorf("pod plan has %s", not)
		}
	}
	// The control: no BrokerHost, and a loopback one, are the loopback plan.
	for _, h := range []string{"", "127.0.0.1"} {
		cfg := Config{BrokerPort: 4000, BrokerHost: h}
		lp, err := buildPlan(cfg, "00")
		if err != nil {
			t.Fatal(err)
		}
		ids := planIDs(lp)
		if lp.Host != "" || !slices.Contains(ids, "net/non-loopback-interface") || !slices.Contains(ids, "net/route-out") || !slices.Contains(ids, "net/tcp-broker:127.0.0.1:4000") {
			t.Errorf("BrokerHost %q: plan host %q, ids %v", h, lp.Host, ids)
		}
	}
	for _, bad := range []string{"node.local", "0.0.0.0", "fe80::1%eth0", "224.0.0.1"} {
		cfg := Config{BrokerPort: 4000, BrokerHost: bad}
		if err := cfg.validate(4000); err == nil {
			t.Errorf("BrokerHost %q accepted", bad)
		}
	}
	// The helper takes a plan host only when it is a non-loopback address.
	for _, tt := range []struct {
		host string
		ok   bool
	}{{"10.244.0.1", true}, {"192.0.2.2", true}, {"127.0.0.1", false}, {"::1", false}, {"x", false}} {
		_, err := decodePlan(`{"v":1,"nonce":"00","host":"` + tt.host + `","probes":[]}`)
		if (err == nil) != tt.ok {
			t.Errorf("plan host %q: %v", tt.host, err)
		}
	}
}
