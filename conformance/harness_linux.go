package conformance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/internal/fakeprovider"
	"github.com/moat-sandbox/moat/internal/fsutil"
	"github.com/moat-sandbox/moat/internal/kubeapi/kubeopt"
	"github.com/moat-sandbox/moat/internal/runinfo"
)

// harness is one scenario's world: a directory with a workspace, a tools
// directory holding a copy of the moat binary (the in-sandbox probe), an
// audit directory and a policy.
type harness struct {
	bin, backend string
	dir          string
	workspace    string
	tools        string
	probe        string // tools/moat
	auditDir     string
	stateDir     string
	provider     *fakeprovider.Server
	cleanup      []func()
	k8s          *Kubernetes // --backend kubernetes only
	k8sClient    kubeopt.Cluster
}

const (
	runTimeout    = 90 * time.Second
	providerModel = "conformance-model"
	credEnv       = "MOAT_CONFORMANCE_PROVIDER_KEY"
	credValue     = "conformance-synthetic-credential"
)

func newHarness(bin, backend string, k8s *Kubernetes) (*harness, error) {
	dir, err := os.MkdirTemp("", "moat-conformance-")
	if err != nil {
		return nil, err
	}
	os.Chmod(dir, 0o755)
	h := &harness{bin: bin, backend: backend, dir: dir,
		workspace: filepath.Join(dir, "workspace"), tools: filepath.Join(dir, "tools"),
		auditDir: filepath.Join(dir, "audit"), stateDir: filepath.Join(dir, "state")}
	if backend == "kubernetes" {
		h.k8s = k8s
	}
	for _, d := range []string{h.workspace, h.tools} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return nil, err
		}
	}
	// The workload's uid differs by backend and by whether moat runs as
	// root; a world-writable workspace owned by the uid that the native
	// backend maps to as root serves them all.
	os.Chmod(h.workspace, 0o777)
	if os.Geteuid() == 0 {
		os.Chown(h.workspace, 65534, 65534)
	}
	h.probe = filepath.Join(h.tools, "moat")
	if err := fsutil.CopyFile(bin, h.probe, 0o755); err != nil {
		return nil, err
	}
	h.provider, err = fakeprovider.Start(fakeprovider.Options{})
	if err != nil {
		return nil, err
	}
	return h, nil
}

func (h *harness) close() {
	for i := len(h.cleanup) - 1; i >= 0; i-- {
		h.cleanup[i]()
	}
	h.provider.Close()
	os.RemoveAll(h.dir)
}

// policyFile writes the scenario's policy and returns its path.
func (h *harness) policyFile() (string, error) { return h.policyWith() }

// policyWith is policyFile with extra read-only grants.
func (h *harness) policyWith(readOnly ...string) (string, error) {
	return h.policyAt("policy.yaml", readOnly...)
}

// policyAt is policyWith written to the harness's file name.
func (h *harness) policyAt(name string, readOnly ...string) (string, error) {
	p := filepath.Join(h.dir, name)
	// The backend is chosen on the command line (--backend), which
	// overrides the policy's and never falls back.
	system := "/usr, /bin, /lib, /lib64, "
	if h.k8s != nil {
		// The Pod's system directories are the image's read-only root;
		// the grants are hostPath volumes, and the host's /usr would
		// hide the image's moat.
		system = ""
	}
	y := fmt.Sprintf(`version: 1
filesystem:
  read_only: [%s%s]
  read_write: [%s]
process:
  env: {PATH: /usr/bin:/bin}
inference:
  max_requests: 8
  providers:
    - name: conformance
      api: anthropic-messages
      base_url: http://127.0.0.1:%d
      credential_env: %s
      models: [%s]
audit:
  dir: %s
`, system, strings.Join(append([]string{h.tools}, readOnly...), ", "), h.workspace, h.provider.Port(), credEnv, providerModel, h.auditDir)
	if h.k8s != nil {
		y += h.kubernetesPolicy()
	}
	return p, os.WriteFile(p, []byte(y), 0o644)
}

// command prepares a moat command in the harness's environment.
func (h *harness) command(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, h.bin, args...)
	cmd.Dir = h.dir
	cmd.Env = append(os.Environ(), credEnv+"="+credValue, "MOAT_STATE_DIR="+h.stateDir)
	return cmd
}

// runOut is what a moat invocation printed.
type runOut struct {
	stdout, stderr string
	code           int
	runInfo        *runInfo
}

// runInfo is moat's --run-info file, the type moat writes it with.
type runInfo = runinfo.Info

// probeRun runs the probe with actions in the sandbox via `moat run`.
func (h *harness) probeRun(ctx context.Context, actions ...string) (*runOut, error) {
	pol, err := h.policyFile()
	if err != nil {
		return nil, err
	}
	return h.probeRunPolicy(ctx, pol, actions...)
}

// probeRunPolicy is probeRun under the policy file pol.
func (h *harness) probeRunPolicy(ctx context.Context, pol string, actions ...string) (*runOut, error) {
	ri := filepath.Join(h.dir, fmt.Sprintf("run-info-%d.json", time.Now().UnixNano()))
	ctx, cancel := context.WithTimeout(ctx, runTimeout)
	defer cancel()
	args := append([]string{"run", "--backend", h.backend, "--policy", pol, "--run-info", ri, "--", h.probe, ProbeHelper}, actions...)
	cmd := h.command(ctx, args...)
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	err := cmd.Run()
	out := &runOut{stdout: so.String(), stderr: se.String()}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		out.code = ee.ExitCode()
	} else if err != nil {
		return nil, err
	}
	if info, _, err := runinfo.Read(ri); err == nil {
		out.runInfo = &info
	}
	return out, nil
}

// result returns the probe's line for an action: ok, or the error text.
func (o *runOut) result(action string) (ok bool, detail string, found bool) {
	for _, l := range strings.Split(o.stdout, "\n") {
		if rest, cut := strings.CutPrefix(l, action+" "); cut {
			if rest == "ok" || strings.HasPrefix(rest, "ok ") {
				return true, strings.TrimPrefix(rest, "ok "), true
			}
			return false, strings.TrimPrefix(rest, "err "), true
		}
	}
	return false, "", false
}

// journal reads and verifies the run's journal against the key pinned
// from run-info.
func (o *runOut) journal() ([]*audit.Entry, audit.Result, error) {
	if o.runInfo == nil {
		return nil, audit.Result{}, fmt.Errorf("no run info")
	}
	pub, err := audit.ParsePublicKeyPEM([]byte(o.runInfo.PublicKeyPEM))
	if err != nil {
		return nil, audit.Result{}, err
	}
	b, err := os.ReadFile(o.runInfo.Journal)
	if err != nil {
		return nil, audit.Result{}, err
	}
	res := audit.Verify(b, pub)
	var ents []*audit.Entry
	for _, l := range bytes.Split(b, []byte("\n")) {
		if len(l) == 0 {
			continue
		}
		if e, err := audit.VerifyLine(l, pub); err == nil {
			ents = append(ents, e)
		}
	}
	return ents, res, nil
}
