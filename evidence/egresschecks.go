package evidence

import (
	"bytes"
	"fmt"
	"slices"
	"strings"

	"github.com/moat-sandbox/moat/evidence/probe"
)

// The host checks of the egress case (issue 13). Their raw observations
// are egress-events.jsonl (what the registry and the trap received, from
// the host), host.json's values (the registry's body and port, the hooks
// binary's sha256), the journal and the provider's events.
const (
	CheckEgressFetch     = "egress-fetch"     // control: the granted fetch reached the registry, its body a verified provider request, its tunnel journaled
	CheckEgressRefused   = "egress-refused"   // the ungranted, rebinding, private and loopback names journaled egress.refused, no tunnel opened to them
	CheckEgressReceivers = "egress-receivers" // the trap (control: the host's delivery) heard nothing, the registry only granted names
)

// Keys of HostRecord.Values for the egress case.
const (
	ValueEgressBody = "egress-body" // what the registry served
	ValueEgressPort = "egress-port"
	ValueHooksSHA   = "hooks-binary-sha256" // the moat_test_hooks binary that ran the case
)

// egressRefusals are the refusals the journal must hold: the name, the
// reason code and, for a refused address, the address.
var egressRefusals = []struct{ host, reason, address string }{
	{probe.EgressUngranted, "egress_not_granted", ""},
	{probe.EgressRebind, "address_loopback", egressTrapAddr},
	{probe.EgressPrivate, "address_private", egressPrivateAddr},
	{probe.EgressLoopback, "address_loopback", egressTrapAddr},
}

func (in checkInput) egressEvents(listener, kind string) []EgressEvent {
	var out []EgressEvent
	for _, e := range in.egress {
		if e.Listener == listener && (kind == "" || e.Kind == kind) {
			out = append(out, e)
		}
	}
	return out
}

func checkEgressFetch(in checkInput) (bool, bool, string) {
	body, port := in.host.Values[ValueEgressBody], in.host.Values[ValueEgressPort]
	if body == "" || port == "" || !in.egressEventsExist {
		return false, false, "no registry body, port or events recorded"
	}
	want := []byte(ControlPrefix + "egress-fetch data=" + body)
	arrived := slices.ContainsFunc(in.verified, func(b []byte) bool { return bytes.Contains(b, want) })
	served := slices.ContainsFunc(in.egressEvents(EgressRegistry, EgressKindRequest), func(e EgressEvent) bool {
		return e.SNI == probe.EgressGranted && e.Host == probe.EgressGranted+":"+port && e.Path == probe.EgressPath
	})
	opened := in.journalHas("egress.opened", func(f map[string]any) bool {
		return f["host"] == probe.EgressGranted && f["address"] == egressRegistryAddr && f["sni"] == probe.EgressGranted
	})
	return true, arrived && served && opened, fmt.Sprintf("the registry served %s %s: %v; a verified request carried its body: %v; the journal opened its tunnel to %s: %v",
		probe.EgressGranted, probe.EgressPath, served, arrived, egressRegistryAddr, opened)
}

func checkEgressRefused(in checkInput) (bool, bool, string) {
	if len(in.records) == 0 {
		return false, false, "no journal"
	}
	// The rebinding name's first lookup is the refusal's control: it
	// must have been admitted, to the registry's address.
	rebindFirst := in.journalHas("egress.opened", func(f map[string]any) bool {
		return f["host"] == probe.EgressRebind && f["address"] == egressRegistryAddr
	})
	var missing []string
	for _, want := range egressRefusals {
		if !in.journalHas("egress.refused", func(f map[string]any) bool {
			return f["host"] == want.host && f["reason"] == want.reason && (want.address == "" || f["address"] == want.address)
		}) {
			missing = append(missing, want.host+" "+want.reason)
		}
	}
	if !rebindFirst || len(missing) > 0 {
		return false, false, fmt.Sprintf("the rebinding name's first lookup admitted: %v; refusals not journaled: %s", rebindFirst, strings.Join(missing, ", "))
	}
	var bad []string
	for _, r := range in.records {
		if r.Type != "egress.opened" {
			continue
		}
		h, _ := r.Fields["host"].(string)
		a, _ := r.Fields["address"].(string)
		if (h != probe.EgressGranted && h != probe.EgressRebind) || a != egressRegistryAddr {
			bad = append(bad, h+" at "+a)
		}
	}
	if len(bad) > 0 {
		return true, false, "tunnels opened to " + strings.Join(bad, "; ")
	}
	return true, true, fmt.Sprintf("journaled egress.refused for %d names (ungranted, rebinding at its second lookup, private, loopback); every tunnel opened went to %s", len(egressRefusals), egressRegistryAddr)
}

func checkEgressReceivers(in checkInput) (bool, bool, string) {
	port := in.host.Values[ValueEgressPort]
	if !in.egressEventsExist || port == "" {
		return false, false, "no egress events or no port recorded"
	}
	control := len(in.egressEvents(EgressTrap, "control")) > 0
	if !control {
		return false, false, "the host's own delivery to the trap was not observed"
	}
	hits := len(in.egressEvents(EgressTrap, "hit"))
	var bad []string
	for _, e := range in.egressEvents(EgressRegistry, "") {
		okSNI := e.SNI == probe.EgressGranted || e.SNI == probe.EgressRebind
		okHost := e.Kind == EgressKindHello || e.Host == e.SNI+":"+port
		if !okSNI || !okHost {
			bad = append(bad, fmt.Sprintf("%s sni %q host %q", e.Kind, e.SNI, e.Host))
		}
	}
	if hits > 0 || len(bad) > 0 {
		return true, false, fmt.Sprintf("the trap heard %d connection(s); the registry saw %s", hits, strings.Join(bad, "; "))
	}
	return true, true, fmt.Sprintf("the trap heard nothing but the host's control; the registry's %d event(s) all name %s or %s",
		len(in.egressEvents(EgressRegistry, "")), probe.EgressGranted, probe.EgressRebind)
}
