//go:build !linux

package reaper

import "time"

// sweepWait is unused outside Linux.
const sweepWait = 0

// startSweep does nothing outside Linux (there are no cgroups).
func startSweep() func(time.Duration) { return func(time.Duration) {} }
