package sandbox

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"strconv"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/broker"
	"github.com/moat-sandbox/moat/policy"
)

// Lockfile-bound package registries (the policy's egress.packages): the
// broker serves /pkg/<kind>/ on its loopback port, admitting only what
// the lockfiles pin. The lockfiles are read here, once, when the sandbox
// starts (opened without following any symlink, openLockfile), checked
// against the digests the policy pins and parsed; a lockfile the
// workload edits later changes nothing in this run. The workload's npm
// is pointed at the broker:
//
//	npm_config_registry=http://127.0.0.1:PORT/pkg/npm/
//	npm_config_replace_registry_host=always   # every resolved URL goes to the broker
//	npm_config_audit=false                    # no advisory uploads (refused anyway)
//	npm_config_update_notifier=false          # npm's own version check is not pinned
//
// and the go command at the module proxy route:
//
//	GOPROXY=http://127.0.0.1:PORT/pkg/goproxy
//	GOSUMDB=off     # go.sum is the authority; the broker admits nothing else
//
// and pip at the PyPI route:
//
//	PIP_INDEX_URL=http://127.0.0.1:PORT/pkg/pypi/simple/
const npmRegistryPath = broker.PackagesPathPrefix + policy.PackageNPM + "/"

// packageEnv is the workload's npm and go variables for the policy's
// package grants.
func packageEnv(port int, pol *policy.Policy) []string {
	var env []string
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	for _, g := range pol.Egress.Packages {
		switch g.Kind {
		case policy.PackageNPM:
			env = append(env,
				"npm_config_registry="+base+npmRegistryPath,
				"npm_config_replace_registry_host=always",
				"npm_config_audit=false",
				"npm_config_update_notifier=false")
		case policy.PackageGoProxy:
			env = append(env, "GOPROXY="+base+broker.PackagesPathPrefix+policy.PackageGoProxy, "GOSUMDB=off")
		case policy.PackagePyPI:
			env = append(env, "PIP_INDEX_URL="+base+broker.PackagesPathPrefix+policy.PackagePyPI+"/simple/")
		}
	}
	return env
}

// readLockfiles reads and parses every lockfile of the policy's package
// grants. A lockfile whose sha256 the policy pins must have it; with
// lockfile_trust: workspace a notice saying that the workload controls
// what is admitted is written to notice.
func readLockfiles(pol *policy.Policy, notice io.Writer) (*broker.PackagesConfig, []audit.PackageLockfile, error) {
	var pins []broker.NPMPin
	var gopins []broker.GoPin
	var pypins []broker.PyPIPin
	var read []audit.PackageLockfile
	for i, g := range pol.Egress.Packages {
		if g.Kind != policy.PackageNPM && g.Kind != policy.PackageGoProxy && g.Kind != policy.PackagePyPI {
			return nil, nil, &RefusedError{Msg: fmt.Sprintf("egress.packages[%d]: kind %q is not served", i, g.Kind)}
		}
		for _, lf := range g.Lockfiles {
			data, err := openLockfile(lf, broker.MaxLockfileBytes)
			if err != nil {
				return nil, nil, &RefusedError{Msg: fmt.Sprintf("egress.packages[%d]: lockfile %s: %v", i, lf, err)}
			}
			sum := sha256.Sum256(data)
			got := hex.EncodeToString(sum[:])
			if want, ok := g.PinnedDigest(lf); ok && want != got {
				return nil, nil, &RefusedError{Msg: fmt.Sprintf("egress.packages[%d]: lockfile %s has sha256 %s, but the policy pins %s: it changed since the policy was written; review the change, then pin the new digest in lockfile_sha256", i, lf, got, want)}
			}
			if g.LockfileTrust == policy.TrustWorkspace && notice != nil {
				fmt.Fprintf(notice, "moat: egress.packages[%d]: lockfile_trust is workspace: %s (sha256 %s) decides which %s packages this run admits, and the workload may have written it\n", i, lf, got, g.Kind)
			}
			if g.Kind == policy.PackagePyPI {
				p, err := broker.ParseRequirements(lf, data)
				if err != nil {
					return nil, nil, &RefusedError{Msg: fmt.Sprintf("egress.packages[%d]: %v", i, err)}
				}
				pypins = append(pypins, p...)
				read = append(read, audit.PackageLockfile{Kind: g.Kind, Path: lf, SHA256: got, Pins: len(p), Trust: g.LockfileTrust})
				continue
			}
			if g.Kind == policy.PackageGoProxy {
				p, err := broker.ParseGoSum(lf, data)
				if err != nil {
					return nil, nil, &RefusedError{Msg: fmt.Sprintf("egress.packages[%d]: %v", i, err)}
				}
				gopins = append(gopins, p...)
				read = append(read, audit.PackageLockfile{Kind: g.Kind, Path: lf, SHA256: got, Pins: len(p), Trust: g.LockfileTrust})
				continue
			}
			p, err := broker.ParseNPMLockfile(lf, data)
			if err != nil {
				return nil, nil, &RefusedError{Msg: fmt.Sprintf("egress.packages[%d]: %v", i, err)}
			}
			pins = append(pins, p...)
			read = append(read, audit.PackageLockfile{Kind: g.Kind, Path: lf, SHA256: got, Pins: len(p), Trust: g.LockfileTrust})
		}
	}
	return &broker.PackagesConfig{Grants: pol.Egress.Packages, NPM: pins, Go: gopins, PyPI: pypins}, read, nil
}

// openPackages builds the broker's package route and journals each
// lockfile read (package.lockfile); nil (/pkg/ refused like any unknown
// path) when the policy grants no registry.
func (s *Session) openPackages(notice io.Writer) (*broker.Packages, error) {
	if len(s.pol.Egress.Packages) == 0 {
		return nil, nil
	}
	cfg, read, err := readLockfiles(s.pol, notice)
	if err != nil {
		return nil, err
	}
	for _, r := range read {
		if _, err := s.w.Append(r); err != nil {
			return nil, fmt.Errorf("journal: %w", err)
		}
	}
	cfg.BaseURL, cfg.Dial = "http://127.0.0.1:"+strconv.Itoa(s.BrokerPort), newEgressGuard().DialContext
	pk, err := broker.NewPackages(*cfg)
	if err != nil {
		return nil, &RefusedError{Msg: err.Error()}
	}
	return pk, nil
}
