package measure

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/boundary"
)

func planIDs(pl plan) []string {
	var ids []string
	for _, p := range pl.Probes {
		ids = append(ids, p.ID)
	}
	return ids
}

func TestBuildPlan(t *testing.T) {
	d := t.TempDir()
	home := filepath.Join(d, "home")
	ws := filepath.Join(home, "proj", "ws")
	for _, p := range []string{ws, filepath.Join(home, ".ssh"), filepath.Join(home, "proj", "other")} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(home, ".bash_history"), []byte("x"), 0o600)
	ro := filepath.Join(ws, "vendor") // a read-only grant inside the rw one
	cfg := Config{BrokerPort: 8080, ReadWrite: []string{ws, "/srv/agent/ws", "/tmp/x/y"}, ReadOnly: []string{"/usr", ro},
		HostSecrets: []string{"/etc/shadow", home}, ExtraTCPPorts: []int{9999}, ExtraUDPPorts: []int{5353},
		SetuidProbes: []string{filepath.Join(ws, "suid")}}
	pl, err := buildPlan(cfg, "00")
	if err != nil {
		t.Fatal(err)
	}
	ids := planIDs(pl)
	for _, want := range []string{
		"fs/read-secret:/etc/shadow",
		"fs/read-secret:" + filepath.Join(home, ".bash_history"),
		"fs/read-secret:" + filepath.Join(home, ".ssh"),
		"fs/write-outside:/srv/agent", // parent of a rw grant
		"fs/write-outside:/",
		"fs/write-ro:/usr",
		"fs/read-ro:/usr",
		"fs/read-ro:" + ro,
		"fs/write-ro:" + ro, // inside a rw grant, but its own read-only mount
		"fs/write-rw:" + ws,
		"fs/write-tmp:/tmp",
		"fs/stat-list:/", // useful work: stat and ls -la of / and of each rw grant
		"fs/stat-list:" + ws,
		"fs/stat-list:/srv/agent/ws",
		"net/tcp-broker:127.0.0.1:8080",
		"net/tcp:127.0.0.1:8079", "net/tcp:127.0.0.1:8081", "net/tcp:[::1]:8081",
		"net/tcp:127.0.0.1:9999", "net/tcp:[::1]:9999", "net/tcp:127.0.0.1:53",
		"net/dns-udp:127.0.0.1:53", "net/dns-udp:[::1]:53", "net/dns-udp:127.0.0.1:5353",
		"net/dns-resolv.conf", "net/non-loopback-interface", "net/route-out",
		"priv/no-new-privs-unset", "priv/unshare-userns", "priv/clone-userns", "priv/exec-self",
		"priv/setuid:" + filepath.Join(ws, "suid"),
	} {
		if !slices.Contains(ids, want) {
			t.Errorf("plan lacks %q", want)
		}
	}
	for _, bad := range []string{
		"fs/read-secret:" + home,                        // holds a grant: its entries are probed instead
		"fs/read-secret:" + filepath.Join(home, "proj"), // on the way to a grant
		"fs/write-outside:" + ws,                        // parent of ro, but a rw grant
		"net/tcp:127.0.0.1:8080", "net/tcp:[::1]:8080",  // the broker itself
	} {
		if slices.Contains(ids, bad) {
			t.Errorf("plan has %q", bad)
		}
	}
	// /tmp as a secret (say, the working directory) is the sandbox's own
	// inside: its host entries are probed instead, including the sentinel.
	f, err := os.CreateTemp("/tmp", ".moat-plan-test-")
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	defer os.Remove(f.Name())
	tpl, err := buildPlan(Config{BrokerPort: 1, HostSecrets: []string{"/tmp"}}, "00")
	if err != nil {
		t.Fatal(err)
	}
	tids := planIDs(tpl)
	if slices.Contains(tids, "fs/read-secret:/tmp") {
		t.Errorf("plan probes the sandbox's own /tmp as a secret")
	}
	n := 0
	for _, id := range tids {
		if strings.HasPrefix(id, "fs/read-secret:/tmp/") {
			n++
		}
	}
	if n == 0 || n > maxSecretEntries {
		t.Errorf("%d host /tmp entries probed, want 1..%d", n, maxSecretEntries)
	}

	// Kinds are the host's: every control is one of the allowed actions.
	for _, p := range pl.Probes {
		if (p.kind == KindControl) != isControl(p.ID) {
			t.Errorf("probe %s has kind %s", p.ID, p.kind)
		}
		if p.property == "" {
			t.Errorf("probe %s has no property", p.ID)
		}
	}
	// The plan survives the trip to the helper.
	arg, err := encodePlan(pl)
	if err != nil {
		t.Fatal(err)
	}
	back, err := decodePlan(arg)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(planIDs(back), ids) || back.Nonce != "00" {
		t.Errorf("plan changed in transit")
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		port int
		want string
	}{
		{"ok, port from listener", Config{ReadWrite: []string{"/w"}}, 80, ""},
		{"port mismatch", Config{BrokerPort: 81}, 80, "differs"},
		{"no port", Config{}, 0, "out of range"},
		{"relative grant", Config{ReadOnly: []string{"usr"}}, 80, "not absolute"},
		{"unclean secret", Config{HostSecrets: []string{"/etc/../etc/shadow"}}, 80, "not absolute and clean"},
		{"bad extra port", Config{ExtraTCPPorts: []int{70000}}, 80, "out of range"},
		{"too many ports", Config{ExtraUDPPorts: make([]int, maxExtraPorts+1)}, 80, "extra ports"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.validate(tc.port)
			if tc.want == "" {
				if err != nil || tc.cfg.BrokerPort != tc.port {
					t.Errorf("got %v (port %d), want nil (port %d)", err, tc.cfg.BrokerPort, tc.port)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestPlanTooLarge(t *testing.T) {
	var many []string
	for i := 0; i < MaxProbes; i++ {
		many = append(many, "/secret/"+strings.Repeat("x", 10)+string(rune('a'+i%26))+strings.Repeat("y", i%50))
	}
	if _, err := buildPlan(Config{BrokerPort: 1, HostSecrets: many}, "00"); err == nil {
		t.Error("a plan with more than MaxProbes probes was built")
	}
}

func TestDecide(t *testing.T) {
	mech := boundary.Mechanisms{FilesystemConfinement: "x", AttributionUnavailable: "endpoint-only backend"}
	rep := &Report{Checks: []Check{
		{Property: PropFilesystem, Name: "v", Kind: KindViolation, OK: true, Outcome: OutcomeFailed},
		// egress: violations only, no control
		{Property: PropEgress, Name: "v", Kind: KindViolation, OK: true, Outcome: OutcomeFailed},
		{Property: PropPrivilege, Name: "v", Kind: KindViolation, OK: true, Outcome: OutcomeFailed},
		{Property: PropPrivilege, Name: "c", Kind: KindControl, OK: true, Outcome: OutcomeSucceeded},
		{Property: PropAttribution, Name: "c", Kind: KindControl, OK: true, Outcome: OutcomeSucceeded},
	}}
	p := decide(rep, mech, true)
	if p.FilesystemConfinement.Enforced || !strings.Contains(p.FilesystemConfinement.Detail, "no positive control") {
		t.Errorf("filesystem without control: %+v", p.FilesystemConfinement)
	}
	if p.EgressInterception.Enforced {
		t.Errorf("egress without control enforced")
	}
	if !p.PrivilegeFloor.Enforced {
		t.Errorf("privilege: %+v", p.PrivilegeFloor)
	}
	a := p.RequestAttribution
	if a.Enforced || !a.Unavailable || !strings.Contains(a.Detail, "endpoint-only backend") || !strings.Contains(a.Detail, "requires it") {
		t.Errorf("attribution declared unavailable: %+v", a)
	}
	if p.FilesystemConfinement.Mechanism != "x" {
		t.Errorf("mechanism not recorded")
	}
}

func TestJudge(t *testing.T) {
	for _, tc := range []struct {
		kind, outcome string
		want          bool
	}{
		{KindViolation, OutcomeFailed, true},
		{KindViolation, OutcomeSucceeded, false},
		{KindViolation, OutcomeError, false},
		{KindViolation, OutcomeMissing, false},
		{KindControl, OutcomeSucceeded, true},
		{KindControl, OutcomeFailed, false},
		{KindControl, OutcomeError, false},
		{"", OutcomeFailed, false},
	} {
		if got := judge(tc.kind, tc.outcome); got != tc.want {
			t.Errorf("judge(%q, %q) = %v, want %v", tc.kind, tc.outcome, got, tc.want)
		}
	}
}

func TestTruncate(t *testing.T) {
	long := strings.Repeat("é", MaxDetailBytes)
	got := truncate(long)
	if len(got) > MaxDetailBytes+len("…") || !strings.HasSuffix(got, "…") || !utf8Valid(got) {
		t.Errorf("truncate: %d bytes, valid=%v", len(got), utf8Valid(got))
	}
	if got := truncate("a\xffb"); got != "a\uFFFDb" {
		t.Errorf("truncate(invalid) = %q", got)
	}
}

func utf8Valid(s string) bool { return strings.ToValidUTF8(s, "") == s }

// isControl recognises the controls by name, as a helper would have to.
func isControl(id string) bool {
	for _, p := range []string{"fs/read-ro:", "fs/write-rw:", "fs/write-tmp:", "fs/stat-list:", "net/tcp-broker:", "priv/" + opExec, "priv/" + opChmodPlain, "net/" + opStreamPair} {
		if strings.HasPrefix(id, p) {
			return true
		}
	}
	return false
}
