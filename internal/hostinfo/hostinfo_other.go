//go:build !linux

package hostinfo

import "runtime"

func unsupported(feature string) error {
	return &UnsupportedError{Feature: feature, GOOS: runtime.GOOS}
}

// LandlockABI is Linux-only.
func LandlockABI() (int, error) { return 0, unsupported("landlock") }

// UserNamespaces is Linux-only.
func UserNamespaces() error { return unsupported("user namespaces") }

// Seccomp is Linux-only.
func Seccomp() error { return unsupported("seccomp") }

// Cgroups is Linux-only; it reports version 0 with the reason.
func Cgroups() CgroupInfo {
	return CgroupInfo{Reason: unsupported("cgroups").Error()}
}

// Kernel returns "" outside Linux.
func Kernel() string { return "" }

// Arch returns GOARCH outside Linux.
func Arch() string { return runtime.GOARCH }
