//go:build moat_lying_backend

package cli

import (
	"github.com/moat-sandbox/moat/boundary"
	"github.com/moat-sandbox/moat/boundary/lying"
)

// Test builds only (go build -tags moat_lying_backend): a backend that
// claims every property and enforces none for the workload, so that tests
// can show the conformance suite catching it.
func testBackends() []boundary.Backend { return []boundary.Backend{lying.New()} }
