//go:build !linux

package measure

import (
	"fmt"
	"os"
)

// Main is the in-sandbox side of the measurement; it needs Linux.
func Main(args []string) int {
	fmt.Fprintf(os.Stderr, "moat: %s: the measurement helper needs Linux\n", Helper)
	return 125
}
