//go:build !linux

package reaper

import (
	"errors"
	"time"
)

func unlinkFile(string) error { return errors.New("reaper: only on Linux") }

func pidfdOpen(int) (int, error) { return -1, errors.New("reaper: only on Linux") }

func waitExited([]int, time.Duration) {}
