package native

import (
	"errors"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/policy"
)

func TestLLFSAll(t *testing.T) {
	for _, tc := range []struct {
		abi  int
		want uint64
	}{
		{1, 1<<13 - 1},
		{2, 1<<14 - 1},
		{3, 1<<15 - 1},
		{4, 1<<15 - 1},
		{5, 1<<16 - 1},
		{9, 1<<16 - 1}, // resolve_unix is handled, never grantable
	} {
		if got := llFSAll(tc.abi); got != tc.want {
			t.Errorf("llFSAll(%d): got %#x, want %#x", tc.abi, got, tc.want)
		}
		if llFSAll(tc.abi)&llFSResolveUnix != 0 {
			t.Errorf("llFSAll(%d) grants resolve_unix", tc.abi)
		}
	}
}

func TestInitConfigRules(t *testing.T) {
	ro, rw := t.TempDir(), t.TempDir()
	pol := &policy.Policy{
		Filesystem: policy.Filesystem{ReadOnly: []string{ro}, ReadWrite: []string{rw}},
		Process:    policy.Process{UID: 1000, Limits: policy.Limits{OpenFiles: 64}},
	}
	cfg, err := initConfigFor(pol, 7, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.TmpSize != int64(policy.DefaultTmpSize) || cfg.OpenFiles != 64 || cfg.UID != 1000 || cfg.GID != 1000 {
		t.Errorf("config: got %+v", cfg)
	}
	rules := map[string]uint64{}
	for _, r := range cfg.Landlock.Rules {
		if _, dup := rules[r.Path]; dup {
			t.Errorf("duplicate rule for %s", r.Path)
		}
		rules[r.Path] = r.Access
	}
	want := map[string]uint64{
		ro:             llFSExecute | llFSReadFile | llFSReadDir,
		rw:             llFSAll(7),
		"/tmp":         llFSAll(7),
		"/proc":        llFSReadFile | llFSReadDir,
		"/dev/null":    llFSReadFile | llFSWriteFile | llFSTruncate | llFSIoctlDev,
		"/dev/urandom": llFSReadFile | llFSWriteFile | llFSTruncate | llFSIoctlDev,
	}
	for p, acc := range want {
		if rules[p] != acc {
			t.Errorf("rule for %s: got %#x, want %#x", p, rules[p], acc)
		}
	}
	if rules["/"] != llFSReadDir {
		t.Errorf("rule for /: got %#x, want read_dir only", rules["/"])
	}
	if len(rules) != 5+len(devNodes) {
		t.Errorf("rules: got %d (%v), want %d", len(rules), rules, 5+len(devNodes))
	}
	if cfg.Landlock.ExecFD != -1 {
		t.Errorf("workload ruleset with an exec fd: %d", cfg.Landlock.ExecFD)
	}

	// A grant left out of Landlock (tests only) is mounted but has no rule.
	testOmitLandlock = []string{ro}
	cfg, err = initConfigFor(pol, 7, 1000)
	testOmitLandlock = nil
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range cfg.Landlock.Rules {
		if r.Path == ro {
			t.Errorf("omitted grant %s has a rule", ro)
		}
	}
	granted := 0
	for _, m := range cfg.Plan.Mounts {
		if !m.Runtime {
			granted++
		}
	}
	if granted != 2 {
		t.Errorf("grants: got %v, want both mounted", cfg.Plan.Mounts)
	}

	for name, bad := range map[string][]string{
		"relative": {"rel/path"},
		"root":     {"/"},
		"unclean":  {ro + "/../x"},
		"missing":  {ro + "/does-not-exist"},
	} {
		t.Run(name, func(t *testing.T) {
			p := *pol
			p.Filesystem.ReadOnly = bad
			var pe *policy.Error // the policy's own refusal, unprefixed (the edge adds "moat: refused: ")
			if _, err := initConfigFor(&p, 7, 1000); !errors.As(err, &pe) || !strings.Contains(err.Error(), "grant") {
				t.Errorf("grant %q: got %v, want the policy's refusal of the grant", bad, err)
			}
		})
	}
}
