package k8sext

import (
	"testing"

	"github.com/moat-sandbox/moat/boundary/kubernetes"
	"github.com/moat-sandbox/moat/internal/kubeapi/kubeopt"
)

// The suites tell the user where the image must hold the binary under
// test (kubeopt, which the lean moat links); the backend runs its helpers
// from there. One path.
func TestMoatInImage(t *testing.T) {
	if kubeopt.MoatInImage != kubernetes.MoatInImage {
		t.Fatalf("kubeopt.MoatInImage %q, boundary/kubernetes.MoatInImage %q", kubeopt.MoatInImage, kubernetes.MoatInImage)
	}
}

// The extension carries the backend, its five helpers and the suites'
// cluster client.
func TestExtension(t *testing.T) {
	e := Extension()
	if len(e.Backends) != 1 || e.Backends[0].Name() != "kubernetes" || len(e.Helpers) != 5 || e.Cluster == nil {
		t.Fatalf("extension: %d backends, %d helpers, cluster %v", len(e.Backends), len(e.Helpers), e.Cluster != nil)
	}
}
