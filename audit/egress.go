package audit

import (
	"fmt"
	"strconv"
)

// Egress tunnel records (issue 13, egress.hosts). A CONNECT on the egress
// port that the broker admits is journaled as egress.opened, durable
// before the broker dials, and closed by exactly one egress.closed with
// the same tunnel_id. A CONNECT the broker does not admit is journaled as
// egress.refused and nothing is dialled. See the package doc for the
// members, byte by byte.
const (
	TypeEgressOpened  = "egress.opened"
	TypeEgressClosed  = "egress.closed"
	TypeEgressRefused = "egress.refused"
)

// EgressOpened is the pre-effect record of one tunnel.
type EgressOpened struct {
	TunnelID string `json:"tunnel_id"` // "moattun_" and 24 hex digits, unique in the run
	Host     string `json:"host"`      // the CONNECT host, canonical (lower case; an IPv6 literal in brackets)
	Port     int    `json:"port"`
	Grant    string `json:"grant"`   // the egress.hosts entry that admitted it, "host:port"
	Address  string `json:"address"` // the one resolved, checked address that is dialled
	SNI      string `json:"sni"`     // the ClientHello's server name, equal to host
	// Attribution is the process that made the connection to the egress
	// port.
	Attribution Attribution `json:"attribution"`
}

// EgressClosed closes an egress.opened.
type EgressClosed struct {
	TunnelID string `json:"tunnel_id"`
	// BytesToHost counts the bytes relayed from the workload to the host
	// (the ClientHello included), BytesToWorkload the reverse.
	BytesToHost     int64  `json:"bytes_to_host"`
	BytesToWorkload int64  `json:"bytes_to_workload"`
	DurationMS      int64  `json:"duration_ms"` // from the record of egress.opened to the close
	Reason          string `json:"reason"`      // why it ended (closed, idle_timeout, max_duration, byte_budget, dial_failed, run_ended)
	Detail          string `json:"detail,omitempty"`
}

// EgressRefused records a CONNECT that was not admitted: nothing was
// dialled. The workload was answered 403 with Detail.
type EgressRefused struct {
	TunnelID    string      `json:"tunnel_id"`
	Host        string      `json:"host,omitempty"` // as the broker quotes client values
	Port        int         `json:"port,omitempty"`
	SNI         string      `json:"sni,omitempty"`
	Address     string      `json:"address,omitempty"` // the refused address, when resolution refused it
	Reason      string      `json:"reason"`
	Detail      string      `json:"detail"`
	Attribution Attribution `json:"attribution"`
}

func (EgressOpened) RecordType() string  { return TypeEgressOpened }
func (EgressClosed) RecordType() string  { return TypeEgressClosed }
func (EgressRefused) RecordType() string { return TypeEgressRefused }

func init() {
	recordTypes[TypeEgressOpened] = decodeAs[EgressOpened]
	recordTypes[TypeEgressClosed] = decodeAs[EgressClosed]
	recordTypes[TypeEgressRefused] = decodeAs[EgressRefused]
}

// describeEgress is Describe for the egress records.
func describeEgress(r Record) string {
	switch r := r.(type) {
	case EgressOpened:
		return fmt.Sprintf("tunnel=%s %s:%d grant=%s address=%s sni=%s %s", r.TunnelID, r.Host, r.Port, r.Grant, r.Address, r.SNI, describeAttribution(r.Attribution))
	case EgressClosed:
		s := fmt.Sprintf("tunnel=%s reason=%s to_host=%d to_workload=%d duration_ms=%d", r.TunnelID, r.Reason, r.BytesToHost, r.BytesToWorkload, r.DurationMS)
		if r.Detail != "" {
			s += " detail=" + strconv.Quote(r.Detail)
		}
		return s
	case EgressRefused:
		s := fmt.Sprintf("tunnel=%s reason=%s host=%s port=%d", r.TunnelID, r.Reason, strconv.Quote(r.Host), r.Port)
		if r.SNI != "" {
			s += " sni=" + strconv.Quote(r.SNI)
		}
		if r.Address != "" {
			s += " address=" + r.Address
		}
		return s + " " + describeAttribution(r.Attribution) + " detail=" + strconv.Quote(r.Detail)
	}
	return fmt.Sprintf("BUG: not an egress record %T", r)
}
