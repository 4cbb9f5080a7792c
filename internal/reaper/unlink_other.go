//go:build !linux

package reaper

import "errors"

func unlinkSocket(string) error { return errors.New("reaper: only on Linux") }
