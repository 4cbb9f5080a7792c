package sandbox

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strconv"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/broker"
	"github.com/moat-sandbox/moat/broker/wire"
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

// Reasons of a refused package.reload (and causes of a refused start).
const (
	lockfileUnreadable = "lockfile_unreadable" // cannot be opened without following a symlink, or read
	lockfileUntrusted  = "lockfile_untrusted"  // fails the trust rule, or lockfile_sha256
	lockfileInvalid    = "lockfile_invalid"    // does not parse, or its pins conflict
)

// lockfileError is why the lockfiles cannot be used: a reason above and
// the message.
type lockfileError struct {
	Reason string
	Msg    string
}

func (e *lockfileError) Error() string { return e.Msg }

// readLockfiles reads and parses every lockfile of the policy's package
// grants, each by the lockfile trust rule: opened without following any
// symlink, the policy's trust rule (policy.LockfileUntrusted) applied
// again, and a sha256 the policy pins compared with the bytes read. With
// lockfile_trust: workspace a notice saying that the workload controls
// what is admitted is written to notice. read holds each lockfile read
// so far, also on error (with the digest of the one that failed, when
// its bytes were read).
func readLockfiles(pol *policy.Policy, notice io.Writer) (*broker.PackagesConfig, []audit.PackageLockfile, error) {
	var pins []broker.NPMPin
	var gopins []broker.GoPin
	var pypins []broker.PyPIPin
	var read []audit.PackageLockfile
	for i, g := range pol.Egress.Packages {
		if g.Kind != policy.PackageNPM && g.Kind != policy.PackageGoProxy && g.Kind != policy.PackagePyPI {
			return nil, read, &lockfileError{lockfileInvalid, fmt.Sprintf("egress.packages[%d]: kind %q is not served", i, g.Kind)}
		}
		for _, lf := range g.Lockfiles {
			rec := audit.PackageLockfile{Kind: g.Kind, Path: lf, Trust: g.LockfileTrust}
			if msg := pol.LockfileUntrusted(i, lf); msg != "" {
				return nil, append(read, rec), &lockfileError{lockfileUntrusted, fmt.Sprintf("egress.packages[%d]: %s", i, msg)}
			}
			data, err := openLockfile(lf, broker.MaxLockfileBytes)
			if err != nil {
				return nil, append(read, rec), &lockfileError{lockfileUnreadable, fmt.Sprintf("egress.packages[%d]: lockfile %s: %v", i, lf, err)}
			}
			sum := sha256.Sum256(data)
			rec.SHA256 = hex.EncodeToString(sum[:])
			if want, ok := g.PinnedDigest(lf); ok && want != rec.SHA256 {
				return nil, append(read, rec), &lockfileError{lockfileUntrusted, fmt.Sprintf("egress.packages[%d]: lockfile %s has sha256 %s, but the policy pins %s: it changed since the policy was written; review the change, then pin the new digest in lockfile_sha256", i, lf, rec.SHA256, want)}
			}
			if g.LockfileTrust == policy.TrustWorkspace && notice != nil {
				fmt.Fprintf(notice, "moat: egress.packages[%d]: lockfile_trust is workspace: %s (sha256 %s) decides which %s packages this run admits, and the workload may have written it\n", i, lf, rec.SHA256, g.Kind)
			}
			switch {
			case g.Kind == policy.PackagePyPI:
				parse := broker.ParseRequirements
				if filepath.Base(lf) == "uv.lock" {
					parse = broker.ParseUVLock
				}
				var p []broker.PyPIPin
				p, err = parse(lf, data)
				pypins, rec.Pins = append(pypins, p...), len(p)
			case g.Kind == policy.PackageGoProxy:
				var p []broker.GoPin
				p, err = broker.ParseGoSum(lf, data)
				gopins, rec.Pins = append(gopins, p...), len(p)
			default:
				var p []broker.NPMPin
				p, err = broker.ParseNPMLockfile(lf, data)
				pins, rec.Pins = append(pins, p...), len(p)
			}
			if err != nil {
				rec.Pins = 0
				return nil, append(read, rec), &lockfileError{lockfileInvalid, fmt.Sprintf("egress.packages[%d]: %v", i, err)}
			}
			read = append(read, rec)
		}
	}
	return &broker.PackagesConfig{Grants: pol.Egress.Packages, NPM: pins, Go: gopins, PyPI: pypins}, read, nil
}

// readPackages reads the lockfiles once, before run.started, which
// records their digests (Session.lockfiles); the broker's route is built
// from them later (openPackages). Nothing when the policy grants no
// registry.
func (s *Session) readPackages(notice io.Writer) error {
	if len(s.pol.Egress.Packages) == 0 {
		return nil
	}
	cfg, read, err := readLockfiles(s.pol, notice)
	if err != nil {
		return &RefusedError{Msg: err.Error()}
	}
	s.pkgCfg, s.lockfiles = cfg, read
	return nil
}

// openPackages builds the broker's package route from the lockfiles
// readPackages read; nil (/pkg/ refused like any unknown path) when the
// policy grants no registry.
func (s *Session) openPackages() (*broker.Packages, error) {
	if s.pkgCfg == nil {
		return nil, nil
	}
	cfg := *s.pkgCfg
	cfg.BaseURL, cfg.Dial = "http://127.0.0.1:"+strconv.Itoa(s.BrokerPort), newEgressGuard().DialContext
	pk, err := broker.NewPackages(cfg)
	if err != nil {
		return nil, &RefusedError{Msg: err.Error()}
	}
	s.pkgs = pk
	return pk, nil
}

// maxReloadDetail bounds a refused package.reload's detail.
const maxReloadDetail = 4096

// ReloadLockfiles re-reads the policy's lockfiles on an operator's
// explicit command (moat sandbox reload-lockfiles, through the
// supervisor's control socket; requester names the peer). Every lockfile
// is read by the rule of the start (readLockfiles); the package.reload
// record, with each lockfile's digest in force and the new one, is
// durable before the new pins take effect. Fail closed: a lockfile that
// cannot be read, fails the trust rule or does not parse, or pins that
// conflict, leave the set in force unchanged, journaled as refused, and
// are returned as the error.
func (s *Session) ReloadLockfiles(requester string) (audit.PackageReload, error) {
	rec := audit.PackageReload{Requester: requester}
	if s.pkgs == nil {
		return rec, errors.New("this sandbox's policy grants no package registry (egress.packages): there are no lockfiles to reload")
	}
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	cfg, read, rerr := readLockfiles(s.pol, nil)
	byPath := map[string]audit.PackageLockfile{}
	for _, r := range read {
		byPath[r.Path] = r
	}
	for _, old := range s.lockfiles {
		now := byPath[old.Path]
		rec.Lockfiles = append(rec.Lockfiles, audit.PackageLockfileChange{Kind: old.Kind, Path: old.Path, OldSHA256: old.SHA256,
			SHA256: now.SHA256, Pins: now.Pins, Trust: old.Trust})
	}
	refuse := func(reason string, err error) (audit.PackageReload, error) {
		rec.Outcome, rec.Reason, rec.Detail = audit.ReloadRefused, reason, wire.BoundTo(err.Error(), maxReloadDetail)
		for i := range rec.Lockfiles {
			rec.Lockfiles[i].Pins = 0
		}
		if _, jerr := s.w.Append(rec); jerr != nil {
			return rec, fmt.Errorf("the reload was refused (%v), and the journal failed: %w", err, jerr)
		}
		return rec, fmt.Errorf("refused, the lockfiles in force are unchanged: %w", err)
	}
	var le *lockfileError
	if errors.As(rerr, &le) {
		return refuse(le.Reason, rerr)
	} else if rerr != nil {
		return refuse(lockfileInvalid, rerr)
	}
	rec.Outcome = audit.ReloadApplied
	committed := false
	err := s.pkgs.Reload(*cfg, func() error {
		committed = true
		_, err := s.w.Append(rec)
		return err
	})
	switch {
	case err != nil && !committed:
		return refuse(lockfileInvalid, err)
	case err != nil:
		return rec, fmt.Errorf("the reload could not be journaled, so the lockfiles in force are unchanged: %w", err)
	}
	s.lockfiles = read
	return rec, nil
}

// opReloadLockfiles is the supervisor's control request for
// ReloadLockfiles; reloadReply its answer.
const opReloadLockfiles = "reload-lockfiles"

type reloadReply struct {
	// Reload is the package.reload record journaled (absent when none
	// was: no package grant, or the journal failed).
	Reload *audit.PackageReload `json:"reload,omitempty"`
	Error  string               `json:"error,omitempty"`
}

// reloadDo carries out a reload-lockfiles control request for requester.
func (s *Session) reloadDo(requester string) reloadReply {
	rec, err := s.ReloadLockfiles(requester)
	var rep reloadReply
	if rec.Outcome != "" {
		rep.Reload = &rec
	}
	if err != nil {
		rep.Error = err.Error()
	}
	return rep
}

// ReloadLockfiles asks the supervisor of the sandbox name to re-read its
// lockfiles (Session.ReloadLockfiles), and returns the package.reload
// record it journaled; a refused reload returns the record and an error.
// Only the sandbox's owner or root is answered (the control socket's
// peer check); the workload cannot reach the control socket.
func ReloadLockfiles(name string) (*audit.PackageReload, error) {
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	st, err := openStore()
	if err != nil {
		return nil, err
	}
	s, err := st.read(name)
	if err != nil {
		return nil, err
	}
	if s.Phase != boundary.PhaseReady && s.Phase != boundary.PhaseRunning {
		return nil, fmt.Errorf("sandbox %s is %s, not Ready: there is no running broker whose lockfiles could be reloaded", name, s.Phase)
	}
	var rep reloadReply
	answered := false
	if err := control(st.sandboxDir(name), controlRequest{Op: opReloadLockfiles}, nil, func(l []byte) bool {
		answered = json.Unmarshal(l, &rep) == nil
		return false
	}); err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", name, err)
	}
	if !answered {
		return nil, fmt.Errorf("sandbox %s: the supervisor closed the control connection without an answer (only the sandbox's owner or root is answered)", name)
	}
	if rep.Error != "" {
		return rep.Reload, fmt.Errorf("sandbox %s: reload-lockfiles: %s", name, rep.Error)
	}
	if rep.Reload == nil {
		return nil, fmt.Errorf("sandbox %s: the supervisor's answer holds no package.reload record", name)
	}
	return rep.Reload, nil
}
