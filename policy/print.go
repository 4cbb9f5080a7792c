package policy

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	"go.yaml.in/yaml/v3"

	"github.com/moat-sandbox/moat/internal/strictjson"
)

// JSON returns the effective policy as indented JSON (sizes in bytes).
func (p *Policy) JSON() ([]byte, error) {
	b, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("policy: encode JSON: %w", err)
	}
	return append(b, '\n'), nil
}

// YAML returns the effective policy as YAML that Parse reads back to the
// same policy (every path absolute, sizes as 64Mi).
func (p *Policy) YAML() ([]byte, error) {
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(p); err != nil {
		return nil, fmt.Errorf("policy: encode YAML: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("policy: encode YAML: %w", err)
	}
	return buf.Bytes(), nil
}

// CanonicalJSON returns the RFC 8785 canonical JSON of the effective policy.
func (p *Policy) CanonicalJSON() ([]byte, error) {
	b, err := json.Marshal(p)
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
