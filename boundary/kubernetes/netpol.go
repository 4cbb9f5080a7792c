package kubernetes

import (
	"context"
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// checkOtherPolicies refuses a sandbox whose Pod another NetworkPolicy
// of the namespace selects and that allows anything (an egress or an
// ingress rule). NetworkPolicies add up: a namespace's "allow egress
// except the node" would give the Pod every destination but the one
// host the measurement can probe (the broker's), and the sandbox would
// reach Ready with egress open. A policy that selects the Pod and allows
// nothing (a namespace's default deny) only narrows, and is accepted.
// This refuses; it never authorizes (the measurement decides). A policy
// made after this check, or an admin's cluster-wide policy that this API
// does not show, is not seen (README: not re-measured).
func (s *sandbox) checkOtherPolicies(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	l, err := s.cs.ListNetworkPolicies(ctx, s.ns, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("kubernetes: listing the NetworkPolicies of namespace %s (another one could allow the Pod more than moat's): %w", s.ns, err)
	}
	podLabels := labels.Set{RunLabel: s.name}
	var others []string
	for i := range l.Items {
		np := &l.Items[i]
		if np.Name == s.name {
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		if err != nil {
			others = append(others, np.Name+" (its podSelector cannot be read: "+err.Error()+")")
			continue
		}
		if sel.Matches(podLabels) && (len(np.Spec.Egress) > 0 || len(np.Spec.Ingress) > 0) {
			others = append(others, np.Name)
		}
	}
	if len(others) > 0 {
		return fmt.Errorf("kubernetes: NetworkPolicy %s of namespace %s also selects the sandbox's Pod and allows traffic; NetworkPolicies add up, so it may open egress that moat's measurement (which can probe only the broker's host) would not see; run sandboxes in a namespace where no other NetworkPolicy allowing traffic selects them", strings.Join(others, ", "), s.ns)
	}
	return nil
}
