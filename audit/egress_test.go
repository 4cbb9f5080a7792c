package audit

import (
	"bytes"
	"strings"
	"testing"
)

func egressRecords() []Record {
	attr := Attribution{Status: "resolved", PID: 4242, Executable: "/usr/bin/curl", SHA256: strings.Repeat("c", 64)}
	return []Record{
		EgressRefused{TunnelID: "moattun_000000000000000000000001", Host: "evil.test", Port: 443, Reason: "egress_not_granted",
			Detail: "moat: refused: evil.test:443 is not granted; add {host: evil.test, port: 443} to egress.hosts", Attribution: attr},
		EgressRefused{TunnelID: "moattun_000000000000000000000002", Host: "rebind.test", Port: 443, SNI: "rebind.test", Address: "127.0.0.2",
			Reason: "address_loopback", Detail: "moat: refused: rebind.test resolves to 127.0.0.2, which is not a global unicast address", Attribution: attr},
		EgressOpened{TunnelID: "moattun_000000000000000000000003", Host: "pypi.org", Port: 443, Grant: "pypi.org:443",
			Address: "151.101.0.223", SNI: "pypi.org", Attribution: attr},
		EgressClosed{TunnelID: "moattun_000000000000000000000003", BytesToHost: 1893, BytesToWorkload: 40213, DurationMS: 412, Reason: "closed"},
		EgressClosed{TunnelID: "moattun_000000000000000000000004", DurationMS: 3, Reason: "dial_failed", Detail: "connection refused"},
	}
}

// TestEgressRecords: egress records sign, verify complete, decode back to
// what was written, carry exactly the members the package doc lists (in
// that order) and count in no member of run.terminated; the timeline
// marks refusals.
func TestEgressRecords(t *testing.T) {
	j := checkRecords(t, recordsCase{
		records: egressRecords(),
		members: map[int]string{ // the records without their omitempty members
			0: "attribution,detail,host,port,reason,tunnel_id",
			2: "address,attribution,grant,host,port,sni,tunnel_id",
			3: "bytes_to_host,bytes_to_workload,duration_ms,reason,tunnel_id",
		},
	}).journal
	var tl bytes.Buffer
	WriteTimeline(&tl, j)
	out := tl.String()
	for _, want := range []string{
		`!! `, `REFUSED egress.refused`, `reason=egress_not_granted host="evil.test" port=443 pid=4242`,
		`sni="rebind.test" address=127.0.0.2`,
		`tunnel=moattun_000000000000000000000003 pypi.org:443 grant=pypi.org:443 address=151.101.0.223 sni=pypi.org pid=4242`,
		`reason=closed to_host=1893 to_workload=40213 duration_ms=412`,
		`reason=dial_failed to_host=0 to_workload=0 duration_ms=3 detail="connection refused"`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("timeline lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "BUG") {
		t.Errorf("timeline has a BUG line:\n%s", out)
	}
	// An unknown member is refused (decoding is strict).
	if _, err := recordTypes[TypeEgressClosed]([]byte(`{"tunnel_id":"x","bytes_to_host":1,"bytes_to_workload":1,"duration_ms":1,"reason":"closed","extra":1}`)); err == nil {
		t.Error("egress.closed with an unknown member decoded")
	}
}
