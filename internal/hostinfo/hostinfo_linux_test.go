package hostinfo

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/testenv"
)

// createRuleset calls landlock_create_ruleset with attr and reports whether
// the kernel accepted it.
func createRuleset(attr []uint64) error {
	fd, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, uintptr(unsafe.Pointer(&attr[0])), uintptr(8*len(attr)), 0)
	if errno != 0 {
		return errno
	}
	unix.Close(int(fd))
	return nil
}

// TestLandlockABI cross-checks the reported ABI against what the kernel
// accepts: network rules exist from ABI 4, scoping from ABI 6.
func TestLandlockABI(t *testing.T) {
	abi, err := LandlockABI()
	testenv.Need(t, err == nil, fmt.Sprintf("landlock: %v", err))
	if abi < 1 || abi > 64 {
		t.Fatalf("got ABI %d, want 1..64", abi)
	}
	const fsV1 = 1<<13 - 1 // the 13 file system rights of ABI 1
	if err := createRuleset([]uint64{fsV1}); err != nil {
		t.Errorf("ABI %d: ruleset with ABI 1 rights: %v", abi, err)
	}
	netErr := createRuleset([]uint64{fsV1, 3})
	if (netErr == nil) != (abi >= 4) {
		t.Errorf("ABI %d: ruleset with TCP rights got %v, want success iff ABI >= 4", abi, netErr)
	}
	scopeErr := createRuleset([]uint64{fsV1, 0, 3})
	if (scopeErr == nil) != (abi >= 6) {
		t.Errorf("ABI %d: ruleset with scoping got %v, want success iff ABI >= 6", abi, scopeErr)
	}
}

func TestUserNamespaces(t *testing.T) {
	err := UserNamespaces()
	testenv.Need(t, err == nil, fmt.Sprintf("user namespaces: %v", err))
	if h := userNSHint(); h == "" {
		t.Error("userNSHint is empty; a failure would not say what to change")
	}
}

func TestSeccomp(t *testing.T) {
	err := Seccomp()
	testenv.Need(t, err == nil, fmt.Sprintf("seccomp: %v", err))
	mode, err := unix.PrctlRetInt(unix.PR_GET_SECCOMP, 0, 0, 0, 0)
	if err != nil || mode < 0 || mode > 2 {
		t.Errorf("PR_GET_SECCOMP got %d %v, want 0..2", mode, err)
	}
}

// TestCgroups checks Cgroups against an independent attempt to create a
// child cgroup in the directories it names, and that it leaves nothing
// behind.
func TestCgroups(t *testing.T) {
	c := Cgroups()
	if c.Version != 1 && c.Version != 2 {
		t.Fatalf("got version %d (%s), want 1 or 2", c.Version, c.Reason)
	}
	testenv.Need(t, c.Memory.Available && c.Pids.Available, "cgroup memory and pids controllers: "+c.Reason)
	if c.Delegated != (c.Memory.Writable && c.Pids.Writable) {
		t.Errorf("delegated %v, but memory writable %v and pids writable %v", c.Delegated, c.Memory.Writable, c.Pids.Writable)
	}
	if !c.Delegated && c.Reason == "" {
		t.Error("not delegated and no reason given")
	}
	if c.Delegated && c.Reason != "" {
		t.Errorf("delegated but reason %q", c.Reason)
	}
	for name, ctl := range map[string]CgroupController{"memory": c.Memory, "pids": c.Pids} {
		probe := filepath.Join(ctl.Dir, fmt.Sprintf("moat-test-%d", os.Getpid()))
		err := os.Mkdir(probe, 0o755)
		if err == nil {
			os.Remove(probe)
		}
		if c.Version == 1 && (err == nil) != ctl.Writable {
			t.Errorf("%s: writable %v, but mkdir in %s: %v", name, ctl.Writable, ctl.Dir, err)
		}
		if !ctl.Writable && ctl.Reason == "" {
			t.Errorf("%s: not writable and no reason", name)
		}
		ents, _ := os.ReadDir(ctl.Dir)
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), fmt.Sprintf("moat-probe-%d-", os.Getpid())) {
				t.Errorf("%s: probe cgroup %s left behind", name, e.Name())
			}
		}
	}
	// Advice names only what moat implements: delegation only where the
	// controllers are on cgroup v2; on v1, root.
	onV1 := !c.Memory.V2 && !c.Pids.V2
	if onV1 && os.Geteuid() != 0 && !c.Delegated && !strings.Contains(c.Reason, "moat makes cgroup v1 cgroups as root only") {
		t.Errorf("unprivileged on v1: reason %q does not say moat enforces limits as root only", c.Reason)
	}
	if onV1 && (strings.Contains(c.Reason+c.Fix(), "systemd-run") || strings.Contains(c.Reason+c.Fix(), "Delegate=")) {
		t.Errorf("reason %q / fix %q advises delegation on cgroup v1, where moat does not implement it", c.Reason, c.Fix())
	}
	if !c.Delegated && c.Fix() == "" || c.Delegated && c.Fix() != "" {
		t.Errorf("delegated %v, fix %q", c.Delegated, c.Fix())
	}
}

// TestCgroupFix: the advice per situation.
func TestCgroupFix(t *testing.T) {
	ok := CgroupController{Available: true, Writable: true}
	v1 := CgroupController{Available: true, Reason: "r"}
	v2 := CgroupController{Available: true, V2: true, Reason: "r"}
	gone := CgroupController{Reason: "r"}
	for _, tc := range []struct {
		info      CgroupInfo
		want, not string
	}{
		{CgroupInfo{Memory: v2, Pids: v2}, "systemd-run --user --scope -p Delegate=yes", "cgroup v1"},
		{CgroupInfo{Memory: v1, Pids: v1}, "run moat as root", "Delegate"},
		{CgroupInfo{Memory: v1, Pids: v2}, "run moat as root", "Delegate"},
		{CgroupInfo{Memory: ok, Pids: gone}, "enable the memory and pids controllers", "Delegate"},
		{CgroupInfo{Root: true, Memory: v2, Pids: ok}, "see the reason", "Delegate"},
	} {
		got := tc.info.Fix()
		if !strings.Contains(got, tc.want) || strings.Contains(got, tc.not) {
			t.Errorf("%+v: fix %q, want %q and not %q", tc.info, got, tc.want, tc.not)
		}
	}
	if got := (CgroupInfo{Delegated: true, Memory: ok, Pids: ok}).Fix(); got != "" {
		t.Errorf("delegated: fix %q", got)
	}
}

// TestRootCgroupsDelegated: as root on this kind of host, moat can set
// memory and pids limits.
func TestRootCgroupsDelegated(t *testing.T) {
	testenv.NeedRoot(t)
	if c := Cgroups(); !c.Delegated {
		t.Errorf("as root: not delegated: %s", c.Reason)
	}
}

func TestRunsc(t *testing.T) {
	path, version, err := Runsc()
	_, lookErr := exec.LookPath("runsc")
	testenv.Need(t, lookErr == nil, "runsc is not installed")
	if err != nil {
		t.Fatalf("runsc: %v", err)
	}
	if !filepath.IsAbs(path) || version == "" || strings.ContainsAny(version, " \n") {
		t.Errorf("got path %q version %q, want an absolute path and one version word", path, version)
	}
	if version == "VERSION_MISSING" {
		t.Errorf("version %q: a runsc built with go install should be named by its module version", version)
	}
	if d := RunscDate(version); d == "" || d < RunscMinimumDate {
		t.Errorf("version %q: date %q, want %s or later", version, d, RunscMinimumDate)
	}
}

// TestRunscTooOld: a runsc that says it is Debian's 20221219 is refused
// with the minimum and how to build it; the control, a runsc that says it
// is the minimum, is accepted. Fake runscs are scripts first in PATH.
func TestRunscTooOld(t *testing.T) {
	for _, c := range []struct {
		say string
		ok  bool
	}{
		{"runsc version 0.0~20221219.0", false},
		{"runsc version release-20240101.0", false},
		{"runsc version " + RunscMinimum, true},
		{"runsc version release-20270101.0", true},
		{"runsc version custom", true}, // no date: the measurement decides
	} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "runsc"), []byte("#!/bin/sh\necho '"+c.say+"'\necho 'spec: 1.2.1'\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		t.Setenv("PATH", dir+":/usr/bin:/bin")
		_, v, err := Runsc()
		if c.ok != (err == nil) {
			t.Errorf("%q: version %q, err %v, want ok=%v", c.say, v, err, c.ok)
		}
		if err != nil && (!strings.Contains(err.Error(), RunscMinimum) || !strings.Contains(err.Error(), "go install gvisor.dev/gvisor/runsc@")) {
			t.Errorf("%q: %v does not name the minimum and how to build it", c.say, err)
		}
	}
}

func TestRunscDate(t *testing.T) {
	for in, want := range map[string]string{
		"0.0~20221219.0":                     "20221219",
		"release-20240101.0":                 "20240101",
		"v0.0.0-20260905035102-160fafc42237": "20260905",
		"VERSION_MISSING":                    "",
		"":                                   "",
		"120221219":                          "", // part of a longer number
		"20261399":                           "", // not a date
	} {
		if got := RunscDate(in); got != want {
			t.Errorf("RunscDate(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestOpenSSL(t *testing.T) {
	path, version, err := OpenSSL()
	testenv.Need(t, err == nil, fmt.Sprintf("openssl: %v", err))
	if !filepath.IsAbs(path) || version == "" || version[0] < '0' || version[0] > '9' {
		t.Errorf("got path %q version %q, want an absolute path and a version number", path, version)
	}
}

func TestKernel(t *testing.T) {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := Kernel(), strings.TrimSpace(string(b)); got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestArch(t *testing.T) {
	want := map[string]string{"amd64": "x86_64", "arm64": "aarch64", "386": "i686", "riscv64": "riscv64"}[runtime.GOARCH]
	got := Arch()
	if got == "" || want != "" && got != want {
		t.Errorf("got %q, want %q for GOARCH %s", got, want, runtime.GOARCH)
	}
}

func TestMissingTool(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := findTool("moat-no-such-tool")
	if err == nil || !strings.Contains(err.Error(), "moat-no-such-tool not found") {
		t.Errorf("got %v, want not found", err)
	}
	if p, err := findTool("sh"); err != nil || !filepath.IsAbs(p) {
		t.Errorf("control: sh outside $PATH got %q %v, want found in a system directory", p, err)
	}
}

func TestUnsupportedIs(t *testing.T) {
	var err error = &UnsupportedError{Feature: "landlock", GOOS: "plan9"}
	if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "plan9") {
		t.Errorf("got %v, want errors.Is ErrUnsupported naming the system", err)
	}
	var e error = &Error{Feature: "landlock", Reason: "r", Hint: "h", Err: unix.ENOSYS}
	if !errors.Is(e, unix.ENOSYS) || e.Error() != "landlock: r (h)" {
		t.Errorf("got %q, want wrapping ENOSYS", e)
	}
}
