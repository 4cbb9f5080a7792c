//go:build linux

package kubernetes

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/internal/k8stest"
	"github.com/moat-sandbox/moat/internal/kubeapi"
	"github.com/moat-sandbox/moat/policy"
)

// clusterSandbox is a sandbox's Pod (buildPod) on the test cluster, with
// moat's image, without the rest of Prepare: the tests here drive the
// exec path alone.
func clusterSandbox(t *testing.T) *sandbox {
	t.Helper()
	c := k8stest.Need(t)
	ns := c.Namespace(t, "moat-k8s-exec")
	pol, err := policy.Parse([]byte("version: 1\nbackend: kubernetes\nkubernetes: {image: "+c.Image+", namespace: "+ns+", runtime_class_name: "+c.RuntimeClass+"}\n"), "")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := kubeapi.Config(c.Kubeconfig, false)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubeapi.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pod, err := buildPod(pol, podSpec{Name: "moat-exec", UID: 65532, GID: 65532})
	if err != nil {
		t.Fatal(err)
	}
	pod.Spec.Containers[0].ImagePullPolicy = "Never"
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	made, err := cs.CreatePod(ctx, ns, pod)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.DeletePod(context.Background(), ns, made.Name, metav1.DeleteOptions{}) })
	s := &sandbox{pol: pol, cs: cs, cfg: cfg, ns: ns, name: made.Name, uid: made.UID, gone: make(chan struct{}), stopWatch: make(chan struct{})}
	if err := s.waitRunning(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestClusterExecEnvOnStdin (red team F11) on the test cluster: the
// workload in the Pod sees the environment that moat sent over the
// exec's stdin, with the caller's stdin after it, /dev/null without one,
// and on a terminal (the exec's command carries none of it:
// TestExecCommandCarriesNoSecret checks the requests themselves).
func TestClusterExecEnvOnStdin(t *testing.T) {
	s := clusterSandbox(t)
	var k [16]byte
	rand.Read(k[:])
	key := "mk-" + hex.EncodeToString(k[:])
	env := []string{"PATH=/bin:/usr/local/bin", "MOAT_BROKER_KEY=" + key}
	script := `printf '%s|%s|' "$MOAT_BROKER_KEY" "$PWD"; cat; printf '|end'`
	for _, tt := range []struct {
		name  string
		stdin []byte
	}{
		{"stdin", []byte("the workload's own stdin\n")},
		{"no stdin", nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			p := boundary.Process{Argv: []string{"/bin/sh", "-c", script}, Env: env, Dir: "/tmp", Stdout: &out, Stderr: &errb}
			if tt.stdin != nil {
				p.Stdin = bytes.NewReader(tt.stdin)
			}
			r, err := s.Start(context.Background(), p)
			if err != nil {
				t.Fatal(err)
			}
			if code := waitCode(t, r); code != 0 {
				t.Fatalf("exit %d: %s", code, errb.String())
			}
			if want := key + "|/tmp|" + string(tt.stdin) + "|end"; out.String() != want {
				t.Errorf("the workload printed %q, want %q (stderr %q)", out.String(), want, errb.String())
			}
		})
	}
	t.Run("tty", func(t *testing.T) {
		master, slave := openPTY(t)
		r, err := s.Start(context.Background(), boundary.Process{Argv: []string{"/bin/sh", "-c", `printf '%s|done\n' "$MOAT_BROKER_KEY"`}, Env: env, Dir: "/", TTY: slave})
		if err != nil {
			t.Fatal(err)
		}
		slave.Close()
		got := readUntil(master, "|done")
		if code := waitCode(t, r); code != 0 {
			t.Fatalf("exit %d", code)
		}
		select {
		case s := <-got:
			if !strings.Contains(s, key+"|done") {
				t.Errorf("the terminal showed %q, want the key", s)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("nothing on the terminal")
		}
	})
}
