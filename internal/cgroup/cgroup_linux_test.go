package cgroup

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func v2Host(point, own string, euid int) *Host {
	return &Host{Mounts: []Mount{{Root: "/", Point: point, FSType: "cgroup2", Super: "rw"}}, Own: map[string]string{"": own}, Euid: euid}
}

// As root on cgroup v2: the sandbox's cgroup is made under the v2 root,
// after the controllers are enabled there, with the limits written; the
// init is added, the OOM counter read from memory.events, and the cgroup
// removed.
func TestV2Root(t *testing.T) {
	f, tmp := newFake(t)
	f.swap = true
	root := filepath.Join(tmp, "cg")
	f.mountV2(t, root, "cpu", "memory", "pids")
	f.mkcg(t, filepath.Join(root, "user.slice"))
	var owned []string
	g, st := Create(f, v2Host(root, "/user.slice", 0), "moat-r1", Limits{Memory: 64 << 20, Pids: 32}, func(d string) { owned = append(owned, d) })
	if !st.Memory || !st.Pids || st.Detail != "" {
		t.Fatalf("status %+v, want memory and pids enforced", st)
	}
	dir := filepath.Join(root, "moat-r1")
	if !slices.Equal(owned, []string{dir}) || !slices.Equal(g.Dirs(), []string{dir}) {
		t.Errorf("owned %v, dirs %v; want [%s]", owned, g.Dirs(), dir)
	}
	if got := mustRead(t, filepath.Join(root, "cgroup.subtree_control")); got != "memory pids" {
		t.Errorf("root subtree_control %q, want memory and pids enabled", got)
	}
	for file, want := range map[string]string{"memory.max": "67108864", "memory.swap.max": "0", "pids.max": "32"} {
		if got := mustRead(t, filepath.Join(dir, file)); got != want {
			t.Errorf("%s = %q, want %q", file, got, want)
		}
	}
	if err := g.Add(4242); err != nil {
		t.Fatal(err)
	}
	if got := mustRead(t, filepath.Join(dir, "cgroup.procs")); got != "4242" {
		t.Errorf("cgroup.procs %q, want 4242", got)
	}
	if n, ok := g.OOMKills(); !ok || n != 0 {
		t.Errorf("OOMKills %d %v, want 0 true", n, ok)
	}
	os.WriteFile(filepath.Join(dir, "memory.events"), []byte("oom 2\noom_kill 2\n"), 0o644)
	if n, ok := g.OOMKills(); !ok || n != 2 {
		t.Errorf("OOMKills %d %v, want 2 true (from memory.events)", n, ok)
	}
	// Not removable while a process is in it (the fake kernel's rule),
	// then removed once it is empty.
	os.WriteFile(filepath.Join(dir, "cgroup.procs"), nil, 0o644)
	var done []string
	if err := g.Remove(func(d string) { done = append(done, d) }); err != nil {
		t.Fatal(err)
	}
	notExist(t, dir)
	if !slices.Equal(done, []string{dir}) {
		t.Errorf("done %v", done)
	}
}

// Without memory.swap.max (no swap accounting) memory.max alone is the
// limit.
func TestV2NoSwapFile(t *testing.T) {
	f, tmp := newFake(t)
	root := filepath.Join(tmp, "cg")
	f.mountV2(t, root, "memory", "pids")
	g, st := Create(f, v2Host(root, "/", 0), "moat-r2", Limits{Memory: 1 << 20}, nil)
	if !st.Memory || st.Pids {
		t.Fatalf("status %+v, want memory only", st)
	}
	if got := mustRead(t, filepath.Join(root, "moat-r2", "memory.max")); got != "1048576" {
		t.Errorf("memory.max %q", got)
	}
	notExist(t, filepath.Join(root, "moat-r2", "memory.swap.max"))
	if got := mustRead(t, filepath.Join(root, "cgroup.subtree_control")); got != "memory" {
		t.Errorf("subtree_control %q, want only what is needed", got)
	}
	g.Remove(nil)
}

// An absent controller is not enforced, with the exact reason; the other
// one still is.
func TestV2ControllerAbsent(t *testing.T) {
	f, tmp := newFake(t)
	root := filepath.Join(tmp, "cg")
	f.mountV2(t, root, "cpu", "memory")
	g, st := Create(f, v2Host(root, "/", 0), "moat-r3", Limits{Memory: 1 << 20, Pids: 8}, nil)
	if !st.Memory || st.Pids {
		t.Fatalf("status %+v, want memory enforced and pids not", st)
	}
	want := `pids: the pids controller is not available: no cgroup v1 hierarchy has it and ` + root + `/cgroup.controllers lists only "cpu memory"`
	if st.Detail != "not enforced: "+want {
		t.Errorf("detail %q,\nwant %q", st.Detail, "not enforced: "+want)
	}
	notExist(t, filepath.Join(root, "moat-r3", "pids.max"))
	g.Remove(nil)
	// Neither: nothing is made.
	f2, tmp2 := newFake(t)
	root2 := filepath.Join(tmp2, "cg")
	f2.mountV2(t, root2, "hugetlb")
	g, st = Create(f2, v2Host(root2, "/", 0), "moat-r4", Limits{Memory: 1 << 20, Pids: 8}, nil)
	if g != nil || st.Memory || st.Pids || !strings.Contains(st.Detail, "memory: the memory controller is not available") {
		t.Errorf("got %v %+v, want nothing made and memory's reason", g, st)
	}
	notExist(t, filepath.Join(root2, "moat-r4"))
}

// delegatedTree is a systemd-like user scope delegated to uid 1000, with
// two processes in it.
func delegatedTree(t *testing.T, f *fakeFS, root string) (scope, own string) {
	f.mountV2(t, root, "cpu", "memory", "pids", "io")
	os.WriteFile(filepath.Join(root, "cgroup.subtree_control"), []byte("cpu memory pids io"), 0o644)
	own = "/user.slice/user-1000.slice/user@1000.service/app.slice/run-1.scope"
	p := root
	for _, c := range strings.Split(own[1:], "/") {
		p = filepath.Join(p, c)
		f.mkcg(t, p)
		os.WriteFile(filepath.Join(p, "cgroup.subtree_control"), []byte("cpu memory pids"), 0o644)
	}
	os.WriteFile(filepath.Join(p, "cgroup.subtree_control"), nil, 0o644)
	os.WriteFile(filepath.Join(p, "cgroup.procs"), []byte("4242\n4243"), 0o644)
	f.own(p, 1000, "cgroup.subtree_control", "cgroup.procs")
	return p, own
}

// Rootless in a delegated scope: the scope's processes are moved to
// moat-leaf, the controllers enabled in the scope, and the sandbox's cgroup
// made beside the leaf; a second run in the same scope (now in the leaf)
// uses the same scope.
func TestV2Delegated(t *testing.T) {
	f, tmp := newFake(t)
	root := filepath.Join(tmp, "cg")
	scope, own := delegatedTree(t, f, root)
	g, st := Create(f, v2Host(root, own, 1000), "moat-u1", Limits{Memory: 8 << 20, Pids: 16}, nil)
	if !st.Memory || !st.Pids {
		t.Fatalf("status %+v, want both enforced in the delegated scope", st)
	}
	dir := filepath.Join(scope, "moat-u1")
	if got := mustRead(t, filepath.Join(dir, "pids.max")); got != "16" {
		t.Errorf("pids.max %q", got)
	}
	if got := mustRead(t, filepath.Join(scope, LeafName, "cgroup.procs")); got != "4242\n4243" {
		t.Errorf("leaf procs %q, want the scope's processes", got)
	}
	if got := mustRead(t, filepath.Join(scope, "cgroup.procs")); got != "" {
		t.Errorf("scope procs %q, want empty", got)
	}
	g2, st2 := Create(f, v2Host(root, own+"/"+LeafName, 1000), "moat-u2", Limits{Pids: 4}, nil)
	if !st2.Pids || !slices.Equal(g2.Dirs(), []string{filepath.Join(scope, "moat-u2")}) {
		t.Errorf("second run: %+v %v", st2, g2.Dirs())
	}
	g.Remove(nil)
	g2.Remove(nil)
}

// Rootless outside a delegated cgroup: not enforced, with which file is
// not the caller's, and the advice names a delegated scope; nothing is
// made and no process moved. The control is TestV2Delegated, on the same
// tree.
func TestV2NotDelegated(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(f *fakeFS, scope string)
		want  string
	}{
		{"dir owned by root", func(f *fakeFS, s string) { f.own(s, 0) }, "is owned by uid 0, not by moat's uid 1000"},
		{"subtree_control owned by root", func(f *fakeFS, s string) { f.own(filepath.Join(s, "cgroup.subtree_control"), 0) }, "cgroup.subtree_control is owned by uid 0"},
		{"procs owned by root", func(f *fakeFS, s string) { f.own(filepath.Join(s, "cgroup.procs"), 0) }, "cgroup.procs is owned by uid 0"},
		{"subtree_control read-only", func(f *fakeFS, s string) { os.Chmod(filepath.Join(s, "cgroup.subtree_control"), 0o444) }, "is not writable by its owner"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, tmp := newFake(t)
			root := filepath.Join(tmp, "cg")
			scope, own := delegatedTree(t, f, root)
			tc.setup(f, scope)
			g, st := Create(f, v2Host(root, own, 1000), "moat-u1", Limits{Memory: 8 << 20, Pids: 16}, nil)
			if g != nil || st.Memory || st.Pids {
				t.Fatalf("got %v %+v, want nothing enforced", g, st)
			}
			for _, w := range []string{tc.want, "systemd-run --user --scope -p Delegate=yes"} {
				if !strings.Contains(st.Detail, w) {
					t.Errorf("detail %q lacks %q", st.Detail, w)
				}
			}
			notExist(t, filepath.Join(scope, "moat-u1"))
			notExist(t, filepath.Join(scope, LeafName))
		})
	}
	// Delegated, but the controller is not handed down.
	f, tmp := newFake(t)
	root := filepath.Join(tmp, "cg")
	scope, own := delegatedTree(t, f, root)
	os.WriteFile(filepath.Join(scope, "cgroup.controllers"), []byte("cpu memory"), 0o644)
	_, st := Create(f, v2Host(root, own, 1000), "moat-u1", Limits{Memory: 8 << 20, Pids: 16}, nil)
	if !st.Memory || st.Pids || !strings.Contains(st.Detail, `pids: the pids controller is not available: no cgroup v1 hierarchy has it and `+scope+`/cgroup.controllers lists only "cpu memory"`) {
		t.Errorf("got %+v", st)
	}
}

// cgroup v1 as root: a child of this process's cgroup in each
// controller's hierarchy; unprivileged: refused with the reason, and no
// delegation advice (v1 has none).
func TestV1(t *testing.T) {
	f, tmp := newFake(t)
	mem, pids := filepath.Join(tmp, "memory"), filepath.Join(tmp, "pids")
	f.mountV1(t, mem, Memory)
	f.mountV1(t, pids, Pids)
	f.mkcg(t, filepath.Join(mem, "a"))
	h := &Host{Mounts: []Mount{
		{Root: "/", Point: mem, FSType: "cgroup", Super: "rw,memory"},
		{Root: "/", Point: pids, FSType: "cgroup", Super: "rw,pids"},
		{Root: "/", Point: filepath.Join(tmp, "unified"), FSType: "cgroup2", Super: "rw"},
	}, Own: map[string]string{Memory: "/a", Pids: "/", "": "/"}, Euid: 0}
	g, st := Create(f, h, "moat-v1", Limits{Memory: 1 << 20, Pids: 9}, nil)
	if !st.Memory || !st.Pids {
		t.Fatalf("status %+v", st)
	}
	if got := mustRead(t, filepath.Join(mem, "a", "moat-v1", "memory.limit_in_bytes")); got != "1048576" {
		t.Errorf("memory.limit_in_bytes %q", got)
	}
	if got := mustRead(t, filepath.Join(pids, "moat-v1", "pids.max")); got != "9" {
		t.Errorf("pids.max %q", got)
	}
	os.WriteFile(filepath.Join(mem, "a", "moat-v1", "memory.oom_control"), []byte("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n"), 0o644)
	if n, ok := g.OOMKills(); !ok || n != 3 {
		t.Errorf("OOMKills %d %v, want 3 from memory.oom_control", n, ok)
	}
	g.Remove(nil)
	notExist(t, filepath.Join(pids, "moat-v1"))
	h.Euid = 1000
	g, st = Create(f, h, "moat-v1", Limits{Memory: 1 << 20, Pids: 9}, nil)
	if g != nil || st.Memory || st.Pids || !strings.Contains(st.Detail, "moat makes cgroup v1 cgroups as root only") || strings.Contains(st.Detail, "Delegate") {
		t.Errorf("unprivileged on v1: %v %+v", g, st)
	}
}

// A hybrid host: each controller is used where it is bound (pids on v1,
// memory on v2).
func TestHybrid(t *testing.T) {
	f, tmp := newFake(t)
	pids, uni := filepath.Join(tmp, "pids"), filepath.Join(tmp, "unified")
	f.mountV1(t, pids, Pids)
	f.mountV2(t, uni, "memory")
	h := &Host{Mounts: []Mount{
		{Root: "/", Point: pids, FSType: "cgroup", Super: "rw,pids"},
		{Root: "/", Point: uni, FSType: "cgroup2", Super: "rw"},
	}, Own: map[string]string{Pids: "/", "": "/"}, Euid: 0}
	g, st := Create(f, h, "moat-h", Limits{Memory: 1 << 20, Pids: 9}, nil)
	if !st.Memory || !st.Pids {
		t.Fatalf("status %+v", st)
	}
	want := []string{filepath.Join(pids, "moat-h"), filepath.Join(uni, "moat-h")}
	if !slices.Equal(g.Dirs(), want) {
		t.Errorf("dirs %v, want %v", g.Dirs(), want)
	}
	if mustRead(t, filepath.Join(uni, "moat-h", "memory.max")) != "1048576" || mustRead(t, filepath.Join(pids, "moat-h", "pids.max")) != "9" {
		t.Error("limits not written where the controllers are")
	}
	if err := g.Add(7); err != nil {
		t.Fatal(err)
	}
	for _, d := range want {
		if mustRead(t, filepath.Join(d, "cgroup.procs")) != "7" {
			t.Errorf("%s: pid not added", d)
		}
	}
	if !(&Host{Mounts: h.Mounts}).Hybrid() || (&Host{Mounts: h.Mounts}).Unified() {
		t.Error("Hybrid/Unified")
	}
}

func TestProbe(t *testing.T) {
	f, tmp := newFake(t)
	root := filepath.Join(tmp, "cg")
	f.mountV2(t, root, "memory")
	places, why := Probe(f, v2Host(root, "/", 0))
	if why[Memory] != "" || !places[Memory].V2 || places[Memory].Parent != root {
		t.Errorf("memory: %+v %q", places[Memory], why[Memory])
	}
	if !strings.Contains(why[Pids], "the pids controller is not available") {
		t.Errorf("pids: %q", why[Pids])
	}
	ents, _ := os.ReadDir(root)
	for _, e := range ents {
		if e.IsDir() {
			t.Errorf("probe left %s", e.Name())
		}
	}
	// Nothing written: memory.max is not set on the root (there is no
	// child left to look at, so check the enabled set only).
	if got := mustRead(t, filepath.Join(root, "cgroup.subtree_control")); got != "memory" {
		t.Errorf("subtree_control %q", got)
	}
}

func TestBadName(t *testing.T) {
	f, tmp := newFake(t)
	root := filepath.Join(tmp, "cg")
	f.mountV2(t, root, "memory", "pids")
	for _, n := range []string{"x", "moat-", "moat-../x", "moat-a/b", "moat-a b"} {
		if g, st := Create(f, v2Host(root, "/", 0), n, Limits{Pids: 1}, nil); g != nil || st.Pids || !strings.Contains(st.Detail, "bad cgroup name") {
			t.Errorf("%q: %v %+v", n, g, st)
		}
	}
}

// Sweep removes an old, empty, unlocked moat-* cgroup, and leaves a new
// one, a locked one, one with a process, one with a child and one not
// named moat-*.
func TestSweep(t *testing.T) {
	f, tmp := newFake(t)
	root := filepath.Join(tmp, "cg")
	f.mountV2(t, root, "memory", "pids")
	old := time.Now().Add(-2 * SweepGrace)
	mk := func(name string, aged bool) string {
		d := filepath.Join(root, name)
		f.mkcg(t, d)
		if aged {
			os.Chtimes(d, old, old)
		}
		return d
	}
	stale := mk("moat-stale", true)
	fresh := mk("moat-fresh", false)
	locked := mk("moat-locked", true)
	busy := mk("moat-busy", true)
	parent := mk("moat-parent", true)
	f.mkcg(t, filepath.Join(parent, "child"))
	os.Chtimes(parent, old, old)
	other := mk("user.slice", true)
	os.WriteFile(filepath.Join(busy, "cgroup.procs"), []byte("99"), 0o644)
	lk, err := f.Lock(locked)
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Close()
	got := Sweep(f, []string{root, filepath.Join(tmp, "nonexistent")}, time.Now(), SweepGrace)
	if !slices.Equal(got, []string{stale}) {
		t.Errorf("removed %v, want [%s]", got, stale)
	}
	notExist(t, stale)
	for _, d := range []string{fresh, locked, busy, parent, other} {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("%s: %v, want it kept", d, err)
		}
	}
}

func TestSweepDirs(t *testing.T) {
	h := &Host{Mounts: []Mount{
		{Root: "/", Point: "/sys/fs/cgroup/memory", FSType: "cgroup", Super: "rw,memory"},
		{Root: "/", Point: "/sys/fs/cgroup/cpu,cpuacct", FSType: "cgroup", Super: "rw,cpu,cpuacct"},
		{Root: "/", Point: "/sys/fs/cgroup/unified", FSType: "cgroup2", Super: "rw"},
	}, Own: map[string]string{Memory: "/a/b", "cpu": "/", "cpuacct": "/", "": "/s/" + LeafName}}
	want := []string{"/sys/fs/cgroup/memory", "/sys/fs/cgroup/memory/a/b", "/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/unified", "/sys/fs/cgroup/unified/s"}
	if got := SweepDirs(h); !slices.Equal(got, want) {
		t.Errorf("got %v\nwant %v", got, want)
	}
}

func TestParse(t *testing.T) {
	m, ok := ParseMountinfoLine(`35 25 0:30 /x /sys/fs/cgroup/a\040b rw,nosuid shared:9 - cgroup2 cgroup2 rw,nsdelegate`)
	if !ok || m != (Mount{Root: "/x", Point: "/sys/fs/cgroup/a b", FSType: "cgroup2", Super: "rw,nsdelegate"}) {
		t.Errorf("mountinfo: %+v %v", m, ok)
	}
	if _, ok := ParseMountinfoLine("garbage"); ok {
		t.Error("garbage parsed")
	}
	own := map[string]string{}
	for _, l := range []string{"0::/user.slice/x.scope", "4:memory:/a", "3:cpu,cpuacct:/b", "2:pids:relative", "1:name=systemd:/c/../d", "7::/not-v2"} {
		ParseCgroupLine(own, l)
	}
	want := map[string]string{"": "/user.slice/x.scope", "memory": "/a", "cpu": "/b", "cpuacct": "/b"}
	if len(own) != len(want) {
		t.Errorf("own %v, want %v", own, want)
	}
	for k, v := range want {
		if own[k] != v {
			t.Errorf("own[%q] = %q, want %q", k, own[k], v)
		}
	}
	if n, ok := ParseOOMKill("low 0\noom_kill 12\n"); !ok || n != 12 {
		t.Errorf("oom_kill: %d %v", n, ok)
	}
	if _, ok := ParseOOMKill("oom 1\n"); ok {
		t.Error("oom_kill found where absent")
	}
	if got := Dir(Mount{Root: "/a", Point: "/m"}, "/a/b"); got != "/m/b" {
		t.Errorf("Dir %q", got)
	}
	if got := Dir(Mount{Root: "/a", Point: "/m"}, "/ab"); got != "/m/ab" {
		t.Errorf("Dir prefix without a slash: %q", got)
	}
}

func FuzzParse(f *testing.F) {
	f.Add("35 25 0:30 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw", "0::/a")
	f.Fuzz(func(t *testing.T, mi, cg string) {
		if m, ok := ParseMountinfoLine(mi); ok && (m.FSType == "" || m.Super == "") {
			t.Errorf("%q: %+v", mi, m)
		}
		own := map[string]string{}
		ParseCgroupLine(own, cg)
		for _, p := range own {
			if !filepath.IsAbs(p) || filepath.Clean(p) != p {
				t.Errorf("%q: kept %q", cg, p)
			}
		}
		ParseOOMKill(cg)
	})
}
func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{
		`/a\040b`: "/a b",
		`/plain`:  "/plain",
		`/a\04`:   `/a\04`,
		`/a\9999`: `/a\9999`,
		`\134`:    `\`,
	} {
		if got := unescape(in); got != want {
			t.Errorf("unescape(%q) got %q, want %q", in, got, want)
		}
	}
}
