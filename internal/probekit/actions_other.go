//go:build !linux

package probekit

import "errors"

// errLinuxOnly: the actions that are Linux system calls fail elsewhere
// (a sandbox is Linux-only; the probe still builds, as moat does).
var errLinuxOnly = errors.New("this action needs Linux")

func addOSActions(map[string]Action) {}

// DatagramWays is one way elsewhere; SendDatagram says it needs Linux.
var DatagramWays = []string{"socketpair-sendto"}

// SendDatagram needs Linux.
func SendDatagram(how, addr string, msg []byte) error { return errLinuxOnly }

// SetID needs Linux.
func SetID(path string) (string, error) { return "", errLinuxOnly }

// ChmodNew needs Linux.
func ChmodNew(path string, mode uint32) (string, error) { return "", errLinuxOnly }
