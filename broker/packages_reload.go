package broker

import (
	"errors"
	"sync"
)

// reloadMu serialises Reload (across every Packages: a process has one).
var reloadMu sync.Mutex

// Reload replaces the served pins with those of cfg (its NPM, Go and PyPI;
// every other member is ignored: the grants, upstreams, clients and the
// allowance used so far stay as NewPackages made them). It is the broker's
// half of an operator's explicit re-read of the lockfiles (moat sandbox
// reload-lockfiles); nothing the workload sends can reach it.
//
// The new set is built and checked first; a set that cannot be built
// returns its error and leaves the old one in force. Then commit is
// called (the caller journals the reload, durably): only when it returns
// nil does the new set take effect, for every request that starts after
// Reload returns; a request already past its pin check finishes with the
// old one. A PyPI file link learned from an index page under the old set
// is forgotten: the package manager fetches the index again.
func (p *Packages) Reload(cfg PackagesConfig, commit func() error) error {
	if p == nil {
		return errors.New("moat: broker: packages: no package registry is granted")
	}
	reloadMu.Lock()
	defer reloadMu.Unlock()
	set, err := p.build(cfg)
	if err != nil {
		return err
	}
	if err := commit(); err != nil {
		return err
	}
	p.set.Store(set)
	return nil
}
