// Command moat runs an untrusted AI agent in a sandbox with one controlled
// way out (the inference broker) and a signed journal of what went through.
package main

import (
	"os"

	"github.com/moat-sandbox/moat/internal/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:]))
}
