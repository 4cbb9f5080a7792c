//go:build !linux

package reaper

import "errors"

func unlinkFile(string) error { return errors.New("reaper: only on Linux") }
