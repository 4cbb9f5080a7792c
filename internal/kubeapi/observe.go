package kubeapi

import (
	"context"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// What the suites (evidence, conformance) observe of a run in the
// cluster: the backend names a run's Pod and NetworkPolicy alike.

// PodLive reports whether the Pod exists and is not being deleted.
func PodLive(ctx context.Context, c Interface, ns, name string) (bool, error) {
	p, err := c.GetPod(ctx, ns, name)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return p.DeletionTimestamp == nil, nil
}

// ObjectsLeft lists the Pod and the NetworkPolicy of that name that still
// exist in the namespace, as "pod/NAME" and "networkpolicy/NAME". Any
// error but NotFound is returned: an object moat cannot see is never
// reported gone.
func ObjectsLeft(ctx context.Context, c Interface, ns, name string) ([]string, error) {
	var left []string
	if _, err := c.GetPod(ctx, ns, name); err == nil {
		left = append(left, "pod/"+name)
	} else if !apierrors.IsNotFound(err) {
		return nil, err
	}
	if _, err := c.GetNetworkPolicy(ctx, ns, name); err == nil {
		left = append(left, "networkpolicy/"+name)
	} else if !apierrors.IsNotFound(err) {
		return nil, err
	}
	return left, nil
}
