//go:build !linux

package kubernetes

import (
	"fmt"
	"os"

	"github.com/moat-sandbox/moat/boundary"
)

// StageMain, SignalMain and PauseMain run inside a Linux Pod only.
func StageMain(args []string) int  { return inPodOnly() }
func SignalMain(args []string) int { return inPodOnly() }
func PauseMain(args []string) int  { return inPodOnly() }

func inPodOnly() int {
	fmt.Fprintln(os.Stderr, "moat: the kubernetes helpers run inside a Linux Pod only")
	return boundary.ExitRefused
}
