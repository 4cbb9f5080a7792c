//go:build linux

package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/internal/testenv"
)

// hooksBin is moat built with the moat_test_hooks tag ($MOAT_HOOKS_BIN,
// which scripts/test builds; else built here).
func hooksBin(t *testing.T) string { return taggedBin(t, "MOAT_HOOKS_BIN", "moat_test_hooks") }

// TestGrantSwapBetweenPlanAndMount is the check-then-mount race of issue
// 11, driven deterministically: moat stops after planning the grants;
// another sandbox's workload (here the test) swaps a nested grant's parent
// for a symlink to a host directory outside the grants; moat goes on. The
// run must be refused before its workload starts, and the host file never
// read. The control: the same run without the swap reads the grant. On
// native and, as root, on gVisor.
func TestGrantSwapBetweenPlanAndMount(t *testing.T) {
	bin := hooksBin(t)
	backends := []string{"native"}
	if os.Geteuid() == 0 {
		_, err := exec.LookPath("runsc")
		testenv.Need(t, err == nil, "runsc is not installed")
		backends = append(backends, "gvisor")
	}
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) {
			e := newEnv(t)
			sys := filepath.Join(e.workspace, "sysroot")
			etc := filepath.Join(sys, "etc")
			outside := filepath.Join(e.dir, "outside")
			for _, d := range []string{etc, filepath.Join(outside, "etc")} {
				if err := os.MkdirAll(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			writeFile(t, filepath.Join(etc, "conf"), "granted\n")
			writeFile(t, filepath.Join(outside, "etc", "conf"), "HOST SECRET\n")
			if os.Geteuid() == 0 {
				for _, p := range []string{sys, etc, filepath.Join(etc, "conf")} {
					os.Chown(p, 65534, 65534)
				}
			}
			pol := filepath.Join(e.dir, "nested.yaml")
			writeFile(t, pol, strings.Replace(readFile(t, e.policy("")), "read_only: [", "read_only: ["+etc+", ", 1))
			run := func(swap bool) result {
				hook := filepath.Join(e.dir, "hook")
				os.Remove(hook + ".ready")
				os.Remove(hook + ".go")
				cmd := exec.Command(bin, "run", "--backend", backend, "--policy", pol, "--", "cat", filepath.Join(etc, "conf"))
				cmd.Dir = e.dir
				cmd.Env = append(os.Environ(), "MOAT_TEST_AFTER_PLAN="+hook)
				var so, se strings.Builder
				cmd.Stdout, cmd.Stderr = &so, &se
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				waitFor(t, "moat to stop after planning", 60*e2eSecond, func() bool { _, err := os.Stat(hook + ".ready"); return err == nil })
				if swap {
					if err := os.Rename(sys, sys+".old"); err != nil {
						t.Fatal(err)
					}
					if err := os.Symlink(outside, sys); err != nil {
						t.Fatal(err)
					}
				}
				writeFile(t, hook+".go", "")
				cmd.Wait()
				return result{so.String(), se.String(), cmd.ProcessState.ExitCode()}
			}
			if r := run(false); r.code != 0 || r.stdout != "granted\n" {
				t.Fatalf("control: %s", r)
			}
			r := run(true)
			if r.code != 125 || strings.Contains(r.stdout, "HOST SECRET") {
				t.Errorf("after the swap: %s; want 125 and no host file", r)
			}
			if !strings.Contains(r.stderr, "grant "+etc) {
				t.Errorf("the refusal does not name the grant: %s", r.stderr)
			}
		})
	}
}
