package broker

import (
	"errors"
	"strings"
	"testing"
)

// TestPackagesReload: Reload builds the new pins first (a conflicting set
// is refused and commit is never called), takes effect only once commit
// has returned nil (a failing commit leaves the old set), and then
// serves the newly pinned version and refuses the one the new lockfile
// dropped. The allowance is the run's: a reload does not reset it.
func TestPackagesReload(t *testing.T) {
	f := newNPMFixture(t)
	h := f.harness(t)
	pk := h.b.cfg.Packages
	const lp13, lp14 = "/pkg/npm/left-pad/-/left-pad-1.3.0.tgz", "/pkg/npm/left-pad/-/left-pad-1.4.0.tgz"
	if r := h.raw(pkgGet(lp13)); r.status != 200 {
		t.Fatalf("pinned before the reload: %d %s", r.status, r.body)
	}
	if r := h.raw(pkgGet(lp14)); r.status != 404 || r.header.Get("Moat-Reason") != string(ReasonPackageVersion) {
		t.Fatalf("1.4.0 before the reload: %d %s", r.status, r.body)
	}
	// The operator's new lockfile pins 1.4.0 in place of 1.3.0.
	newLock := strings.NewReplacer("1.3.0", "1.4.0", sri(f.tgz["left-pad@1.3.0"]), sri(f.tgz["left-pad@1.4.0"])).Replace(string(f.lockData))
	pins, err := ParseNPMLockfile(f.lockfile, []byte(newLock))
	if err != nil {
		t.Fatal(err)
	}
	// Refused before commit: two digests for one tarball.
	bad := append(append([]NPMPin(nil), pins...), pins[0])
	bad[len(bad)-1].Integrity[0] ^= 1
	called := false
	if err := pk.Reload(PackagesConfig{NPM: bad}, func() error { called = true; return nil }); err == nil || called || !strings.Contains(err.Error(), "two digests") {
		t.Errorf("conflicting pins: err %v, commit called %v", err, called)
	}
	// The journal failed: the old set stays.
	if err := pk.Reload(PackagesConfig{NPM: pins}, func() error { return errors.New("journal failed") }); err == nil {
		t.Error("Reload ignored its commit's error")
	}
	for _, c := range []struct {
		path   string
		status int
	}{{lp13, 200}, {lp14, 404}} {
		if r := h.raw(pkgGet(c.path)); r.status != c.status {
			t.Errorf("after refused reloads, %s: %d, want %d (the old set)", c.path, r.status, c.status)
		}
	}
	used := pk.bases[0].used.Load()
	if err := pk.Reload(PackagesConfig{NPM: pins}, func() error { called = true; return nil }); err != nil || !called {
		t.Fatalf("reload: %v (commit called %v)", err, called)
	}
	if got := pk.bases[0].used.Load(); got != used {
		t.Errorf("allowance used %d after the reload, want %d (not reset)", got, used)
	}
	if r := h.raw(pkgGet(lp14)); r.status != 200 || r.body != string(f.tgz["left-pad@1.4.0"]) {
		t.Errorf("newly pinned 1.4.0 after the reload: %d", r.status)
	}
	if r := h.raw(pkgGet(lp13)); r.status != 404 || r.header.Get("Moat-Reason") != string(ReasonPackageVersion) || !strings.Contains(r.body, "1.4.0 only") {
		t.Errorf("1.3.0, dropped by the reload: %d %s", r.status, r.body)
	}
	var nilPk *Packages
	if err := nilPk.Reload(PackagesConfig{}, func() error { return nil }); err == nil {
		t.Error("Reload without a package route succeeded")
	}
	h.j.verifyAll(t)
}
