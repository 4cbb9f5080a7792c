// Command moat-probe is the evidence suite's fixed hostile program. It runs
// inside a moat sandbox, does what its case argument says, and always
// claims success: `moat evidence run` never believes it. Build it static:
//
//	CGO_ENABLED=0 go build ./cmd/moat-probe
package main

import (
	"os"

	"github.com/moat-sandbox/moat/evidence/probe"
)

func main() { os.Exit(probe.Main(os.Args[1:], os.Stdout)) }
