//go:build moat_lying_backend

package cli

// Test builds only (go build -tags moat_lying_backend): a backend that
// claims every property and enforces none for the workload, so that tests
// can show the conformance suite catching it.
import _ "github.com/moat-sandbox/moat/boundary/lying"
