// Command moat-kubernetes is moat with the kubernetes backend: every moat
// command, plus the backend, its in-Pod helpers and host watchdog, and
// the evidence and conformance suites' client of a cluster. It is a
// second binary so that moat itself links no Kubernetes client (each of
// the several moat processes of a run starts in half the time); moat
// hands every kubernetes command to the moat-kubernetes beside it. The
// sandbox image holds this binary at /usr/local/bin/moat.
package main

import (
	"os"

	"github.com/moat-sandbox/moat/internal/cli"
	"github.com/moat-sandbox/moat/internal/cli/k8sext"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], k8sext.Extension()))
}
