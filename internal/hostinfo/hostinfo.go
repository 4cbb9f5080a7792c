// Package hostinfo measures what this host offers moat: the Landlock ABI,
// unprivileged user namespaces, seccomp, cgroup delegation, runsc, openssl,
// the kernel and the architecture. Each check tries the real thing (a
// syscall, a child process, a mkdir) instead of reading configuration, and
// says what to change when it fails. `moat doctor` is built on it.
//
// Linux checks live in hostinfo_linux.go; elsewhere they return an
// *UnsupportedError.
package hostinfo

import (
	"bytes"
	"context"
	"debug/buildinfo"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Error says that a feature is missing or unusable here, why, and what to
// change.
type Error struct {
	Feature string // e.g. "landlock", "user namespaces"
	Reason  string // what was observed
	Hint    string // what to change; "" when there is nothing to suggest
	Err     error  // the underlying error, if any
}

func (e *Error) Error() string {
	s := fmt.Sprintf("%s: %s", e.Feature, e.Reason)
	if e.Hint != "" {
		s += " (" + e.Hint + ")"
	}
	return s
}

func (e *Error) Unwrap() error { return e.Err }

// UnsupportedError is returned on systems where a check has no meaning
// (everything but Linux for the kernel checks).
type UnsupportedError struct{ Feature, GOOS string }

func (e *UnsupportedError) Error() string {
	return fmt.Sprintf("%s is not supported on %s; moat's sandbox needs Linux", e.Feature, e.GOOS)
}

// ErrUnsupported matches every *UnsupportedError with errors.Is. It is
// errors.ErrUnsupported itself, moat's one "unsupported" sentinel.
var ErrUnsupported = errors.ErrUnsupported

// Is makes errors.Is(err, errors.ErrUnsupported) true.
func (e *UnsupportedError) Is(target error) bool { return target == errors.ErrUnsupported }

// ToolTimeout bounds how long a tool's version query may take.
const ToolTimeout = 10 * time.Second

// toolDirs are searched after $PATH, so that tools are found even under a
// minimal environment (e.g. `env -i`).
var toolDirs = []string{"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"}

// findTool returns the path of an executable named name.
func findTool(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return filepath.Abs(p)
	}
	for _, d := range toolDirs {
		p := filepath.Join(d, name)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found in $PATH or %s", name, strings.Join(toolDirs, ", "))
}

// toolOutput runs path with args and returns its first line of output.
func toolOutput(path string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), ToolTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "LC_ALL=C"}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s %s: %w: %s", path, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	line, _, _ := strings.Cut(strings.TrimSpace(out.String()), "\n")
	return strings.TrimSpace(line), nil
}

// RunscMinimum is the oldest runsc that moat is known to work with: the
// gvisor.dev/gvisor pseudo-version that .ci/run builds (its date is what
// counts). Debian's runsc 20221219 fails statx (stat, ls -la) with EINVAL.
const (
	RunscMinimum     = "v0.0.0-20260905035102-160fafc42237"
	RunscMinimumDate = "20260905"
	// RunscBuild is how to get it (static: runsc re-executes itself in an
	// empty chroot, where a dynamically linked binary finds no loader).
	RunscBuild = "CGO_ENABLED=0 GOBIN=DIR go install gvisor.dev/gvisor/runsc@" + RunscMinimum + ", then put DIR first in PATH"
)

// Runsc finds gVisor's runsc and returns its path and version: what
// `runsc --version` says (e.g. "0.0~20221219.0", "release-20240101.0"),
// or, for a runsc built with go install (which says VERSION_MISSING), the
// gvisor.dev/gvisor module version recorded in the binary. A runsc whose
// version dates from before RunscMinimumDate is an error that names the
// minimum; one with no date in its version is accepted (the measurement
// of the gvisor backend still shows whether it works).
func Runsc() (path, version string, err error) {
	path, err = findTool("runsc")
	if err != nil {
		return "", "", &Error{Feature: "runsc", Reason: err.Error(), Hint: "build gVisor's runsc for --backend gvisor: " + RunscBuild, Err: err}
	}
	line, err := toolOutput(path, "--version")
	if err != nil {
		return path, "", &Error{Feature: "runsc", Reason: "does not run: " + err.Error(), Err: err}
	}
	v, ok := strings.CutPrefix(line, "runsc version ")
	if !ok || v == "" {
		return path, "", &Error{Feature: "runsc", Reason: fmt.Sprintf("unexpected version output %q", line)}
	}
	if v == "VERSION_MISSING" {
		if bi, err := buildinfo.ReadFile(path); err == nil && bi.Main.Path == "gvisor.dev/gvisor" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			v = bi.Main.Version
		}
	}
	if d := RunscDate(v); d != "" && d < RunscMinimumDate {
		return path, v, &Error{Feature: "runsc", Reason: fmt.Sprintf("%s is version %s (%s), older than the minimum %s (%s), the oldest moat is tested with (Debian's 20221219 fails stat and ls -la inside with EINVAL)", path, v, d, RunscMinimum, RunscMinimumDate),
			Hint: RunscBuild}
	}
	return path, v, nil
}

// RunscDate returns the YYYYMMDD date in a runsc version string
// ("0.0~20221219.0", "release-20240101.0", a Go pseudo-version
// "v0.0.0-20260905035102-160fafc42237"), or "" when it has none.
func RunscDate(version string) string {
	for i := 0; i+8 <= len(version); i++ {
		if i > 0 && version[i-1] >= '0' && version[i-1] <= '9' {
			continue
		}
		d := version[i : i+8]
		if strings.Trim(d, "0123456789") != "" {
			continue
		}
		if d[:2] != "20" || d[4:6] < "01" || d[4:6] > "12" || d[6:8] < "01" || d[6:8] > "31" {
			continue
		}
		return d
	}
	return ""
}

// OpenSSL finds openssl and returns its path and version (e.g. "3.0.17").
// Verifying journals with openssl needs 3.0 or newer (pkeyutl -rawin for
// Ed25519).
func OpenSSL() (path, version string, err error) {
	path, err = findTool("openssl")
	if err != nil {
		return "", "", &Error{Feature: "openssl", Reason: err.Error(), Hint: "install openssl 3 (apt-get install openssl) to check journals with it", Err: err}
	}
	line, err := toolOutput(path, "version")
	if err != nil {
		return path, "", &Error{Feature: "openssl", Reason: "does not run: " + err.Error(), Err: err}
	}
	f := strings.Fields(line)
	if len(f) < 2 || (f[0] != "OpenSSL" && f[0] != "LibreSSL") {
		return path, "", &Error{Feature: "openssl", Reason: fmt.Sprintf("unexpected version output %q", line)}
	}
	return path, f[1], nil
}
