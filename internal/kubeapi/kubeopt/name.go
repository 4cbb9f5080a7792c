package kubeopt

import "strings"

// ObjectName is the name the kubernetes backend gives a run's Pod and
// NetworkPolicy: "moat-" and the run id, lower case, every other
// character '-', at most 63 bytes (a DNS label and a label value),
// without a trailing '-'. The backend, conformance and evidence all name
// and find a run's objects through it, so the rule has one home.
func ObjectName(runID string) string {
	n := "moat-" + strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			return r
		case r >= 'A' && r <= 'Z':
			return r + 'a' - 'A'
		}
		return '-'
	}, runID)
	if len(n) > 63 {
		n = n[:63]
	}
	return strings.TrimRight(n, "-")
}
