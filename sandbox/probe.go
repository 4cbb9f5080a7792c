package sandbox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/boundary/measure"
	"github.com/moat-sandbox/moat/policy"
)

// ProbeResult says whether a backend reaches Ready on this host.
type ProbeResult struct {
	Backend    string                `json:"backend"`
	Ready      bool                  `json:"ready"`
	Reason     string                `json:"reason,omitempty"`
	Properties boundary.Properties   `json:"properties"`
	Limits     boundary.LimitsStatus `json:"limits"`
}

// Probe prepares a throwaway sandbox with the built-in default policy (a
// fresh temporary workspace), confirms it by measurement, and tears it down.
// Nothing but moat's own measurement runs inside.
func Probe(ctx context.Context, backend string) ProbeResult {
	res := ProbeResult{Backend: backend}
	be, err := boundary.Lookup(backend)
	if err != nil {
		res.Reason = err.Error()
		return res
	}
	tmp, err := os.MkdirTemp("", "moat-doctor-")
	if err != nil {
		res.Reason = err.Error()
		return res
	}
	defer os.RemoveAll(tmp)
	os.Chmod(tmp, 0o755)
	ws := filepath.Join(tmp, "workspace")
	state := filepath.Join(tmp, "state")
	for _, d := range []string{ws, state} {
		if err := os.Mkdir(d, 0o700); err != nil {
			res.Reason = err.Error()
			return res
		}
	}
	// A throwaway workspace any backend's workload uid may write (native
	// maps to the owner or 65534, gVisor runs as the policy's uid).
	os.Chmod(ws, 0o777)
	pol := policy.Default()
	pol.Backend = backend
	pol.Filesystem.ReadWrite = []string{ws}
	pol.Process.Workdir = ws
	if os.Geteuid() == 0 {
		uid, gid, err := pol.ResolveHostIDs(0)
		if err == nil {
			os.Chown(ws, uid, gid)
		}
	}
	sb, err := be.Prepare(ctx, boundary.Spec{RunID: "doctor-" + NewRunID(), Policy: pol, StateDir: state})
	if err != nil {
		res.Reason = fmt.Sprintf("prepare: %v", err)
		return res
	}
	defer sb.Terminate()
	res.Limits = sb.Limits()
	li, err := sb.Listener()
	if err != nil {
		res.Reason = fmt.Sprintf("listener: %v", err)
		return res
	}
	secrets, err := hostSecrets(state, pol)
	if err != nil {
		res.Reason = err.Error()
		return res
	}
	props, _, err := measure.Confirm(ctx, sb, measure.Config{
		BrokerPort: li.Port, ReadWrite: pol.Filesystem.ReadWrite, ReadOnly: pol.Filesystem.ReadOnly,
		HostSecrets: secrets,
	})
	li.File.Close()
	res.Properties = props
	if err != nil {
		res.Reason = fmt.Sprintf("confirm: %v", err)
		return res
	}
	if err := boundary.Ready(props, boundary.Requirements{}); err != nil {
		res.Reason = err.Error()
		return res
	}
	res.Ready = true
	return res
}
