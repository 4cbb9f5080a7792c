package cli

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"

	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/internal/kubeapi/kubeopt"
	"github.com/moat-sandbox/moat/internal/reexec"
)

// moat is two binaries. cmd/moat, the one on every sandbox's critical
// path (the CLI, the supervisor, the init, the stage, the measurement, the
// reaper: each a process start), links no Kubernetes client; its
// processes start in half the time of a binary with client-go. Everything
// of the kubernetes backend (the backend, its in-Pod helpers and host
// watchdog, the suites' client of a cluster) is in cmd/moat-kubernetes,
// which is the same CLI with an Extension. When the lean binary is asked
// for the kubernetes backend, it hands the whole command to
// moat-kubernetes beside it (handOff): same argv, same environment, same
// stdio, by exec, so that exit codes and signals are the caller's.

// Extension is what a second binary adds to moat: backends, the hidden
// helpers they re-run the binary as, and the suites' client of a
// Kubernetes cluster. Main takes them; the lean moat passes none.
type Extension struct {
	Backends []boundary.Backend
	Helpers  []reexec.Helper
	// Cluster opens the suites' view of a cluster (kubeopt.Register).
	Cluster func(*kubeopt.Options) (kubeopt.Cluster, error)
}

// extensions are Main's; set once, before anything is registered.
var extensions []Extension

func extend(exts []Extension) {
	extensions = exts
	for _, e := range exts {
		if e.Cluster != nil {
			kubeopt.Register(e.Cluster)
		}
	}
}

func hasHelper(name string) bool {
	return slices.ContainsFunc(helpers(), func(h reexec.Helper) bool { return h.Name == name })
}

// elsewhere are the backends that the lean binary does not link, each
// with the binary beside it that does.
var elsewhere = map[string]string{"kubernetes": "moat-kubernetes"}

// kubernetesHelperPrefix starts the name of every hidden helper of the
// kubernetes backend (k8sext's test checks it), so that the lean binary
// knows a name to hand off without linking the backend.
const kubernetesHelperPrefix = reexec.Prefix + "k8s-"

// knownBackends is every backend name moat knows, this binary's and those
// it hands off, for the refusal of an unknown one.
func knownBackends() []string {
	names := boundary.Names()
	for _, b := range []string{"kubernetes"} { // elsewhere, in a fixed order
		if !slices.Contains(names, b) {
			names = append(names, b)
		}
	}
	return names
}

// handOffBackend hands the command to the binary that has backend name
// when this one does not (it returns only if that binary cannot be run:
// a refusal); for any other name it returns nil.
func handOffBackend(name string) error {
	if _, ok := elsewhere[name]; !ok {
		return nil
	}
	if _, err := boundary.Lookup(name); err == nil {
		return nil
	}
	return handOff(name)
}

// handOff execs the binary that has backend (elsewhere) with this
// process's argv and environment. It returns only with a refusal (exit
// 125): the binary is missing, unsafe to run, or failed to exec.
func handOff(backend string) error {
	bin := elsewhere[backend]
	self, err := os.Executable()
	if err == nil {
		self, err = filepath.EvalSymlinks(self)
	}
	if err != nil {
		return exitf(ExitRefused, "refused: the %s backend is in %s, beside this moat binary, which cannot find itself: %v", backend, bin, err)
	}
	target := filepath.Join(filepath.Dir(self), bin)
	refuse := func(problem string) error {
		dir := filepath.Dir(target)
		return exitf(ExitRefused, "refused: the %s backend is not in this moat binary (%s) but in %s, which moat runs from beside itself, and %s. "+
			"Build it there from the same source as this moat: `go build -o %s github.com/moat-sandbox/moat/cmd/moat-kubernetes` in a checkout of moat, "+
			"or install both binaries: `GOBIN=%s go install github.com/moat-sandbox/moat/cmd/...@latest`",
			backend, self, bin, problem, target, dir)
	}
	if err := checkHandOff(target, os.Geteuid()); err != nil {
		return refuse(err.Error())
	}
	if fi, err := os.Stat(self); err == nil {
		if ti, err := os.Stat(target); err == nil && os.SameFile(fi, ti) {
			return refuse(target + " is this binary itself (build it from ./cmd/moat-kubernetes, not ./cmd/moat)")
		}
	}
	// The checks above and the exec name the same file: its directory is
	// writable by root and moat's euid only, who could replace moat too.
	err = syscall.Exec(target, os.Args, os.Environ())
	return refuse(fmt.Sprintf("exec %s failed: %v", target, err))
}

// checkHandOff refuses a binary that moat must not run as itself: not a
// regular file (a symlink included), writable by group or others, owned
// by anyone but root or euid, or in a directory that is so.
func checkHandOff(path string, euid int) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("there is no %s", path)
	}
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file (%s)", path, fi.Mode().Type())
	}
	if err := safeOwner(path, fi, euid); err != nil {
		return err
	}
	dir := filepath.Dir(path)
	di, err := os.Stat(dir)
	if err != nil {
		return err
	}
	return safeOwner("its directory "+dir, di, euid)
}

// safeOwner: fi is owned by root or euid and not writable by group or
// others.
func safeOwner(what string, fi fs.FileInfo, euid int) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("%s: no owner to check", what)
	}
	if st.Uid != 0 && int(st.Uid) != euid {
		return fmt.Errorf("%s is owned by uid %d, neither root nor moat's euid %d (chown it, or build it as that user)", what, st.Uid, euid)
	}
	if m := fi.Mode().Perm(); m&0o022 != 0 {
		return fmt.Errorf("%s is writable by group or others (mode %04o; chmod go-w it)", what, m)
	}
	return nil
}
