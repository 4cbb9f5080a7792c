package policy

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/moat-sandbox/moat/internal/strictjson"
)

// Derived is what the printed effective policy adds to the policy: values
// that moat decides from the host when the run starts. It is not part of
// the policy: CanonicalJSON and SHA256 leave it out, and Parse never reads
// it.
type Derived struct {
	Process DerivedProcess `json:"process"`
}

// DerivedProcess holds the derived values of the process section.
type DerivedProcess struct {
	// HostIDs are the host uid and gid of the workload when moat runs as
	// root; rootless, the workload runs as the caller.
	HostIDs HostIDs `json:"host_ids"`
	Note    string  `json:"note"`
}

// hostIDsNote says when the host ids apply.
const hostIDsNote = "host_uid and host_gid apply when moat runs as root; rootless, the workload runs as the caller's own uid and gid"

// policyFields is Policy without its methods: its JSON has no derived
// values.
type policyFields Policy

// MarshalJSON encodes the policy's fields plus "derived", the values moat
// decides at run time (process.host_uid and host_gid when they are not
// set, with how). The derived member is not part of the policy and is left
// out of CanonicalJSON.
func (p Policy) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		*policyFields
		Derived Derived `json:"derived"`
	}{(*policyFields)(&p), Derived{Process: DerivedProcess{HostIDs: p.HostIDsAsRoot(), Note: hostIDsNote}}})
}

// JSON returns the effective policy as indented JSON (sizes in bytes),
// with the derived values (see MarshalJSON).
func (p *Policy) JSON() ([]byte, error) {
	b, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("policy: encode JSON: %w", err)
	}
	return append(b, '\n'), nil
}

// YAML returns the effective policy as YAML that Parse reads back to the
// same policy (every path absolute, sizes as 64Mi). The host ids that moat
// derives when process.host_uid or host_gid is not set are printed as
// comments in the process section, with how they were derived.
func (p *Policy) YAML() ([]byte, error) {
	var doc yaml.Node
	if err := doc.Encode(p); err != nil {
		return nil, fmt.Errorf("policy: encode YAML: %w", err)
	}
	commentHostIDs(&doc, p)
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return nil, fmt.Errorf("policy: encode YAML: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("policy: encode YAML: %w", err)
	}
	return buf.Bytes(), nil
}

// commentHostIDs puts the derived host ids, as comments, above the key
// that follows gid (and host_uid/host_gid when set) in the process mapping.
func commentHostIDs(doc *yaml.Node, p *Policy) {
	if doc.Kind != yaml.MappingNode || len(doc.Content) == 0 {
		return
	}
	h := p.HostIDsAsRoot()
	var lines []string
	switch {
	case h.Err != "":
		lines = append(lines, "host_uid, host_gid: cannot be derived here: "+h.Err)
	default:
		if p.Process.HostUID == 0 {
			lines = append(lines, fmt.Sprintf("host_uid: %d   (derived: %s)", h.UID, h.UIDFrom))
		}
		if p.Process.HostGID == 0 {
			lines = append(lines, fmt.Sprintf("host_gid: %d   (derived: %s)", h.GID, h.GIDFrom))
		}
	}
	lines = append(lines, hostIDsNote)
	for i := 0; i+1 < len(doc.Content); i += 2 {
		if doc.Content[i].Value != "process" || doc.Content[i+1].Kind != yaml.MappingNode {
			continue
		}
		proc := doc.Content[i+1].Content
		at := -1
		for j := 0; j+1 < len(proc); j += 2 {
			switch proc[j].Value {
			case "gid", "host_uid", "host_gid":
				at = j + 2
			}
		}
		if at >= 0 && at < len(proc) {
			proc[at].HeadComment = strings.Join(lines, "\n")
		}
	}
}

// CanonicalJSON returns the RFC 8785 canonical JSON of the effective
// policy: its fields as JSON prints them, without the derived values.
func (p *Policy) CanonicalJSON() ([]byte, error) {
	b, err := json.Marshal((*policyFields)(p))
	if err != nil {
		return nil, fmt.Errorf("policy: encode JSON: %w", err)
	}
	c, err := strictjson.Canonicalize(b)
	if err != nil {
		return nil, fmt.Errorf("policy: canonicalize: %w", err)
	}
	return c, nil
}

// SHA256 returns the hex sha256 of CanonicalJSON. A policy made only of
// strings, integers and booleans always encodes; failure is a BUG and
// returns "BUG: …" instead of a digest.
func (p *Policy) SHA256() string {
	c, err := p.CanonicalJSON()
	if err != nil {
		return "BUG:" + err.Error()
	}
	sum := sha256.Sum256(c)
	return hex.EncodeToString(sum[:])
}
