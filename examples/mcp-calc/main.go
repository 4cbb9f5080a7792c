// Command mcp-calc is a small MCP server on stdio, built on the official
// Go SDK, that ships with moat as an example tool server (and is the one
// its tests use; moat demo and moat evidence run start the same server as
// moat's hidden helper __moat-demo-calc). Its tools and flags are package
// internal/mcpcalc's:
//
//	add   {"a": number, "b": number}  the sum
//	mul   {"a": number, "b": number}  the product
//	env   {"name": string}            whether the variable is set in the
//	                                  server's environment
//
// With --log FILE it appends one JSON line per call it receives.
//
// A policy entry for it:
//
//	tools:
//	  mcp:
//	    - name: calc
//	      command: [/opt/moat/mcp-calc]
//	      tools: [add, mul]
//	      filesystem: {read_only: [/opt/moat]}
package main

import (
	"os"

	"github.com/moat-sandbox/moat/internal/mcpcalc"
)

func main() { os.Exit(mcpcalc.Main(os.Args[1:], nil)) }
