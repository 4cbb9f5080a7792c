// Package confirmation holds the values that a boundary confirmation
// produces and that the journal records: the measured properties of a
// sandbox, the individual checks behind them, the status of its resource
// limits, and the attribution of a broker connection to a process.
//
// It is a leaf: it imports only the standard library. Two packages share
// these types and neither may depend on the other's world. The journal
// format (package audit) and its offline verifier must not link the
// backend contract (package boundary, which brings the policy and its YAML
// parser), and the backends must not link the journal's signing and JSON
// machinery. So the types live below both, as x/mod's note lives below
// sumdb; boundary and audit re-export them under their old names with type
// aliases, and their JSON names are part of the journal format that
// package audit specifies (a change here is a change of that format).
//
// A dependency test (deps_test.go at the module root) keeps it a leaf.
package confirmation

// EnforcedProperty is a security property established before untrusted
// code runs.
type EnforcedProperty struct {
	Enforced  bool   `json:"enforced"`  // measured by attempting a violation, never configured
	Mechanism string `json:"mechanism"` // diagnostic and audit only; never authorizes
	Detail    string `json:"detail,omitempty"`
	// Unavailable is set when the backend declares the property cannot be
	// provided at all (request attribution on an endpoint-only backend).
	// It is never treated as enforced.
	Unavailable bool `json:"unavailable,omitempty"`
}

// Properties are the four properties every backend must establish.
type Properties struct {
	FilesystemConfinement EnforcedProperty `json:"filesystem_confinement"`
	EgressInterception    EnforcedProperty `json:"egress_interception"`
	RequestAttribution    EnforcedProperty `json:"request_attribution"`
	PrivilegeFloor        EnforcedProperty `json:"privilege_floor"`
}

// Named returns the properties with their wire names, in a fixed order.
func (p *Properties) Named() []NamedProperty {
	return []NamedProperty{
		{"filesystem_confinement", &p.FilesystemConfinement},
		{"egress_interception", &p.EgressInterception},
		{"request_attribution", &p.RequestAttribution},
		{"privilege_floor", &p.PrivilegeFloor},
	}
}

// NamedProperty pairs a property with its wire name.
type NamedProperty struct {
	Name string
	*EnforcedProperty
}

// Check is one attempted action of the boundary measurement: a violation
// tried or a positive control, and what came of it.
type Check struct {
	Property string `json:"property"`
	Name     string `json:"name"`
	Kind     string `json:"kind"` // violation | control
	// OK is true when the outcome is the safe one: a violation that
	// failed, a control that succeeded.
	OK      bool   `json:"ok"`
	Outcome string `json:"outcome"` // succeeded | failed | error | missing
	Detail  string `json:"detail,omitempty"`
}

// LimitsStatus says which resource limits hold, and why not where not.
type LimitsStatus struct {
	Memory    bool `json:"memory"`
	Pids      bool `json:"pids"`
	OpenFiles bool `json:"open_files"`
	// Disk is whether the workload's disk use in its read_write grants is
	// limited; DiskDetail says why or why not, always.
	Disk       bool   `json:"disk"`
	DiskDetail string `json:"disk_detail"`
	Detail     string `json:"detail,omitempty"`
}

// AttributionStatus says whether a broker connection was attributed to a
// process. The zero value is invalid, and everything that asks whether a
// connection was attributed asks for AttributionResolved, so an unset
// status never counts as attributed.
type AttributionStatus string

// Attribution statuses.
const (
	// AttributionResolved: the connection was made by the process that
	// PID, Executable and SHA256 name.
	AttributionResolved AttributionStatus = "resolved"
	// AttributionUnavailable: the connection could not be attributed;
	// Reason says why.
	AttributionUnavailable AttributionStatus = "unavailable"
)

// Attribution identifies the process behind a broker connection, or says
// why it cannot.
type Attribution struct {
	Status     AttributionStatus `json:"status"`
	PID        int               `json:"pid,omitempty"`
	Executable string            `json:"executable,omitempty"`
	SHA256     string            `json:"sha256,omitempty"`
	Reason     string            `json:"reason,omitempty"`
}
